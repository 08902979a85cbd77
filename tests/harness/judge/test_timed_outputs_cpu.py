"""harness.judge.timed_outputs on the CPU: a call made as a mode times it must give the checked call's outputs.
The GPU half (graph capture, the real candidate process) is tests/adversarial's u_half_when_timed."""

from __future__ import annotations

import json

import torch

from harness.job import ArgSpec, BuildBase, Case, Job, Options, Variant
from harness.judge import timed_outputs
from harness.judge.correctness import determinism_digests
from harness.judge.verdict import CaseResult, ModeTiming, decide
from harness.timing.stats import Stats


def _case() -> Case:
    return Case(id="toy/tokens=8", band="decode", label="toy", dtype="float32", dims={"tokens": 8, "hidden": 16},
                variant="v", bytes=2 * 8 * 16 * 4, timed=True,
                args=[ArgSpec("y", "tensor", "out", [8, 16], "float32"), ArgSpec("x", "tensor", "in", [8, 16], "float32")])


def _job() -> Job:
    base = BuildBase(source_root="/src", include_dirs=[], cuda_files=["toy.cuh"])
    return Job(name="toy", entry="toy", kernel_file="toy.cuh", build=base, variants={"v": Variant("v", [["toy", "T::run"]])},
               cases=[_case()], tolerance={"float32": {"atol": 1e-5, "rtol": 1e-5, "floor": 1e-6}},
               options=Options(modes=["cold"]))


def honest(args):
    y, x = args
    y.copy_(2 * x)


def half_after(calls: int):
    """Whole rows for the first `calls` calls, then only the first half (the rest keeps the poison)."""
    count = {"n": 0}

    def run(args):
        count["n"] += 1
        y, x = args
        rows = x.shape[0] if count["n"] <= calls else x.shape[0] // 2
        y[:rows].copy_(2 * x[:rows])
    return run


def _timed_result(deterministic: bool = True) -> CaseResult:
    case = _case()
    result = CaseResult(id=case.id, band=case.band, label=case.label, dtype=case.dtype, dims=case.dims, timed=True,
                        bytes=case.bytes, deterministic_cand=deterministic)
    result.timings["cold"] = ModeTiming(orig=Stats(10.0, 9.0, 11.0, 20, 0.005), cand=Stats(5.0, 4.5, 5.5, 20, 0.005), speedup=2.0)
    return result


def _judge(tmp_path, launch, *, checked_calls: int = 2) -> CaseResult:
    """Phase outputs' determinism digests, then timed calls, then a timed call per mode, then the judge."""
    job, case, device = _job(), _case(), torch.device("cpu")
    checked = determinism_digests(launch, case, 0, device)
    for _ in range(checked_calls):  # the timed calls
        launch([torch.empty(8, 16), torch.ones(8, 16)])
    timed_outputs.write(tmp_path, {case.id: timed_outputs.timed_digests(case, launch, job, device, ["cold"])})
    result = _timed_result(deterministic=checked[0] == checked[1])
    timed_outputs.judge(tmp_path, job, [result], {case.id: checked[0]})
    return result


def test_an_honest_candidate_passes(tmp_path):
    result = _judge(tmp_path, honest)
    assert result.correct and not result.reasons


def test_half_the_work_once_timed_is_incorrect(tmp_path):
    result = _judge(tmp_path, half_after(2), checked_calls=10)  # whole while checked (2 calls), half once timed
    assert not result.correct
    assert result.reasons[0].startswith("cold timing: a call made as it is timed")
    assert "behaves differently when timed" in result.reasons[0]
    assert decide([result], ["cold"], 0.02).status == "incorrect"


def test_missing_or_failed_timed_calls_fail(tmp_path):
    job, case = _job(), _case()
    (tmp_path / timed_outputs.TIMED_DIGESTS).write_text(json.dumps({case.id: {"cold": {"error": "boom"}}}))
    result = _timed_result()
    timed_outputs.judge(tmp_path, job, [result], {case.id: "abc"})
    assert not result.correct and "raised boom" in result.reasons[0]
    (tmp_path / timed_outputs.TIMED_DIGESTS).write_text(json.dumps({}))
    result = _timed_result()
    timed_outputs.judge(tmp_path, job, [result], {case.id: "abc"})
    assert not result.correct and "no digest" in result.reasons[0]
    (tmp_path / timed_outputs.TIMED_DIGESTS).write_text("not json")
    result = _timed_result()
    timed_outputs.judge(tmp_path, job, [result], {case.id: "abc"})
    assert not result.correct and "unreadable" in result.reasons[0]


def test_a_nondeterministic_candidate_gets_a_note_not_a_failure(tmp_path):
    job, case = _job(), _case()
    timed_outputs.write(tmp_path, {case.id: {"cold": "something else"}})
    result = _timed_result(deterministic=False)
    timed_outputs.judge(tmp_path, job, [result], {case.id: "abc"})
    assert result.correct and "not deterministic" in result.notes[0]


def test_untimed_cases_are_left_alone(tmp_path):
    job, case = _job(), _case()
    timed_outputs.write(tmp_path, {})
    result = _timed_result()
    result.timings.clear()
    timed_outputs.judge(tmp_path, job, [result], {case.id: "abc"})
    assert result.correct and not result.notes
