"""The offline search's parameter space (read from a kernel written here) and its successive halving.
The screening verdicts are SYNTHETIC (tests/verdicts.py): a cost model written here stands in for the
GPU, so every rule of the search is exercised deterministically; the real screen is the harness
(`astra optimize --offline` on the GPU)."""

from __future__ import annotations

import re
import subprocess

import pytest

from astra.optimize import param_space
from astra.optimize.evaluator import Evaluator
from astra.optimize.loop import Context
from astra.optimize.offline import OfflineAgent
from astra.optimize.param_search import Search, representative_cases
from harness.building.toolchain import nvcc_path
from tests.toolchain import needs_nvcc
from tests.verdicts import make_verdict

KERNEL = """
#include <cuda_runtime.h>
#include <cstdint>
template <typename T, int N> struct alignas(sizeof(T) * N) AlignedVector { T val[N]; };

constexpr int kBlockSize = 256;
constexpr int kRowsPerBlock = 3;   // not a power of two: not tunable
constexpr uint32_t kVecSize = 16 / sizeof(float);

__global__ void __launch_bounds__(256) scale(float* out, const float* in, int n) {
  AlignedVector<float, 4> v;
#pragma unroll 4
  for (int k = 0; k < 4; ++k) v.val[k] = in[(blockIdx.x * kBlockSize + threadIdx.x) * 4 + k];
  for (int k = 0; k < 4; ++k) out[(blockIdx.x * kBlockSize + threadIdx.x) * 4 + k] = v.val[k] * 2.0f;
}
"""


def test_the_space_is_read_from_the_source():
    params = {p.name: p for p in param_space.find_params(KERNEL)}
    assert params["kBlockSize"].choices == (64, 128, 512, 1024) and params["kBlockSize"].kind == "const"
    assert "kRowsPerBlock" not in params
    aligned = next(p for p in params.values() if p.name.startswith("AlignedVector@"))
    assert aligned.value == 4 and aligned.choices == (2, 8)
    vec_bytes = next(p for p in params.values() if p.name.startswith("vector_bytes@"))
    assert vec_bytes.value == 16 and vec_bytes.choices == (8,)
    bounds = next(p for p in params.values() if p.name.startswith("launch_bounds@"))
    assert bounds.choices == (128, 512)
    minblocks = next(p for p in params.values() if p.name.startswith("min_blocks@"))
    assert minblocks.insert and minblocks.choices == (2, 4)
    unroll = next(p for p in params.values() if p.name.startswith("unroll@"))
    assert unroll.value == 4 and unroll.choices == (2, 8)


def test_render_sets_every_assigned_value_and_nothing_else():
    params = param_space.find_params(KERNEL)
    aligned = next(p.name for p in params if p.name.startswith("AlignedVector@"))
    minblocks = next(p.name for p in params if p.name.startswith("min_blocks@"))
    text = param_space.render(KERNEL, params, {"kBlockSize": 512, aligned: 8, minblocks: 2})
    assert "constexpr int kBlockSize = 512;" in text and "AlignedVector<float, 8> v;" in text
    assert "__launch_bounds__(256, 2)" in text
    assert text.replace("512", "256", 1).replace("<float, 8>", "<float, 4>").replace("(256, 2)", "(256)") == KERNEL
    assert param_space.describe(params, {minblocks: 2}) == f"{minblocks} none -> 2"


def test_single_moves_and_combinations():
    params = param_space.find_params(KERNEL)
    moves = param_space.single_moves(params)
    assert len(moves) == sum(len(p.choices) for p in params) and all(len(m) == 1 for m in moves)
    combos = param_space.combine([{"a": 1}, {"b": 2}, {"a": 4}, {"c": 3}])
    assert {"a": 1, "b": 2} in combos and {"a": 1, "b": 2, "c": 3} == combos[0]  # the triple first
    assert not any(c.get("a") == 4 and len(c) > 1 and c.get("b") is None and c.get("c") is None for c in combos)


