"""What changed for the readers of C++ text when their own copies of bracket matching, top-level
splitting, comment blanking, entry parsing and declaration chunking became astra.cxx: each test here
failed with the copy it replaced (the callers otherwise read as they did)."""

from __future__ import annotations

from types import SimpleNamespace

from astra.optimize import cpp_args, entry_templates
from astra.optimize.param_space import find_params
from astra.sglang.constexpr_eval import comparison
from astra.sglang.cxx_tokens import tokenize
from astra.sglang.host_checks import checks_in
from astra.sglang.source_facts import SourceFacts
from astra.sglang.template_params import block_name, call_condition
from astra.sglang.tensor_matchers import find_tensor_matchers
from astra.spec.infer import split_args
from astra.spec.llm_draft import kernel_excerpt
from astra.spec.template_args import arg_lists


def test_call_arguments_split_past_a_comparison_inside_parentheses():
    """astra.sglang.cxx_facts (call arguments followed into helpers, read by astra.spec.infer) counted
    the `<` of `g(a<b)` as a bracket left open, so the comma after it did not split."""
    assert split_args("g(a<b), c") == ["g(a<b)", "c"]


def test_launch_arguments_keep_a_template_argument_list_whole():
    """astra.optimize.cpp_args split `Cfg<2, 4>::kGrid` at its comma, so the second argument of a
    launch (its block size) was ` 4>::kGrid`."""
    text = "LaunchKernel(Cfg<2, 4>::kGrid, 128, stream)"
    assert [text[a:b] for a, b in cpp_args.arguments(text, len("LaunchKernel("))] == ["Cfg<2, 4>::kGrid", " 128",
                                                                                     " stream"]


def test_a_host_check_on_a_type_trait_keeps_its_template_arguments():
    """astra.sglang.cxx_tokens split a check's arguments without angle brackets: the condition of
    `RuntimeCheck(std::is_same_v<A, B>, ...)` was `std :: is_same_v < A`."""
    tokens = tokenize('RuntimeCheck(std::is_same_v<A, B>, "need A"); RuntimeCheck(n < 4, "small");')
    found = checks_in(tokens, [1] * len(tokens), "f")
    assert [(c.cond, c.message) for c in found] == [("std :: is_same_v < A , B >", "need A"), ("n < 4", "small")]


def test_a_tight_comparison_is_a_static_asserts_condition_not_an_open_template():
    """astra.sglang.template_params.call_condition and constexpr_eval.comparison opened a template
    list at any `<` right after a name: `kN<4` swallowed the message, and `a<b` was no comparison."""
    text = 'static_assert(kN<4, "msg")'
    assert call_condition(text, text.index("(")) == "kN<4"
    assert comparison("a<b") == ("a", "<", "b")
    assert comparison("std::is_same_v<A, B> == true") == ("std::is_same_v<A, B>", "==", "true")


def test_entry_lists_with_a_comparison_in_parentheses():
    """astra.spec.template_args and astra.optimize.entry_templates counted every `>` of an entry, so
    `K<(a > b), 4>` ended its list at the comparison."""
    assert [(a.owner, a.args) for a in arg_lists("ns::K<(a > b), 4>::run<{dim}>")] == [
        ("K", ["(a > b)", "4"]), ("run", ["{dim}"])]
    source = "template <bool kBig, int BLOCK_DIM>\nvoid launch(int n) {\n  kernel<<<n, BLOCK_DIM>>>();\n}\n"
    slots = entry_templates.find(source, ["launch<(4 > 2), 256>"], lambda name: True)
    assert [(s.name, s.value, s.owner) for s in slots] == [("BLOCK_DIM", 256, "function launch")]


def test_a_number_in_a_string_literal_is_not_a_parameter():
    """astra.optimize.param_space skipped literals in comments only; one in a string was tuned."""
    source = 'constexpr int kThreads = 256;\nvoid f() { printf("constexpr int kBlockSize = 128;"); }\n'
    assert [(p.name, p.value) for p in find_params(source)] == [("kThreads", 256)]


def test_a_brace_in_a_character_literal_opens_no_scope():
    """astra.sglang.template_params.Scopes blanked string literals only: `'{'` opened a scope, so B
    read as nested in A and the facts of entry B were every kernel's."""
    source = """template <int kN>
struct A {
  static constexpr char kOpen = '{';
  static_assert(kN % 4 == 0, "kN");
};
template <int kM>
struct B {
  static_assert(kM < 64, "kM");
};
"""
    facts = SourceFacts.read({"a.cuh": source}, {"a.cuh"})
    assert sorted(facts.bodies) == ["A", "B"] and facts.for_entry(["B"]).asserts == ["kM < 64"]


