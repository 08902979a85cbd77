"""Template values the build decides (astra.spec.template_search and its helpers).

The first part settles drafts of real SGLang 0.5.23 modules with nvcc `--cubin` on the CPU (skipped
without nvcc; compile results are cached under $ASTRA_HOME/template-checks, see tests/conftest.py).
The second part checks, without a compiler, the C++ text reading that orders what nvcc is asked:
template parameter lists, constant expressions, the facts of a small source and the value search.
"""

from __future__ import annotations

import itertools
import re

import pytest

from astra.cxx.brackets import split_top
from astra.sglang import assert_solver, registry
from astra.sglang.constexpr_eval import evaluate
from astra.sglang.source_facts import SourceFacts
from astra.sglang.template_params import TemplateParam, call_condition, template_params
from astra.spec import template_search
from astra.spec.draft import draft_module
from astra.spec.template_args import ArgList, EntrySources, arg_lists, rebuild
from astra.spec.template_check import arch_limit, failed_assert, failed_condition, loader_refusal

needs_nvcc = pytest.mark.skipif(not template_search.nvcc_available(), reason="needs nvcc (CUDA toolkit)")


def _settled(tree, name: str):
    module = registry.find(tree, name)
    spec, _ = draft_module(tree, module)
    drafted = {"entry": spec["build"]["wrappers"][0]["entry"], "dtypes": list(spec["dtypes"]),
               "dims": list(spec["dims"])}
    return module, spec, drafted, template_search.settle(tree, module, spec)


# ---------------------------------------------------------------- real modules, compiled with nvcc


@pytest.mark.network
@needs_nvcc
def test_channel_rmsnorm_values_are_searched_until_the_static_asserts_hold(sglang_0523):
    tree = sglang_0523
    module, spec, drafted, settled = _settled(tree, "channel_rmsnorm_silu_nhwc")
    assert settled.builds is True and settled.changed
    note = next(n for n in settled.notes if "template arguments chosen" in n)
    chosen = {k: int(v) for k, v in re.findall(r"\b(kVec|kLanesPerRow|kUnitsPerLane)=(\d+)", note)}
    assert set(chosen) == {"kVec", "kLanesPerRow", "kUnitsPerLane"}, note
    assert "static assertion failed" in note  # the drafted values' reason is kept for the reviewer
    assert chosen["kVec"] in (2, 4, 8)
    assert chosen["kUnitsPerLane"] >= 1 and chosen["kUnitsPerLane"] * chosen["kVec"] <= 64
    # every static_assert of the kernel that names these parameters accepts the chosen values
    facts = EntrySources.read(tree, module, spec).facts
    relevant = facts.mentioning(set(chosen), facts.asserts)
    assert any("kVec == 2" in c for c in relevant)
    env = {**chosen, "kHasBias": False}
    assert all(evaluate(c, env, facts) is not False for c in relevant), relevant
    assert evaluate("kVec == 2 || kVec == 4 || kVec == 8", env, facts) is True
    # the holes became derived constants with those values, and every variant of the result compiles
    entry = spec["build"]["wrappers"][0]["entry"]
    holes = re.findall(r"\{(\w+)\}", entry.split("<", 1)[1])[:3]
    assert [spec["derived"][h] for h in holes] == [str(chosen[k]) for k in ("kVec", "kLanesPerRow", "kUnitsPerLane")]
    assert not set(holes) & set(spec["dims"])
    results = template_search.check_variants(spec, tree)
    assert results and all(r.ok for r in results.values()), {k: r.error for k, r in results.items()}


@pytest.mark.network
@needs_nvcc
def test_a_dtype_the_kernel_static_asserts_away_is_dropped(sglang_0523):
    _, spec, drafted, settled = _settled(sglang_0523, "diffusion_interleaved_rope_fp64")
    assert "float16" in drafted["dtypes"] and "bfloat16" in drafted["dtypes"]
    assert spec["dtypes"] == [dt for dt in drafted["dtypes"] if dt != "float16"]
    assert settled.builds is True and settled.changed
    note = next(n for n in settled.notes if n.startswith("dtype float16 dropped"))
    assert "static_assert(std::is_same_v<T, bf16_t>)" in note
    assert spec["build"]["wrappers"][0]["entry"] == drafted["entry"]  # nothing else was touched


