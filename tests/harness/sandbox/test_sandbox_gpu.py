"""The OS sandbox on a GPU: the self-test with the CUDA warm-up, and a real candidate judged through the
worker (a judge process, candidate processes that close themselves in before loading it) with torch
CUDA, both timing views (CUDA graphs, events) after executable mappings are locked, compute-sanitizer
over the sandboxed candidate process, and a hostile candidate whose escapes have no effect."""

from __future__ import annotations

import pytest
import torch

if not torch.cuda.is_available():
    pytest.skip("needs a CUDA GPU", allow_module_level=True)

import harness.judge.evaluate as judge  # noqa: E402
from harness.sandbox.selftest import run_self_test  # noqa: E402
from harness.worker.judge_process import run_job, verify_job  # noqa: E402
from harness.worker.sanitizer import sanitizer_path  # noqa: E402
from tests.harness.sandbox import sandbox_job  # noqa: E402
from tests.toolchain import needs_nvcc  # noqa: E402

pytestmark = pytest.mark.gpu
CASES = [sandbox_job.case(tokens=1, timed=True), sandbox_job.case(tokens=4096, hidden=4096, timed=True),
         sandbox_job.case(tokens=3)]


@pytest.fixture(scope="module")
def toy(tmp_path_factory):
    root = tmp_path_factory.mktemp("toy_sandbox_gpu_src")
    (root / "toy.cuh").write_text(sandbox_job.KERNEL)
    return root, tmp_path_factory.mktemp("toy_sandbox_gpu_builds")


def test_the_self_test_blocks_everything_after_the_cuda_warm_up():
    result = run_self_test()
    assert result["device"] == "cuda" and result["clean_library"] == "ran", result["worker_output"]
    assert set(result["self_test"].values()) == {"blocked"}, result["self_test"]


@needs_nvcc
def test_a_real_candidate_is_judged_and_timed_inside_the_sandbox(toy):
    root, cache = toy
    job = sandbox_job.job(root, cache, sandbox_job.KERNEL.replace("256", "128"), cases=CASES, seeds=[0, 1],
                          modes=["graph", "cold"], budget_ms_per_case=30.0)
    verdict = run_job(job, timeout_s=600)
    assert verdict.status == "correct" and verdict.sandbox == "enforced", verdict.reason
    timed = [case for case in verdict.cases if case.timed]
    assert timed and all(set(case.timings) == {"graph", "cold"} for case in timed), verdict.reason


@needs_nvcc
def test_compute_sanitizer_still_checks_the_sandboxed_candidate(toy):
    if sanitizer_path() is None:
        pytest.skip("compute-sanitizer not found")
    root, cache = toy
    job = sandbox_job.job(root, cache, sandbox_job.KERNEL.replace("256", "64"), cases=CASES[:1], sanitizer=True)
    verdict = verify_job(job, timeout_s=600, sanitizer_timeout_s=600)
    assert verdict.status == "correct" and verdict.sandbox == "enforced", (verdict.reason, verdict.sanitizer)
    assert verdict.sanitizer["runs"] and not verdict.sanitizer["findings"] and not verdict.sanitizer["skipped"]


@needs_nvcc
def test_a_hostile_candidates_escapes_have_no_effect_on_the_gpu(toy, tmp_path, monkeypatch):
    monkeypatch.setattr(judge, "scan", lambda job: None)  # the sandbox alone must stop it
    monkeypatch.setattr("harness.scan.elf_scan.scan_shared_object", lambda orig, cand: None)
    root, cache = toy
    outside = tmp_path / "outside"
    outside.mkdir()
    verdict = judge.evaluate(sandbox_job.job(root, cache, sandbox_job.hostile(outside), cases=CASES[:1]))
    assert verdict.status == "correct" and verdict.sandbox == "enforced", verdict.reason
    assert list(outside.iterdir()) == []
