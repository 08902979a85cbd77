"""GPU: timing that only counts checked work (harness.paired_timing, harness.timed_outputs, harness.quiet_gpu,
harness.back_to_back; docs/threat-model.md). The candidates of `TIMED_WORK` through the real worker, each
getting the status its `Expectation` names; an unchanged copy of the original timing at x1.000 within noise;
and the restore that keeps an in-place kernel off its own outputs, shown by timing one with and without it.

    python -m pytest -q -m gpu tests/adversarial -k timed_work
"""

from __future__ import annotations

import random

import pytest

torch = pytest.importorskip("torch")
if not torch.cuda.is_available():
    pytest.skip("needs a CUDA GPU", allow_module_level=True)

from rowscale_job import (  # noqa: E402
    BASE_ROOT,
    BASES,
    CANDIDATES,
    TIMED_WORK,
    assert_verdict,
    base_of,
    rowscale_case,
    rowscale_cases,
    rowscale_job,
)

from harness.building.job_requests import build_requests  # noqa: E402
from harness.building.module_loading import load_module  # noqa: E402
from harness.building.nvcc_build import build_many  # noqa: E402
from harness.judge.acceptance import VIEW_FLOOR, band_noise  # noqa: E402
from harness.judge.evaluate import build_all, default_cache_dir  # noqa: E402
from harness.judge.paired_timing import COLD_SETS, Pair, time_view  # noqa: E402
from harness.judge.timed_outputs import LaunchCheck  # noqa: E402
from harness.timing.stats import Stats, speedup  # noqa: E402
from harness.timing.timed_sets import TimedSets  # noqa: E402
from harness.timing.timing_side import TimingSide  # noqa: E402
from harness.worker.judge_process import run_job, verify_job  # noqa: E402
from harness.worker.sanitizer import sanitizer_path  # noqa: E402

pytestmark = pytest.mark.gpu
JOB_TIMEOUT_S = 300.0
SANITIZER_TIMEOUT_S = 300.0
BY_NAME = {expect.name: expect for expect in CANDIDATES}
PLAIN = [BY_NAME[name] for name in TIMED_WORK if BY_NAME[name].sanitizer_tool is None]
COPY = (BASE_ROOT / BASES["rowscale"].kernel_file).read_text() + "\n// an unchanged copy of the original\n"


def timed_work_job(name: str | None, widths=(256, 4096), **options):
    """bf16 at 1 and 1025 tokens (decode and middle; v needs more than one row), timed in both views on short
    budgets, two seeds."""
    base = base_of(name)
    cases = rowscale_cases(tokens=(1, 1025), widths=widths, dtypes=("bfloat16",), base=base)
    settings = {"seeds": [0, 1], "modes": ["graph", "cold"], "budget_ms_per_case": 20.0, "case_timeout_s": 30.0,
                **options}
    return rowscale_job(name, cases=cases, base=base, **settings)


@pytest.fixture(scope="module", autouse=True)
def prebuilt():
    """Build every module of this file up front (see test_adversarial.prebuilt)."""
    jobs = [timed_work_job(name) for name in TIMED_WORK] + [timed_work_job(None)]
    copy = timed_work_job(None)
    copy.candidate_source = COPY
    jobs.append(copy)
    unique = {(r.name, repr(sorted(r.overrides.items()))): r for job in jobs for _, _, r in build_requests(job)}
    build_many(list(unique.values()), default_cache_dir(jobs[0]))


@pytest.mark.parametrize("expect", PLAIN, ids=[e.name for e in PLAIN])
def test_timed_work_candidate(expect):
    verdict = run_job(timed_work_job(expect.name), timeout_s=JOB_TIMEOUT_S)
    assert_verdict(verdict, expect)