@needs_nvcc
def test_every_single_move_still_compiles_for_hopper(tmp_path):
    """The space proposes text nvcc accepts (legality on the GPU is the screen's business)."""
    params = param_space.find_params(KERNEL)
    for move in param_space.single_moves(params)[:6]:
        source = tmp_path / "k.cu"
        source.write_text(param_space.render(KERNEL, params, move))
        done = subprocess.run([nvcc_path(), "-arch=sm_90a", "-c", str(source), "-o", str(tmp_path / "k.o")],
                              capture_output=True, text=True, timeout=240)
        assert done.returncode == 0, (move, done.stderr[-800:])


def _cost_model(calls: list):
    """A screen whose 'measurement' comes from the text: kBlockSize 512 wins 8% on every shape, the
    8-wide vector 5%, together 12%; 1024 threads is incorrect; everything else is a wash."""
    def screen(source: str, label: str, cases: list[str]):
        calls.append((label, tuple(cases)))
        if "kBlockSize = 1024" in source:
            return make_verdict({"decode": 1.0}, status="incorrect")
        gain = 1.0
        if "kBlockSize = 512" in source:
            gain *= 1.08
        if re.search(r"AlignedVector<float, 8>", source):
            gain *= 1.05
        return make_verdict({c.rstrip("0123456789"): gain for c in cases})
    return screen


def _base_verdict():
    verdict = make_verdict({"decode": [1.0, 1.0, 1.0], "prefill": [1.0, 1.0, 1.0, 1.0]})
    for i, case in enumerate(verdict.cases):
        case.bytes = 1000 * (i + 1)
    return verdict


def test_representative_cases_per_band():
    verdict = _base_verdict()
    assert representative_cases(verdict, None, 1) == ["decode1", "prefill2"]
    assert representative_cases(verdict, None, 3) == ["decode0", "decode1", "decode2", "prefill0", "prefill2", "prefill3"]
    assert representative_cases(verdict, "float16", 1) == []


def test_successive_halving_keeps_the_winners_and_combines_them():
    calls: list = []
    rungs = [representative_cases(_base_verdict(), None, n) for n in (1, 3)]
    built: list = []
    search = Search(KERNEL, _cost_model(calls), rungs, deadline=float("inf"),
                    prebuild=lambda sources, cases, base: built.append((len(sources), tuple(cases))))
    survivors = search.run()
    assert survivors, search.log
    best = survivors[0]
    assert best.assignment["kBlockSize"] == 512 and any(v == 8 for k, v in best.assignment.items() if k.startswith("Aligned"))
    assert best.score == pytest.approx(1.08 * 1.05) and len(best.scores) == 2  # screened on both rungs
    singles = sum(len(p.choices) for p in param_space.find_params(KERNEL))
    first_rung = [c for c in calls if c[1] == tuple(rungs[0])]
    second_rung = [c for c in calls if c[1] == tuple(rungs[1])]
    assert len(first_rung) > singles  # every single move, then the combinations
    assert 0 < len(second_rung) < len(first_rung) / 2  # only the best third goes on
    assert built[0] == (singles, tuple(rungs[0]))  # a rung is built at once before it is screened
    assert any("incorrect" in line for line in search.log)


def test_the_deadline_stops_screening():
    calls: list = []
    search = Search(KERNEL, _cost_model(calls), [["decode0"]], deadline=0.0)
    assert search.run() == [] and calls == [] and "deadline" in search.log[-1]
    assert search.log[0].startswith(f"{len(param_space.find_params(KERNEL))} parameter(s): kBlockSize=256 (const)")


def test_winners_a_later_rung_could_not_screen_are_still_proposed():
    """On an H100 (qsa_indexer, 2026-11-24) the deadline fell as the second rung began: its x1.148 winner on
    the first rung was dropped and the search proposed nothing. Such winners keep their first-rung rank."""
    calls: list = []
    wide = ["decode0", "decode1", "decode2"]
    holder: dict = {}

    def prebuild(sources, cases, base):
        if cases == wide:
            holder["search"].deadline = 0.0  # the time runs out as the second rung starts
        return {}

    search = Search(KERNEL, _cost_model(calls), [["decode0"], wide], deadline=float("inf"), prebuild=prebuild)
    holder["search"] = search
    survivors = search.run()
    assert survivors and all(len(p.scores) == 1 and p.score > 1.01 for p in survivors)
    assert survivors[0].assignment.get("kBlockSize") == 512 and survivors[0].score == pytest.approx(1.08 * 1.05)
    assert calls and all(cases == ("decode0",) for _, cases in calls)
    assert any(line.startswith("rung 1: deadline reached") for line in search.log)


