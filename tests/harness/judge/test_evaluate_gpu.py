"""evaluate() (the judge) end to end on a real GPU with a tiny kernel of our own (y = x * alpha + b; acc += y).

Needs CUDA, nvcc and apache-tvm-ffi. Each test builds through a shared cache, so the original is
compiled once per session. The judge runs in this process and the candidate in a candidate process of
its own, so a candidate that faults is tried here too: this process's CUDA context must stay usable.
"""

from __future__ import annotations

import pytest
import torch

if not torch.cuda.is_available():
    pytest.skip("needs a CUDA GPU", allow_module_level=True)

from pathlib import Path  # noqa: E402

from harness.job import ArgSpec, BuildBase, Case, Job, Options, Variant, band_of  # noqa: E402
from harness.judge.evaluate import build_all, evaluate  # noqa: E402
from harness.judge.paired_timing import COLD_SETS  # noqa: E402
from harness.timing.modes import l2_bytes  # noqa: E402

pytestmark = pytest.mark.gpu

KERNEL = r"""
#include <tvm/ffi/container/tensor.h>
#include <tvm/ffi/error.h>
#include <tvm/ffi/extra/c_env_api.h>

#include <cuda_bf16.h>
#include <cuda_runtime.h>
#include <cstdint>

namespace toy {

template <typename T>
__global__ void axpb_kernel(T* y, T* acc, const T* x, const T* b, float alpha, int64_t n, int64_t hidden) {
  const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i < n) {
    const float v = static_cast<float>(x[i]) * alpha + static_cast<float>(b[i % hidden]);
    y[i] = static_cast<T>(v);  // BODY
    acc[i] = static_cast<T>(static_cast<float>(acc[i]) + v);
  }
}

template <typename T>
struct Axpb {
  static void run(tvm::ffi::TensorView y, tvm::ffi::TensorView acc, tvm::ffi::TensorView x,
                  tvm::ffi::TensorView b, double alpha) {
    const int64_t n = x.numel();
    const int64_t hidden = b.numel();
    TVM_FFI_CHECK(y.numel() == n && acc.numel() == n && hidden > 0 && n % hidden == 0, ValueError)
        << "shape mismatch";
    TVM_FFI_CHECK(x.IsContiguous() && y.IsContiguous() && acc.IsContiguous(), ValueError) << "contiguous only";
    const DLDevice device = x.device();
    auto stream = static_cast<cudaStream_t>(TVMFFIEnvGetStream(device.device_type, device.device_id));
    const int threads = 256;
    const int64_t blocks = (n + threads - 1) / threads;
    axpb_kernel<T><<<static_cast<unsigned>(blocks), threads, 0, stream>>>(
        static_cast<T*>(y.data_ptr()), static_cast<T*>(acc.data_ptr()), static_cast<const T*>(x.data_ptr()),
        static_cast<const T*>(b.data_ptr()), static_cast<float>(alpha), n, hidden);
    const cudaError_t err = cudaGetLastError();
    if (err != cudaSuccess) TVM_FFI_THROW(RuntimeError) << cudaGetErrorString(err);
  }
};

}  // namespace toy
"""

CPP = {"float32": "float", "bfloat16": "__nv_bfloat16"}


def _case(tokens: int, hidden: int, dtype: str, label: str = "toy", timed: bool = True) -> Case:
    elt = 4 if dtype == "float32" else 2
    return Case(
        id=f"{label}/{dtype}/tokens={tokens},hidden={hidden}", band=band_of(tokens), label=label, dtype=dtype,
        dims={"tokens": tokens, "hidden": hidden}, variant=dtype, bytes=(4 * tokens * hidden + hidden) * elt,
        timed=timed,
        args=[ArgSpec("y", "tensor", "out", [tokens, hidden], dtype),
              ArgSpec("acc", "tensor", "inout", [tokens, hidden], dtype),
              ArgSpec("x", "tensor", "in", [tokens, hidden], dtype),
              ArgSpec("b", "tensor", "in", [hidden], dtype, {"dist": "uniform", "low": -2.0, "high": 2.0}),
              ArgSpec("alpha", "scalar", "in", [], "float32", value=0.75)])