def test_timed_work_oob_from_128_rows_is_found_by_the_sanitizer():
    """The two smallest cases are decode ones (one row): the middle band's smallest case is run too."""
    if sanitizer_path() is None:
        pytest.skip("compute-sanitizer not found")
    expect = BY_NAME["zb_oob_from_128_rows"]
    job = timed_work_job(expect.name, widths=(256,))
    verdict = verify_job(job, timeout_s=JOB_TIMEOUT_S, sanitizer_timeout_s=SANITIZER_TIMEOUT_S, tools=("memcheck",))
    assert_verdict(verdict, expect)
    if verdict.status == "sanitizer":
        kinds = [(f["tool"], f["kind"]) for f in verdict.sanitizer["findings"]]
        assert ("memcheck", "invalid_global_read") in kinds, verdict.sanitizer


def test_timed_work_unchanged_copy_times_at_parity():
    """The original's file, built again as a candidate: correct, not faster, every band within its noise of
    x1.000 in both views (the original timed in the judge, the copy in its process), every launch verified."""
    job = timed_work_job(None, budget_ms_per_case=150.0)
    job.candidate_source, job.candidate_label = COPY, "unchanged copy"
    verdict = run_job(job, timeout_s=JOB_TIMEOUT_S)
    print(f"copy: {verdict.status}: {verdict.reason}; {verdict.band_speedups}")
    assert verdict.status == "correct" and verdict.faster is False, verdict.reason
    for mode, bands in verdict.band_speedups.items():
        noise = band_noise(verdict.cases, mode)
        for band, value in bands.items():
            assert abs(value - 1.0) <= max(0.03, noise[band]), (mode, band, value, noise[band])
    assert band_noise(verdict.cases, "cold")["all"] >= VIEW_FLOOR["cold"]  # what the cold view resolves
    for case in verdict.cases:
        for mode, timing in case.timings.items():
            assert timing.info["verified"][-1] == "the last sample", (case.id, mode, timing.info)
            if mode == "graph":  # one launch per set in a replay
                assert timing.info["input_sets"] == timing.info["launches_per_sample"], timing.info
            else:  # one launch per sample, cycling through the cold sets
                assert timing.info["launches_per_sample"] == 1 and timing.info["input_sets"] == COLD_SETS, timing.info


def _launch(path: str, entry: str):
    function = load_module(path).get_function(entry)
    return lambda args: function(*args)


def test_timed_work_restore_keeps_in_place_kernels_off_their_own_outputs(monkeypatch):
    """x_inplace_skips_own_result skips rows that hold its own result. Timed on restored sets it does all its
    work (x1.0 or a little slower, every launch verified); with the restore switched off (this test only) it is timed on its own
    outputs, skips everything and looks several times faster while its outputs go wrong."""
    name = "x_inplace_skips_own_result"
    case = rowscale_case(4096, 4096, "bfloat16", timed=True, base="rowscale_inplace")
    job = rowscale_job(name, cases=[case], budget_ms_per_case=100.0)
    paths, _, failure = build_all(job, default_cache_dir(job))
    assert failure is None, failure
    device = torch.device("cuda", torch.cuda.current_device())
    orig_launch = _launch(paths[("orig", case.variant)], job.entry)
    cand_launch = _launch(paths[("cand", case.variant)], job.entry)

    def timed(view: str):
        orig = TimingSide("orig", orig_launch, case, device)
        cand = TimingSide("cand", cand_launch, case, device)

        def make_check(seeds):
            return LaunchCheck(case, job, view, seeds, None, orig.set_args,
                               lambda indices: {i: {"x": cand.set_args(i)["x"].clone()} for i in indices})
        outcome = time_view(case, view, Pair(orig, cand), job.options, make_check, device, random.Random(3))
        assert "error" not in outcome.entry, outcome.entry
        ratio = speedup(Stats.from_dict(outcome.entry["orig"]), Stats.from_dict(outcome.entry["cand"]))
        return ratio, outcome.failures

    for view in ("graph", "cold"):  # its check of the mark costs it a little: never faster, every launch right
        ratio, failures = timed(view)
        print(f"restored {view}: x{ratio:.3f}")
        assert failures == [] and 0.7 < ratio < 1.05, (view, ratio, failures)
    monkeypatch.setattr(TimedSets, "restore", lambda self, index=None: None)
    ratio, failures = timed("graph")
    print(f"not restored graph: x{ratio:.3f}; {failures[:1]}")
    assert ratio > 1.5 and failures, (ratio, failures)