def test_each_screening_is_reported_as_it_happens_with_why_it_lost(tmp_path):
    """The run's search.log, the printed lines and the report show every screened point: its move, status,
    screened speedup or the first line of why it failed, and how long it took."""
    from astra.optimize.offline import search_logger
    from astra.optimize.rundir import RunDir
    from astra.report.run_html import render

    run = RunDir.create("toy", "0.5.23", "offline", KERNEL)
    printed: list[str] = []
    calls: list = []

    def screen(source, label, cases):
        verdict = _cost_model(calls)(source, label, cases)
        if verdict.status == "incorrect":
            verdict.reason = "case decode0: out differs at index 17\nsecond line"
        verdict.phases = {"build_s": 0.25, "env_s": 1.0, "check_s": 3.0, "time_s": 24.0, "total_s": 28.3}
        return verdict

    search = Search(KERNEL, screen, [["decode0"]], deadline=float("inf"), on_line=search_logger(run, printed.append))
    search.run()
    written = run.search_log.read_text().splitlines()
    assert len(written) == len(search.log) == len(printed) and len(calls) >= 6
    assert all(line.endswith(logged) for line, logged in zip(written, search.log))
    wrong = next(line for line in written if "kBlockSize 256 -> 1024" in line)
    assert "incorrect (case decode0: out differs at index 17) [" in wrong and "second line" not in wrong
    assert any(re.search(r"kBlockSize 256 -> 512: correct x1\.080 \[\d+ s: build 0\.2, env 1\.0, check 3\.0, "
                         r"time 24\.0\]$", line) for line in written)
    assert all("search: " in line for line in printed)
    page = render(run)
    assert "Parameter search: every screened point" in page and "kBlockSize 256 -&gt; 512: correct x1.080" in page


def test_the_offline_agent_proposes_the_survivors_first(tmp_path):
    calls: list = []
    agent = OfflineAgent("k.cuh", tmp_path, [], evaluator=Evaluator(screen=_cost_model(calls)))
    agent._kernels = lambda source: []  # libclang is not what this test is about: the catalog gets no kernels
    ctx = Context("demo", 0, KERNEL, _base_verdict(), original_source=KERNEL, wall_left_s=600.0)
    proposals = agent.propose(ctx)
    assert "parameter search" in agent.rationale and "survivor" in agent.rationale
    assert proposals[0].family == "param" and "kBlockSize 256 -> 512" in proposals[0].description
    assert not any(p.family in ("launch", "bounds") for p in proposals)  # the space covers them
    screened = len(calls)
    again = agent.propose(ctx)  # the same base: searched once, its proposals made once
    assert len(calls) == screened and not any(p.family == "param" for p in again)


# ---------------------------------------------------------------- on SGLang's own kernels (0.5.23, downloaded)


def _sglang_kernel(tree, rel: str) -> str:
    return (tree.csrc_dir / rel).read_text()


def test_thread_caps_and_literal_block_sizes_are_found_in_real_kernels(sglang_0523):
    """The rope kernels of pos_enc.cuh cap their threads with `std::min(..., 512)`; paged_experts launches
    literal 256-thread blocks; moe_topk_softmax names its tile TPB and WARPS_PER_TB. None of these were
    in the space before (no `k`-prefixed constexpr)."""
    rope = _sglang_kernel(sglang_0523, "elementwise/pos_enc.cuh")
    caps = [p for p in param_space.find_params(rope) if p.kind == "cap"]
    assert len(caps) == 2 and all(p.value == 512 and p.choices == (128, 256, 1024) for p in caps)
    assert all(rope[p.start:p.end] == "512" and "std::min" in rope[rope.rfind("\n", 0, p.start):p.start] for p in caps)
    experts = _sglang_kernel(sglang_0523, "moe/paged_experts.cuh")
    launches = {p.value: p for p in param_space.find_params(experts) if p.kind == "launch"}
    # the block sizes; the literal grid of 256 blocks is not touched, nor the one-warp decide kernel's 32
    # (it never reads blockDim: test_a_kernel_that_never_reads_blockdim_keeps_its_block_size)
    assert set(launches) == {256}
    text = param_space.render(experts, list(launches.values()), {launches[256].name: 512})
    assert "LaunchKernel(256, 512," in text and text.count("LaunchKernel(256, 256,") == experts.count("LaunchKernel(256, 256,") - 1
    softmax = {p.name: p for p in param_space.find_params(_sglang_kernel(sglang_0523, "moe/moe_topk_softmax.cuh"))}
    assert softmax["TPB"].value == 256 and softmax["WARPS_PER_TB"].value == 4