@pytest.fixture(scope="module")
def source_root(tmp_path_factory):
    root = tmp_path_factory.mktemp("toy_src")
    (root / "toy.cuh").write_text(KERNEL)
    return root


@pytest.fixture(scope="module")
def cache_dir(tmp_path_factory):
    return tmp_path_factory.mktemp("toy_builds")


def _job(source_root, cache_dir, candidate: str | None = None, cases: list[Case] | None = None) -> Job:
    cases = cases or [_case(1, 4096, "bfloat16"), _case(512, 4096, "bfloat16"), _case(4096, 4096, "bfloat16"),
                      _case(127, 1000, "bfloat16", "edge", timed=False), _case(33, 96, "float32", "edge", timed=False)]
    return Job(
        name="toy_axpb", entry="axpb", kernel_file="toy.cuh",
        build=BuildBase(source_root=str(source_root), include_dirs=[], cuda_files=["toy.cuh"]),
        variants={d: Variant(d, [["axpb", f"toy::Axpb<{c}>::run"]]) for d, c in CPP.items()},
        cases=cases,
        tolerance={"bfloat16": {"atol": 1e-2, "rtol": 1e-2, "floor": 1e-2},
                   "float32": {"atol": 1e-5, "rtol": 1e-5, "floor": 1e-5}},
        candidate_source=candidate,
        options=Options(budget_ms_per_case=150.0, cache_dir=str(cache_dir)))


def _mutate(old: str, new: str) -> str:
    assert old in KERNEL
    return KERNEL.replace(old, new)


def test_original_against_itself(source_root, cache_dir):
    job = _job(source_root, cache_dir)
    verdict = evaluate(job)
    assert verdict.status == "correct", verdict.reason  # the original is never under its own physical floor
    assert verdict.correct and all(c.correct for c in verdict.cases)
    assert verdict.env["copy_bandwidth_Bps"] > 1e11 and verdict.env["launch_floor_us"] > 0
    model = verdict.env["perf_model"]
    assert model["floor_Bps"] >= max(model["read_Bps"], model["write_Bps"], model["copy_Bps"]) > 1e11
    assert (cache_dir / next(p.name for p in cache_dir.iterdir() if p.name.startswith("perf-model-"))).is_file()
    for case, result in zip(job.cases, verdict.cases):
        assert (result.bytes_read, result.bytes_written) == case.traffic()[:2] and result.bytes_split == "roles"
        if result.timed:  # one checked set per launch of a replay, every launch verified at the last sample
            info = result.timings["graph"].info
            assert info["input_sets"] == info["launches_per_sample"] >= 1 and info["verified"][-1] == "the last sample"
            cold = result.timings["cold"].info  # a cold side cycles through its sets, as many as fit
            assert 1 <= cold["input_sets"] <= COLD_SETS and cold["verified"][-1] == "the last sample"
            for view in ("graph", "cold"):
                floor = result.floors[view]
                assert 0 < floor["physical_us"] <= floor["practical_us"] and floor["orig_us"] > 0.9 * floor["physical_us"]
    assert verdict.env["l2_bytes"] == l2_bytes()
    assert set(verdict.band_speedups) == {"graph", "cold"}
    timed = [c for c in verdict.cases if c.timed]
    assert len(timed) == 3 and all(set(c.timings) == {"graph", "cold"} for c in timed)
    for case in timed:
        for mode, entry in case.timings.items():
            assert 0.8 < entry.speedup < 1.25, (case.id, mode, entry.speedup)
            assert entry.orig.median_us > 0 and entry.orig.p10_us <= entry.orig.p90_us
        assert case.roofline["graph"]["cand_fraction"] > 0 and case.copy_us is not None
        assert case.deterministic_orig and case.deterministic_cand
    big = timed[-1]
    assert big.timings["graph"].orig.median_us < big.timings["cold"].orig.median_us * 1.2
    assert verdict.signatures["bfloat16"]["axpb"]["orig"] == verdict.signatures["bfloat16"]["axpb"]["cand"]
    assert verdict.phases["build_s"] >= 0 and verdict.phases["time_s"] > 0
    # outputs came over CUDA IPC from the sandboxed candidate process: every stored tensor of every trial
    # and of both back-to-back launches (y, acc, x and b per call)
    trials = sum(case.trials for case in verdict.cases)
    assert verdict.phases["check_tensors_over_cuda_ipc"] == 4 * (trials + 2 * len(verdict.cases))
    assert type(verdict).from_json(verdict.to_json()).status == "correct"


