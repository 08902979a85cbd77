"""astra.cxx.decls: a CUDA file cut into its namespace-scope declarations (the kernel is ours)."""

from __future__ import annotations

from astra.cxx.decls import CLOSE, DECLARATION, DIRECTIVE, NAMESPACE, chunks, layout, references
from astra.cxx.text import blank

SOURCE = """#pragma once
#include <cstdint>  // for int64_t {

namespace demo {
namespace detail {

constexpr int kThreads = 256;  // a comment with a brace {
constexpr float kTable[2] = {0.5f, 2.0f};
using Vec = float4;

template <typename T>
__device__ float widen(T x) { return static_cast<float>(x); }

template <>
__device__ float widen<double>(double x) {
  const char* s = "}";  // a brace in a string
  return static_cast<float>(x);
}

}  // namespace detail

enum class Mode : int { kA = 0, kB = 1 };

struct Pair { int a; int b; };
constexpr Pair operator|(Pair x, Pair y) { return Pair{x.a | y.a, x.b | y.b}; }

template <typename T, int kUnroll = 4, bool kFast = false>
__global__ __launch_bounds__(detail::kThreads) void scale_kernel(T* x, int64_t n) {
#if defined(FAST)
  if (kFast) {
#else
  if (!kFast) {
#endif
    x[threadIdx.x] *= detail::widen(x[0]);
  }
}

template <typename T>
struct Scale {
  static void run(T* x, int64_t n) { scale_kernel<T><<<1, detail::kThreads>>>(x, n); }
};

}  // namespace demo
"""


def _named(text: str) -> list[tuple[str, str]]:
    return [(c.name, text[c.start:c.end].splitlines()[0]) for c in chunks(text)]


def test_every_namespace_scope_declaration_is_one_chunk_with_its_name():
    assert [name for name, _ in _named(SOURCE)] == [
        "kThreads", "kTable", "Vec", "widen", "widen", "Mode", "Pair", "operator|", "scale_kernel", "Scale"]


def test_a_chunk_spans_its_template_head_and_whole_body():
    spans = {c.name: SOURCE[c.start:c.end] for c in chunks(SOURCE)}
    kernel = spans["scale_kernel"]
    assert kernel.startswith("template <typename T, int kUnroll = 4, bool kFast = false>")  # `=` in a default
    assert kernel.endswith("x[threadIdx.x] *= detail::widen(x[0]);\n  }\n}")  # braces in #if branches
    assert spans["kTable"] == "constexpr float kTable[2] = {0.5f, 2.0f};"  # an initializer ends at its `;`
    assert spans["Scale"].endswith("};") and spans["Pair"] == "struct Pair { int a; int b; };"
    specialization = [SOURCE[c.start:c.end] for c in chunks(SOURCE) if c.name == "widen"][1]
    assert specialization.startswith("template <>\n__device__ float widen<double>") and specialization.endswith("}")


def test_comments_and_strings_are_blanked_in_place_and_references_are_whole_words():
    code = blank(SOURCE)
    assert len(code) == len(SOURCE) and code.count("\n") == SOURCE.count("\n")
    assert "a comment" not in code and '"}"' not in code
    scale = next(SOURCE[c.start:c.end] for c in chunks(SOURCE) if c.name == "Scale")
    assert references(scale, {"scale_kernel", "kThreads", "scale", "Vec"}) == {"scale_kernel", "kThreads"}
    assert references("// kThreads\nint x;", {"kThreads"}) == set()


BRANCHES = """#pragma once
#ifdef USE_ROCM
struct Vec { float x; };
#else
struct Vec { float x, y; };
#endif

extern "C" {
int exported(int x) { return x; }
}

namespace demo {
template <typename T>
void Holder<T>::run(T x) { (void)x; }
// a helper the macro declares
DEFINE_HELPER(kOnce)
}  // namespace demo
"""


def test_both_branches_of_a_conditional_are_declarations_and_extern_c_is_entered():
    """Before astra.cxx, `#else` branches were blanked (a CUDA-only declaration after `#ifdef USE_ROCM`
    was invisible to band dispatch), `extern "C" {...}` was one declaration named `extern`, and a macro
    call without `;` swallowed its namespace's closing brace."""
    assert _named(BRANCHES) == [("Vec", "struct Vec { float x; };"), ("Vec", "struct Vec { float x, y; };"),
                                ("exported", "int exported(int x) { return x; }"),
                                ("run", "template <typename T>"), ("DEFINE_HELPER", "DEFINE_HELPER(kOnce)")]


def test_layout_holds_directives_namespaces_and_the_comments_above_each_declaration():
    pieces = layout(BRANCHES)
    assert [p.kind for p in pieces] == [
        DIRECTIVE, DIRECTIVE, DECLARATION, DIRECTIVE, DECLARATION, DIRECTIVE, NAMESPACE, DECLARATION, CLOSE,
        NAMESPACE, DECLARATION, DECLARATION, CLOSE]
    helper = pieces[11]
    assert BRANCHES[helper.lead:helper.end] == "// a helper the macro declares\nDEFINE_HELPER(kOnce)"
    assert pieces[10].names == {"run", "Holder"}  # an out-of-class member defines its class's name too
    assert BRANCHES[pieces[6].start:pieces[6].end] == 'extern "C" {'
    assert layout(BRANCHES + "}\n") is None and layout("namespace a {\nint x;\n") is None
    assert [p.name for p in layout("#define VEC 4\n#include <x>\n")] == ["VEC", ""]


def test_a_directive_inside_a_declaration_does_not_name_it():
    """Before astra.cxx the name was read with the `#if` line inside the declaration: `defined`."""
    source = """template <class T>
__global__ void
#if defined(__CUDA_ARCH__) && (__CUDA_ARCH__ >= 1000)
__launch_bounds__(512, 4) cvt_fp16_to_fp4(
#else
cvt_fp16_to_fp4(
#endif
    int32_t n, T const* in) {
}
static_assert(kVec % 2 == 0, "even");
constexpr int kVec = 4;
"""
    pieces = chunks(source)
    assert [c.name for c in pieces] == ["cvt_fp16_to_fp4", "static_assert", "kVec"]
    assert pieces[1].names == {"kVec"}  # an assert is found under the file's names it checks