ONE_WARP = """
#include <cstdint>
namespace demo {
__device__ int spread(int n) { return n * blockDim.x; }

// one warp: its lanes stride by 32 and lane 0 commits; a second warp would repeat the loop and race
__global__ void one_warp(int* slots, const int* ids, int n) {
  const int lane = threadIdx.x;
  for (int i = lane; i < n; i += 32) slots[ids[i]] = i;
  if (lane == 0) slots[0] = n;
}
__global__ void strided(float* out, int n) {
  for (int i = threadIdx.x; i < n; i += blockDim.x) out[i] = 0.f;
}
template <int kN>
__global__ void through_helper(int* out) { out[threadIdx.x] = spread(kN); }
template <int kN>
__global__ void fixed_tile(int* out) { out[threadIdx.x + kN] = 1; }
template <bool kFirst>
__global__ void one_warp_of(int* slots) {
  for (int i = threadIdx.x; i < 64; i += 32) slots[i] = kFirst;
}
#define ROW_STRIDE blockDim.x
__global__ void macro_stride(float* out, int n) {
  for (int i = threadIdx.x; i < n; i += ROW_STRIDE) out[i] = 1.f;
}

void launch(int* slots, const int* ids, int n, float* out, cudaStream_t stream) {
  LaunchKernel(1, 32, stream).enable_pdl(false)(one_warp, slots, ids, n);
  LaunchKernel(1, 256, stream)(&demo::strided, out, n);
  through_helper<4><<<1, 128, 0, stream>>>(slots);
  auto tile = fixed_tile<8>;
  tile<<<2, 64, 0, stream>>>(slots);
  auto pick = n > 4 ? one_warp_of<true> : one_warp_of<false>;
  LaunchKernel(1, 32, stream)(pick, slots);
  auto qualified = &demo::one_warp;
  qualified<<<1, 32, 0, stream>>>(slots, ids, n);
  macro_stride<<<1, 512, 0, stream>>>(out, n);
}
}  // namespace demo
"""


def test_a_kernel_that_never_reads_blockdim_keeps_its_block_size():
    """A literal block size is tuned only where the launched kernel reads blockDim (itself or through a
    function of the file it calls): a one-warp kernel whose lanes stride by 32 would, with 64 threads,
    run its loop twice over and race on its stores, and the race can leave the original's outputs."""
    launches = {p.value: p for p in param_space.find_params(ONE_WARP) if p.kind == "launch"}
    # strided, through_helper, macro_stride (blockDim through a macro); not one_warp (32, named directly or
    # through `&demo::one_warp`), one_warp_of (through a choice of two instances) nor fixed_tile (64)
    assert sorted(launches) == [128, 256, 512]
    assert ONE_WARP[launches[128].start - 10:launches[128].end].endswith("<<<1, 128")


def test_warp_sizes_maxima_and_comments_are_never_tuned(sglang_0523):
    for rel in ("moe/moe_topk_softmax.cuh", "elementwise/kvcache.cuh", "minimax/minimax_decode_topk.cuh"):
        text = _sglang_kernel(sglang_0523, rel)
        for p in param_space.find_params(text):
            assert not re.search(r"(?i)warp_?size|max", p.name), (rel, p.name)
            line_start = text.rfind("\n", 0, p.start) + 1
            assert "//" not in text[line_start:p.start], (rel, p.name, text[line_start:p.end])


def test_single_moves_try_vectors_and_geometry_before_unrolling(sglang_0523):
    params = param_space.find_params(_sglang_kernel(sglang_0523, "elementwise/fused_metadata_copy.cuh"))
    kinds = [next(p.kind for p in params if p.name in move) for move in param_space.single_moves(params)]
    ranks = [param_space.ORDER.index(kind) for kind in kinds]
    assert ranks == sorted(ranks) and "unroll" in kinds