def test_same_source_as_candidate_builds_separately_and_matches(source_root, cache_dir):
    verdict = evaluate(_job(source_root, cache_dir, candidate=KERNEL + "\n// candidate copy\n"))
    assert verdict.status == "correct", verdict.reason
    assert {b["side"] for b in verdict.builds} == {"orig", "cand"}
    for case in verdict.cases:
        for entry in case.timings.values():
            assert 0.8 < entry.speedup < 1.25


def test_wrong_candidate_is_incorrect(source_root, cache_dir):
    wrong = _mutate("* alpha +", "* (alpha * 1.05f) +")
    verdict = evaluate(_job(source_root, cache_dir, candidate=wrong))
    assert verdict.status == "incorrect" and not verdict.correct and verdict.faster is False
    assert "timing skipped: the candidate is incorrect" in verdict.notes
    assert all(not c.timings for c in verdict.cases)


def test_unwritten_tail_is_caught(source_root, cache_dir):
    lazy = _mutate("y[i] = static_cast<T>(v);  // BODY", "if (i + 1 < n) y[i] = static_cast<T>(v);")
    verdict = evaluate(_job(source_root, cache_dir, candidate=lazy))
    assert verdict.status == "incorrect"
    assert any("NaN/Inf" in r for c in verdict.cases for r in c.reasons)


def test_writing_read_only_input_is_caught(source_root, cache_dir):
    scribble = _mutate("y[i] = static_cast<T>(v);  // BODY",
                       "y[i] = static_cast<T>(v); const_cast<T*>(x)[i] = static_cast<T>(v);")
    verdict = evaluate(_job(source_root, cache_dir, candidate=scribble))
    assert verdict.status == "incorrect"
    assert any("read-only argument x" in r for c in verdict.cases for r in c.reasons)


def test_candidate_rejecting_a_shape_fails_that_case(source_root, cache_dir):
    picky = _mutate("<< \"shape mismatch\";", "<< \"shape mismatch\";\n    TVM_FFI_CHECK(hidden % 16 == 0, ValueError) << \"hidden\";")
    verdict = evaluate(_job(source_root, cache_dir, candidate=picky))
    assert verdict.status == "incorrect"
    failing = [c.id for c in verdict.cases if not c.correct]
    assert failing == ["edge/bfloat16/tokens=127,hidden=1000"]


def test_build_failure_and_signature_mismatch(source_root, cache_dir):
    broken = evaluate(_job(source_root, cache_dir, candidate=_mutate("const int threads", "const int threads = ;//")))
    assert broken.status == "build_failed" and "candidate failed to build" in broken.reason
    extra_arg = _mutate("double alpha) {", "double alpha, int64_t unused) {")
    mismatch = evaluate(_job(source_root, cache_dir, candidate=extra_arg))
    assert mismatch.status == "signature_mismatch", mismatch.reason


def test_judge_never_loads_the_candidate_and_survives_its_fault(source_root, cache_dir):
    fault = _mutate("y[i] = static_cast<T>(v);  // BODY", "y[i] = static_cast<T>(v); if (i == 0) *(volatile int*)0 = 1;")
    job = _job(source_root, cache_dir, candidate=fault)
    verdict = evaluate(job)
    assert verdict.status == "crashed" and "illegal" in verdict.reason.lower(), verdict.reason
    paths, _, failure = build_all(job, cache_dir)
    assert failure is None and paths[("cand", "bfloat16")] not in Path("/proc/self/maps").read_text()
    assert torch.ones(4, device="cuda").sum().item() == 4.0  # the judge's context is intact


def test_small_magnitude_trial_catches_a_clamp(source_root, cache_dir):
    clamp = _mutate("y[i] = static_cast<T>(v);  // BODY", "y[i] = static_cast<T>(fabsf(v) < 1e-3f ? 0.0f : v);")
    verdict = evaluate(_job(source_root, cache_dir, candidate=clamp))
    assert verdict.status == "incorrect" and any("(small)" in r for c in verdict.cases for r in c.reasons), verdict.reason