@pytest.mark.network
@needs_nvcc
def test_an_enum_template_parameter_gets_an_enumerator(sglang_0523):
    tree = sglang_0523
    _, spec, drafted, settled = _settled(tree, "c1_decode")
    entry = spec["build"]["wrappers"][0]["entry"]
    assert "{cpp_name}" in drafted["entry"] and "{cpp_name}" not in entry
    assert re.search(r"\bdeepseek_v4::KVLayout::\w+\b", entry), entry
    assert "cpp_name" in drafted["dims"] and "cpp_name" not in spec["dims"]
    assert settled.builds is True
    assert any("kLayout=" in n for n in settled.notes), settled.notes
    results = template_search.check_variants(spec, tree)
    assert results and all(r.ok for r in results.values()), {k: r.error for k, r in results.items()}


@pytest.mark.network
@needs_nvcc
def test_a_kernel_the_target_cannot_build_is_said_so_not_searched(sglang_0523):
    # launch<8> of 32-byte vectors: a static_assert on kMaxVecBytes, which the architecture sets
    _, spec, drafted, settled = _settled(sglang_0523, "candidate_block_table")
    assert settled.builds is False and not settled.changed
    assert spec["build"]["wrappers"][0]["entry"] == drafted["entry"]
    note = next(n for n in settled.notes if n.startswith("does not build for sm_90a: "))
    assert "SGL_ARCH_BLACKWELL_OR_GREATER" in note
    # tcgen05 (TMEM) PTX: once the static_asserts hold, ptxas refuses the target
    _, spec, _, settled = _settled(sglang_0523, "fused_rope_wo_a_g{groups}_m{max_tokens}")
    assert settled.builds is False
    assert any(n.startswith("does not build for sm_90a: ptxas: ") and "tcgen05" in n for n in settled.notes)


@pytest.mark.network
@needs_nvcc
def test_a_dim_in_a_template_slot_takes_the_value_its_static_assert_allows(sglang_0523):
    tree = sglang_0523
    module, spec, drafted, settled = _settled(tree, "rmsnorm_hf")  # kDim % 32 == 0 in [32, 512)
    assert settled.builds is True and settled.changed
    value = int(spec["derived"]["hidden_size"])
    assert "hidden_size" in drafted["dims"] and "hidden_size" not in spec["dims"]
    facts = EntrySources.read(tree, module, spec).facts
    relevant = facts.mentioning({"kDim"}, facts.asserts)
    assert relevant and all(evaluate(c, {"kDim": value, "DType": "bf16_t"}, facts) is True for c in relevant)
    assert not any("kDim >= 512" in c for c in relevant)  # HFRMSNormKernel's assert is another kernel's
    results = template_search.check_variants(spec, tree)
    assert results and all(r.ok for r in results.values()), {k: r.error for k, r in results.items()}

    _, spec, _, settled = _settled(tree, "main_q_norm_rope")  # kRopeDim == kWarpThreads * 2
    assert settled.builds is True and spec["derived"]["rope_dim"] == "64"
    results = template_search.check_variants(spec, tree)
    assert results and all(r.ok for r in results.values()), {k: r.error for k, r in results.items()}


@pytest.mark.network
@needs_nvcc
def test_an_equality_computes_the_parameter_it_names(sglang_0523):
    tree = sglang_0523
    _, spec, _, settled = _settled(tree, "lplb_lp_prep")  # NC == NUM_RED_LOG + NUM_GPUS, NC the sweep's dim
    assert settled.builds is True
    note = next(n for n in settled.notes if "template arguments chosen" in n)
    chosen = {k: int(v) for k, v in re.findall(r"\b(NC|NUM_RED_LOG|NUM_GPUS)=(\d+)", note)}
    assert chosen["NC"] == chosen["NUM_RED_LOG"] + chosen["NUM_GPUS"]
    assert spec["shapes"]["token_dim"] == "nc" and spec["shapes"]["tokens"] == [chosen["NC"]]
    results = template_search.check_variants(spec, tree)
    assert results and all(r.ok for r in results.values()), {k: r.error for k, r in results.items()}