@needs_nvcc
def test_a_thread_cap_move_on_a_real_kernel_still_compiles(sglang_0523, tmp_path):
    """pos_enc.cuh with its rope thread cap at 1024, compiled for sm_90a with SGLang's own includes."""
    rope = _sglang_kernel(sglang_0523, "elementwise/pos_enc.cuh")
    params = param_space.find_params(rope)
    cap = next(p for p in params if p.kind == "cap")
    source = tmp_path / "pos_enc.cu"
    source.write_text(param_space.render(rope, params, {cap.name: 1024}))
    from harness.building.toolchain import arch_flags, tvm_ffi_paths
    includes = [f"-I{sglang_0523.include_dir}", *(f"-I{d}" for d in tvm_ffi_paths()[0])]
    done = subprocess.run([nvcc_path(), *arch_flags("90a"), "-std=c++20", "--expt-relaxed-constexpr", *includes, "--cubin",
                           str(source), "-o", str(tmp_path / "k.cubin")], capture_output=True, text=True, timeout=400)
    assert done.returncode == 0, done.stderr[-1500:]


def test_the_search_stays_in_the_code_its_entry_reaches(sglang_0523):
    """pos_enc.cuh holds two exports: rotary_embedding reaches its kernel through dispatch_by_dtype, a
    DISPATCH_DTYPE macro and launch_kernel<T>; bf16_rope_scale_store launches its own. Each one's thread
    cap is foreign code to the other (libclang extents, names followed through macros)."""
    from astra.optimize import entry_reach
    from astra.sglang import cuda_parse

    path = sglang_0523.csrc_dir / "elementwise/pos_enc.cuh"
    text = path.read_text()
    parsed = cuda_parse.parse_source(path, [str(path.parent), str(sglang_0523.include_dir), str(sglang_0523.csrc_dir)])
    caps = sorted((p for p in param_space.find_params(text) if p.kind == "cap"), key=lambda p: p.start)
    lines = [param_space.line_of(text, p) for p in caps]
    rope = entry_reach.foreign_lines(parsed, ["RotaryEmbeddingKernel::run"], text)
    store = entry_reach.foreign_lines(parsed, ["BF16RopeScaleStoreKernel<{idx}>::run"], text)
    assert lines[0] not in rope and lines[1] in rope
    assert lines[0] in store and lines[1] not in store
    assert entry_reach.foreign_lines(parsed, ["NoSuchKernel::run"], text) == set()  # never narrowed on a guess
    assert entry_reach.entry_path("StoreKVCacheKernel<{row_bytes}, Foo<1, 2>, true>::run") == "StoreKVCacheKernel::run"
    calls: list = []
    search = Search(text, _cost_model(calls), [["decode0"]], deadline=float("inf"), foreign_lines=rope)
    search.run()
    assert any("not screened: " + caps[1].name in line for line in search.log)
    assert calls and all(caps[1].name not in label for label, _ in calls)


def test_the_search_and_the_catalog_share_one_parse_per_source(tmp_path):
    """libclang takes seconds on an SGLang file: the reach of the search and the catalog's kernels read
    the same parse of a base, and a new base is parsed once more."""
    calls: list = []
    agent = OfflineAgent("k.cuh", tmp_path, [], evaluator=Evaluator(screen=_cost_model([])), entries=["Run::run"])
    agent._parse = lambda source: calls.append(source) or None
    ctx = Context("demo", 0, KERNEL, _base_verdict(), original_source=KERNEL, wall_left_s=600.0)
    agent.propose(ctx)
    assert calls == [KERNEL]
    agent._parsed(KERNEL + "\n")
    assert len(calls) == 2