def test_copy_references_are_measured_while_the_build_runs_and_stop_when_it_ends(source_root, cache_dir):
    from harness.judge.timings import copy_references

    job = _job(source_root, cache_dir)
    device = torch.device("cuda")
    timed = [case for case in job.cases if case.timed]
    copies = copy_references(job, device, lambda: True)
    assert set(copies) == {case.id for case in timed} and all(us > 0 for us in copies.values())
    big, small = copies[timed[-1].id], copies[timed[0].id]
    assert big > small  # 4096 rows copy slower than one
    ticks = iter([True, False])
    assert set(copy_references(job, device, lambda: next(ticks))) == {timed[0].id}  # the build ended: the rest later
    job.options.modes = ["cold"]
    assert copy_references(job, device, lambda: True) == {}  # no graph view, no copy reference


REFERENCE = '''
def reference(args, dims):
    y = args["x"] * args["alpha"] + args["b"]
    return {"y": y, "acc": args["acc"] + y}
'''


def test_the_originals_trials_beside_the_build_are_what_the_outputs_phase_computes(source_root, cache_dir, tmp_path):
    from harness.judge.correctness import original_outputs, reference_args, run_reference
    from harness.judge.evaluate import _launch, _trials
    from harness.judge.original_beside_build import prepare, trial_bytes

    (tmp_path / "reference.py").write_text(REFERENCE)
    job = _job(source_root, cache_dir)
    job.reference = str(tmp_path / "reference.py")
    device = torch.device("cuda")
    build_all(job, cache_dir)  # the original is built: what every check of a run after its first finds
    trials = _trials(job)
    room = sum(trial_bytes(case) * len(trials[i]) for i, case in enumerate(job.cases))  # every trial fits
    prepared = prepare(job, device, lambda: True, trials, _launch, room)
    assert prepared is not None and len(prepared) == sum(len(t) for t in trials)
    assert prepared.reference is not None and set(prepared.modules) == {"bfloat16", "float32"}
    case = job.cases[1]
    inputs, orig, ref_out = prepared.take(1, 0)
    again_inputs, again = original_outputs(_launch(prepared.modules[case.variant], job.entry), case, trials[1][0], device)
    assert all(torch.equal(inputs[n], again_inputs[n]) and torch.equal(orig[n], again[n]) for n in ("x", "y", "acc"))
    expected = run_reference(prepared.reference, case, reference_args(inputs), "t")
    assert torch.equal(ref_out["y"], expected["y"]) and ref_out["y"].dtype == torch.float64
    assert prepared.take(1, 0) is None  # taken once
    ticks = iter([True, True, True, False])  # asked once on entry, then before each trial
    assert len(prepare(job, device, lambda: next(ticks), trials, _launch, room)) == 2  # the build ended
    one = trial_bytes(job.cases[0])
    assert len(prepare(job, device, lambda: True, trials, _launch, one)) == 1  # room for one trial of its size
    assert len(prepare(job, device, lambda: True, trials, _launch, one - 1)) == 0
    assert prepare(job, device, lambda: False, trials, _launch, room) is None


def test_verdicts_with_the_originals_trials_beside_the_build(source_root, cache_dir, tmp_path, monkeypatch):
    from harness.judge import early_build

    (tmp_path / "reference.py").write_text(REFERENCE)
    monkeypatch.setattr(early_build, "running", lambda: True)  # as if nvcc were still building the candidate

    def judged(candidate):
        job = _job(source_root, cache_dir, candidate=candidate)
        job.reference = str(tmp_path / "reference.py")
        build_all(_job(source_root, cache_dir), cache_dir)  # the original built
        return evaluate(job)

    verdict = judged(KERNEL + "\n// beside the build\n")
    assert verdict.status == "correct", verdict.reason
    assert verdict.phases["trials_beside_build"] == sum(case.trials for case in verdict.cases) > len(verdict.cases)
    wrong = judged(_mutate("* alpha +", "* (alpha * 1.05f) +"))
    assert wrong.status == "incorrect" and wrong.phases["trials_beside_build"] > 0
    assert all(not case.correct for case in wrong.cases)