# ---------------------------------------------------------------- C++ text, no compiler

_SOURCE = """
namespace sglang {
namespace demo {
enum class Layout : int32_t { A = 0, B = 4, C };
}  // namespace demo
inline constexpr int kWarp = 32;  // a comment with static_assert(false) in it
template <int kVec, int kLanes, bool kPdl, typename T = float, demo::Layout kLayout = demo::Layout::A>
struct Kernel {
  static constexpr int kRows = kWarp / kLanes;
  static_assert(kVec == 2 || kVec == 4 || kVec == 8, "vector of 4, 8 or 16 bytes");
  static_assert(kRows * kLanes == kWarp && kVec * sizeof(T) <= 32, "lanes divide a warp");
  static_assert(std::is_same_v<T, float>, "float only");
  static void run(int n) {
    if constexpr (kLayout == demo::Layout::B) {}
    RuntimeCheck(n % 48 == 0, "n is a multiple of 48");
  }
};
}  // namespace sglang
"""


def _facts() -> SourceFacts:
    return SourceFacts.read({"k.cuh": _SOURCE, "other.cuh": "static_assert(kVec == 3);"}, {"k.cuh"})


def test_template_parameter_lists_are_read_by_hand():
    params = template_params(_SOURCE, "Kernel")
    assert [(p.name, p.kind, p.type) for p in params] == [
        ("kVec", "value", "int"), ("kLanes", "value", "int"), ("kPdl", "value", "bool"), ("T", "type", ""),
        ("kLayout", "value", "demo::Layout")]
    assert params[3] == TemplateParam("T", "type", "", "float")
    assert template_params(_SOURCE, "Missing") is None
    assert template_params("template <typename... Ts, int N> __global__ void go(Ts... x);", "go") == [
        TemplateParam("Ts", "pack", ""), TemplateParam("N", "value", "int")]
    assert split_top("a<b, c>, f(x, y), {1, 2}") == ["a<b, c>", "f(x, y)", "{1, 2}"]
    text = 'static_assert(std::is_same_v<A, B> && x < y, "msg, with comma");'
    assert call_condition(text, text.index("(")) == "std::is_same_v<A, B> && x < y"


def test_source_facts_keep_the_kernels_own_conditions():
    facts = _facts()
    assert facts.constants["kWarp"] == "32" and facts.constants["kRows"] == "kWarp / kLanes"
    assert len(facts.asserts) == 3 and "kVec == 3" not in facts.asserts  # only the checked file counts
    assert "kLayout == demo::Layout::B" in facts.hints and "n % 48 == 0" in facts.hints
    layout = facts.enum_of("demo::Layout")
    assert layout.qualified == "demo::Layout" and layout.values == {"A": 0, "B": 4, "C": 5}
    assert layout.literal("C") == "demo::Layout::C"
    assert facts.depends("kRows > 1") >= {"kRows", "kWarp", "kLanes"}
    assert facts.mentioning({"kLanes"}, facts.asserts) == [facts.asserts[1]]  # through kRows


def test_constant_expressions_in_three_valued_logic():
    facts = _facts()
    assert evaluate("kRows * kLanes == kWarp", {"kLanes": 8}, facts) is True
    assert evaluate("kRows * kLanes == kWarp", {"kLanes": 64}, facts) is False  # 32 / 64 == 0 in C
    assert evaluate("kVec * sizeof(T) <= 32", {"kVec": 8, "T": "float"}, facts) is True
    assert evaluate("kVec * sizeof(T) <= 32", {"kVec": 16, "T": "double"}, facts) is False
    assert evaluate("std::is_same_v<T, float>", {"T": "bf16_t"}, facts) is False
    assert evaluate("kUnknown > 0", {}, facts) is None
    assert evaluate("kUnknown > 0 && kVec == 4", {"kVec": 2}, facts) is False  # decided without kUnknown
    assert evaluate("kUnknown > 0 || kVec == 4", {"kVec": 4}, facts) is True
    assert evaluate("-7 / 2 == -3 && -7 % 2 == -1", {}) is True  # C truncates toward zero
    assert evaluate("1u << 4 == 16ul && !false", {}) is True
    assert evaluate("kLayout == demo::Layout::B", {"kLayout": "B"}, facts) is True
    assert evaluate("kLayout == demo::Layout::B", {"kLayout": "C"}, facts) is False
    assert evaluate("x ? 1 : 2", {"x": 1}) == 1  # C's ternary
    assert evaluate("a[0] > 1", {"a": 1}) is None  # what Python cannot read is unknown, not an error