def test_screens_are_cheap_and_candidates_are_verified_in_full(sglang_0523):
    from astra.optimize.evaluator import evaluation_options
    from astra.spec import jobs
    from astra.spec import model as spec_mod
    from harness import Options
    from harness.job import Job

    screen, full, original = (evaluation_options(k) for k in ("screen", "candidate", "original"))
    assert (screen.seeds, screen.extra_trials, screen.modes, screen.sanitizer) == ([0], False, ["graph"], False)
    default = Options()
    assert (full.seeds, full.extra_trials, full.modes, full.sanitizer) == (
        default.seeds, True, default.modes, True)  # a survivor is judged like any candidate
    assert evaluation_options("candidate", sanitizer=False).sanitizer is False
    assert (original.outputs_checked, original.sanitizer) == (False, False)
    spec = spec_mod.load("rmsnorm")  # the screen's options travel to the worker unchanged
    job = jobs.make_job(spec, sglang_0523, candidate_source="// a point\n", label="screen", options=screen)
    again = Job.from_json(job.to_json())
    assert (again.options.seeds, again.options.modes, again.options.extra_trials) == ([0], ["graph"], False)
    with pytest.raises(ValueError, match="unknown evaluation kind"):
        evaluation_options("quick")


def _search_skipping(skip: dict[str, str]) -> tuple[Search, list, list]:
    """A search whose prebuild answers `skip` ({text in a source: reason}) for every rung; the sources its
    workers screened, and the cost model's calls."""
    calls: list = []
    sources: list = []

    def prebuild(sources_, cases, base):
        assert base == KERNEL and cases == ["decode0"]
        return {s: why for s in sources_ for text, why in skip.items() if text in s}

    def screen(source, label, cases):
        sources.append(source)
        return _cost_model(calls)(source, label, cases)

    search = Search(KERNEL, screen, [["decode0"]], deadline=float("inf"), prebuild=prebuild)
    search.run()
    return search, sources, calls


def test_a_point_that_builds_to_the_base_code_is_not_screened():
    search, sources, calls = _search_skipping({"kBlockSize = 128": "builds to the base's machine code"})
    assert not any("kBlockSize = 128" in s for s in sources) and len(sources) > 3
    assert "rung 0: kBlockSize 256 -> 128: builds to the base's machine code, not screened" in search.log[:3]
    assert search.screened == len(calls)


def test_a_point_that_failed_its_rungs_build_is_judged_without_a_worker():
    """A build failure found by the rung's build is the point's verdict (score 0): no worker run for it."""
    search, sources, calls = _search_skipping(
        {"kBlockSize = 1024": "build_failed: kernel.cuh(27): error: static assertion failed"})
    failed = [line for line in search.log if "build_failed" in line]
    assert failed == ["rung 0 (1 shapes): kBlockSize 256 -> 1024: build_failed (kernel.cuh(27): error: static "
                      "assertion failed) [the rung's build, not screened]"]
    assert not any("kBlockSize = 1024" in s for s in sources) and search.screened == len(calls) == len(sources)


HOST_ENTRY = """
template <int N, int BLOCK_DIM>
__global__ void fill(float* out) { out[blockIdx.x * BLOCK_DIM + threadIdx.x] = N; }

template <int N, int BLOCK_DIM>
void launch(float* out, int n) {  // host entry
  fill<N, BLOCK_DIM><<<(n + BLOCK_DIM - 1) / BLOCK_DIM, BLOCK_DIM>>>(out);
}
"""


def test_the_agent_hands_the_specs_entries_to_the_search(tmp_path):
    """The block size the caller passes (`launch<{n}, 256>`) is only in the spec's entry: without the entries
    the search finds nothing to move; with them it screens the tmpl parameter and proposes the winner."""
    calls: list = []

    def screen(source: str, label: str, cases: list[str]):
        calls.append(label)
        gain = 1.1 if "constexpr int BLOCK_DIM = 64;" in source else 1.0
        return make_verdict({c.rstrip("0123456789"): gain for c in cases})

    ctx = Context("demo", 0, HOST_ENTRY, _base_verdict(), original_source=HOST_ENTRY, wall_left_s=600.0)
    bare = OfflineAgent("k.cuh", tmp_path, [], evaluator=Evaluator(screen=screen))
    bare._parse = lambda source: None
    assert not any(p.family == "param" for p in bare.propose(ctx)) and calls == []
    agent = OfflineAgent("k.cuh", tmp_path, [], evaluator=Evaluator(screen=screen), entries=["launch<{n}, 256>"])
    agent._parse = lambda source: None
    proposals = agent.propose(ctx)
    assert "param:BLOCK_DIM=64" in calls
    assert proposals[0].name == "param:BLOCK_DIM=64" and "template argument of function launch" in proposals[0].description
    assert "constexpr int BLOCK_DIM = 64;" in proposals[0].source