def test_tensor_matcher_dims_split_after_a_double_angle():
    """astra.sglang.tensor_matchers did not close two angle brackets at `>>`: `{Foo<Bar<int>>::k, D}`
    was one dim."""
    text = "TensorMatcher({Foo<Bar<int>>::k, D}).verify(x);"
    tokens, pos = [], 0
    for spelling in tokenize(text):
        at = text.index(spelling, pos)
        pos = at + len(spelling)
        tokens.append(SimpleNamespace(spelling=spelling, extent=SimpleNamespace(
            start=SimpleNamespace(offset=at), end=SimpleNamespace(offset=pos)), location=SimpleNamespace(line=1)))
    assert [c.dims for c in find_tensor_matchers(tokens, "f")] == [["Foo<Bar<int>>::k", "D"]]


def test_the_kernel_excerpt_reads_a_file_whose_conditional_branches_each_open_a_brace():
    """astra.optimize.testing_agent had its own declaration scanner, which counted both `{` of
    `#if`/`#else` branches, found the braces unbalanced and showed the whole file."""
    source = """#include <cstdint>
constexpr int kUnused = 3;
template <int N>
struct Entry {
  static void run(int x) {
#if defined(FAST)
    if (x > N) {
#else
    if (x >= N) {
#endif
      x = 0;
    }
  }
};
"""
    excerpt = kernel_excerpt(source, "Entry<4>::run")
    assert "kUnused" not in excerpt and "struct Entry {" in excerpt and "#include <cstdint>" in excerpt


def test_a_kernel_named_in_a_message_is_not_reached_and_conditions_keep_their_literals():
    """astra.sglang.static_asserts (now source_facts) removed comments with a regex that cut a string
    holding `//` (`SymbolicSize{"G // 4"}` lost its `}`), and read the words of messages as names the
    entry's body uses, so the asserts of the kernel a message names applied to this one."""
    source = """template <int kDim>
struct WarpKernel {
  static_assert(kDim <= 256, "use CtaKernel for larger sizes");
  static void run(const char* type) {
    auto G = SymbolicSize{"G // 4"};
    RuntimeCheck(type == "silu", "only silu");
  }
};
template <int kDim>
struct CtaKernel {
  static_assert(kDim > 256, "use WarpKernel for smaller sizes");
};
"""
    facts = SourceFacts.read({"k.cuh": source}, {"k.cuh"}).for_entry(["WarpKernel"])
    assert facts.asserts == ["kDim <= 256"] and facts.hints == ['type == "silu"']


def test_an_entry_written_as_an_address_is_read():
    """astra.optimize.entry_templates read no entry with a leading `&`, the form SGLang's loaders write
    (`&HiCacheKernel<{element_size}, {unroll}, {block_quota}, 1024>::run_all`)."""
    source = "template <int kUnroll, int kBlockSize>\nstruct Copy {\n  static void run_all() {}\n};\n"
    slots = entry_templates.find(source, ["&Copy<{unroll}, 1024>::run_all"], lambda name: name == "kBlockSize")
    assert [(s.name, s.value, s.owner) for s in slots] == [("kBlockSize", 1024, "struct Copy")]


def test_a_preprocessor_if_guards_no_host_check():
    """astra.sglang.host_checks read `#if defined(X)` in a function's tokens as a C++ `if`, matching
    brackets from `defined`: the check after it ran under the guard `( ( X )`. Bracket matching now
    starts at a bracket only, and `#if`/`#else` are not statements."""
    tokens = tokenize('#if defined(USE_FAST)\n  RuntimeCheck(n > 0, "positive");\n#else\n'
                      '  RuntimeCheck(n > 1, "big");\n#endif\n')
    assert [(c.cond, c.guard) for c in checks_in(tokens, [1] * len(tokens), "f")] == [("n > 0", None),
                                                                                    ("n > 1", None)]


def test_an_explicit_specialization_names_its_function_not_a_call_in_its_arguments():
    """astra.sglang.template_params.block_name took the last name before a `(` outside parentheses,
    which for `dequant<half2, host::kU4.id(), true>(...)` was `id`: template arguments are now skipped."""
    assert block_name("template <> __device__ inline void dequant<half2, host::kU4.id(), true>(int q, half2* b)") \
        == "dequant"
    assert block_name("void Holder<T>::run(int x) const") == "run"