def test_candidates_and_the_solver_respect_the_static_asserts():
    facts = _facts()
    cands = assert_solver.numeric_candidates("kVec", 16, [], facts)
    assert cands[0] == 16 and {2, 4, 8} <= set(cands)
    assert cands.index(8) < cands.index(2)  # nearest to the drafted value first
    assert {48, 96} <= set(assert_solver.numeric_candidates("n", None, [], facts))  # the host check's
    assert assert_solver.literals(["n % 3 == 0", "k < 1000000"]) == [3, 6, 12, 0]
    fixed = {"T": "float", "kPdl": False}
    candidates = {"kVec": cands, "kLanes": [64, 32, 8]}
    first = assert_solver.solve(candidates, fixed, facts)
    assert first == {"kVec": 8, "kLanes": 32}
    # a compile that failed on kVec=8 rules it out; the next proposal still satisfies every assert
    second = assert_solver.solve(candidates, fixed, facts, [{"kVec": 8}])
    assert second["kVec"] in (2, 4) and second["kLanes"] == 32
    assert assert_solver.solve({"kVec": [16, 32]}, fixed, facts) is None


def test_proposals_come_nearest_first_without_building_the_whole_product():
    for sizes in ([3, 1, 4], [2, 2], [5], [4, 3, 5, 2], [3, 0, 2], []):
        whole = sorted(itertools.product(*[range(n) for n in sizes]), key=lambda ix: (sum(ix), ix))
        assert list(assert_solver.ranked_indices(sizes)) == whole, sizes
    many = list(itertools.islice(assert_solver.ranked_indices([12] * 9), 50))  # 5e9 tuples in all
    assert many[0] == (0,) * 9 and all(sum(ix) <= 1 for ix in many[:10]) and sum(many[-1]) == 2
    facts = _facts()
    wide = {f"kUnused{i}": [0, 1, 2] for i in range(10)}  # 59049 combinations no assert rules out
    assert assert_solver.solve({**wide, "kVec": [16, 8]}, {}, facts) == {**{n: 0 for n in wide}, "kVec": 8}


def test_entry_argument_lists_round_trip():
    entry = "ns::Kernel<{vec}, f(a, b), Inner<1, 2>>::run<true>"
    lists = arg_lists(entry)
    assert [(lst.owner, lst.args) for lst in lists] == [("Kernel", ["{vec}", "f(a, b)", "Inner<1, 2>"]),
                                                      ("run", ["true"])]
    assert rebuild(entry, lists) == entry
    lists[0].args[0] = "8"
    lists[1].args[0] = "false"
    assert rebuild(entry, lists) == "ns::Kernel<8, f(a, b), Inner<1, 2>>::run<false>"
    missing = [ArgList("Kernel", -1, -1, ["4", "32"])]
    assert rebuild("Kernel::run", missing) == "Kernel<4, 32>::run"


def test_a_failed_static_assert_is_read_back_from_its_source(tmp_path):
    header = tmp_path / "k.cuh"
    header.write_text("// line 1\nstruct K {\n  static_assert(\n      kVec == 2 || kVec == 4,  // bytes\n"
                      "      \"vector of 4 or 8 bytes\");\n};\n")
    log = f'{header}(3): error: static assertion failed with "vector of 4 or 8 bytes"\n  static_assert(\n'
    assert failed_assert(log) == "kVec == 2 || kVec == 4"
    assert failed_assert("cuda.cu(8): error: too many arguments for class template") is None


# ---------------------------------------------------------------- the search's rules, on small sources

_KERNELS = """
#ifdef USE_ROCM
inline constexpr int kWarp = 64;
#else
inline constexpr int kWarp = 32;
#endif
namespace sglang {
enum class Layout : int { A = 0, B = 1 };
template <int kTile_, int kRows_>
struct Trait {
  static constexpr int kTile = kTile_;
  static constexpr int kVec = 4;
  static_assert(kTile % (kWarp * kVec) == 0, "whole warps");
};
template <uint32_t M> struct SmallTrait { static constexpr uint32_t K = 512; };
template <uint32_t M> struct BigTrait { static constexpr uint32_t K = 5120; };
template <int kDim, int kRope, int NC, int A, int B, Layout kLayout, template <uint32_t> class Tr>
struct WarpKernel {
  using T = Trait<kDim, 1>;
  using Tr1 = Tr<1>;
  static_assert(kDim >= 32 && kDim < 512 && kDim % 32 == 0, "a warp's row");
  static_assert(kRope == kWarp * 2, "one pair per lane");
  static_assert(NC == A + B);
  static_assert(kLayout != Layout::A);
  static void run() {
    if constexpr (kRope == 64) {
      static_assert(kDim != 96);
    } else {
      static_assert(kDim == 7);
    }
  }
};
template <int kDim>
struct CtaKernel {
  static constexpr int kVec = 8;
  static_assert(kDim >= 512 && kDim % 512 == 0, "a CTA's row");
};
}  // namespace sglang
"""


def _kernel_facts():
    return SourceFacts.read({"k.cuh": _KERNELS}, {"k.cuh"}).for_entry(["WarpKernel", "run"])


def test_facts_are_those_of_the_entrys_kernel_and_what_it_instantiates():
    facts = _kernel_facts()
    assert facts.constants["kWarp"] == "32"  # the ROCm branch is not CUDA's
    assert not any("512 ==" in c or "kDim >= 512" in c for c in facts.asserts)  # CtaKernel's are left out
    assert "kVec" not in facts.constants  # Trait's and CtaKernel's own definitions do not leak
    # Trait's assert: its own constants inlined, its parameter bound to what WarpKernel gives it
    trait = next(c for c in facts.asserts if "% ((kWarp) * (4))" in c or "kWarp * (4)" in c)
    assert evaluate(trait, {"kDim": 128}, facts) is True and evaluate(trait, {"kDim": 96}, facts) is False
    # an `if constexpr` branch's assert holds only on its branch
    assert evaluate(next(c for c in facts.asserts if "kDim == 7" in c), {"kRope": 64, "kDim": 128}, facts) is True
    assert facts.strict().asserts == [c for c in facts.asserts if c in facts.hard]
    assert all("if constexpr" not in c for c in facts.hard) and len(facts.hard) == 4


def test_a_static_assert_is_solved_for_the_parameters_it_names():
    facts = _kernel_facts()
    narrowed = assert_solver.narrow({"kDim": [4096, 2048, 1024, 256], "kRope": [128, 256],
                                      "kLayout": ["A", "B"]}, {}, facts)
    assert narrowed["kRope"] == [64]  # the equality gives the value
    assert narrowed["kDim"][0] == 256 and set(narrowed["kDim"]) <= {32 * i for i in range(1, 16)}  # range, multiple
    assert narrowed["kLayout"] == ["B"]  # enumerators the asserts rule out are not tried
    assert assert_solver.solved_for("kDim", "kDim >= 32 && kDim < 512", {}, facts) == {"==": [], "~": [32, 32, 511, 256]}
    # an equality between parameters computes one of them from the others
    assert assert_solver.dependents(["NC", "A", "B"], facts) == {"NC": "A + B"}
    assert assert_solver.solve({"NC": [5], "A": [3, 2], "B": [4]}, {}, facts) == {"NC": 7, "A": 3, "B": 4}
    # what a failed bound rules out is its whole failing side
    cond = "kOcc >= 1 && kOcc * kBytes <= 1000"
    side = assert_solver.failing_side(cond, {"kOcc": 8}, facts, {"kOcc"})
    assert side == {"kOcc": ">="} and assert_solver.rules_out(16, (">=", 8)) and not assert_solver.rules_out(4, (">=", 8))
    assert assert_solver.solve({"kOcc": [8, 16, 4, 1]}, {}, facts, [{"kOcc": (">=", 8)}]) == {"kOcc": 4}


def test_template_template_parameters_and_ternaries():
    facts = _kernel_facts()
    tr = facts.params_of("WarpKernel")[-1]
    assert tr.kind == "template" and tr.type == "uint32_t"
    assert facts.templates_for(tr, {"WarpKernel"}) == ["SmallTrait", "BigTrait"]  # Trait takes two ints
    assert facts.member("BigTrait", "K") == 5120 and facts.aliases["Tr1"] == "Tr<1>"
    assert evaluate("kUnroll == 1 ? (K % 8 == 0) : (K % (256 * kUnroll) == 0)", {"kUnroll": 2, "K": 512}) is True
    assert evaluate("kUnroll == 1 ? (K % 8 == 0) : (K % (256 * kUnroll) == 0)", {"kUnroll": 4, "K": 512}) is False
    assert evaluate("a ? 1 : b ? 2 : 3", {"a": 0, "b": 0}) == 3 and evaluate("a ? b : c", {"a": 1}) is None


def test_missing_and_guessed_template_arguments_become_slots():
    from astra.sglang.discovery import CallSite, Wrapper
    from astra.spec.template_args import lists_with_params, slots

    site = CallSite("k.py", 1, "load", [], {}, "m", [], {"args": ["nc", "a", "b", "kernel_layout", "is_arch_support_pdl()"]},
                    wrappers=[Wrapper("run", "WarpKernel<{args}>::run", "cuda")])
    spec = {"dims": {"tokens": "", "hidden": "", "steps": ""}, "derived": {"num_steps": "steps"},
            "shapes": {"token_dim": "tokens"}, "arguments": [], "build": {"wrappers": [{"export": "run",
            "entry": "WarpKernel::run"}]}}
    src = EntrySources(spec, site, _kernel_facts())
    lists, repairs = lists_with_params(src, "WarpKernel::run")  # the argument list is missing
    assert lists[0].owner == "WarpKernel" and lists[0].repaired and "was missing" in repairs[0]
    lists[0].args = ["{hidden}", "{num_steps}", "{tokens}", "2", "3", "0", "7"]
    found, fixed = slots(src, lists, {"hidden": 4096, "num_steps": 4, "tokens": 1, "steps": 4})
    kinds = {s.param.name: (s.kind, s.dim) for s in found}
    assert kinds["kDim"] == ("dim", "hidden") and kinds["kRope"] == ("dim", "steps")  # a derived alias's dim
    assert kinds["NC"] == ("token", "tokens") and kinds["kLayout"][0] == "enum" and kinds["Tr"][0] == "template"
    assert kinds["A"] == ("number", None) and fixed == {}


def test_what_a_failed_compile_says(tmp_path):
    header = tmp_path / "k.cuh"
    header.write_text("template <int W>\nvoid f() {\n  constexpr int kIters = (64 + W - 1) / W;\n}\n")
    assert failed_condition(f"{header}(3): error: division by zero\n") == "(64 + W - 1) / W"
    log = ("ptxas /tmp/x.ptx, line 610; error   : Instruction 'tcgen05.mma' not supported on .target 'sm_90a'\n"
           "ptxas /tmp/x.ptx, line 611; error   : Feature '.kind::f16' not supported on .target 'sm_90a'\n"
           "ptxas fatal   : Ptx assembly aborted due to errors\n")
    assert arch_limit(log).startswith("ptxas: tcgen05.mma, .kind::f16 not supported on .target sm_90a")
    assert arch_limit("cuda.cu(3): error: expected a ;") is None
    loader = ("@cache_once\ndef _jit(\n    rows: int,\n) -> Module:\n    major, minor = cap()\n"
              "    if major < 10 or major == 12:\n        raise RuntimeError('SM100+')\n    return load_jit()\n")
    assert "refuses it (`if major < 10 or major == 12: raise`" in loader_refusal(loader, "_jit")
    assert loader_refusal(loader.replace("major < 10", "major < 9"), "_jit") is None
