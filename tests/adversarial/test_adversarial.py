"""GPU half of the adversarial suite: every candidate in kernels/candidates/ goes through the real worker
(`harness.worker.judge_process.run_job`: a judge process per job, which runs the candidate only in a candidate process
of its own) and must get the status its `Expectation` names, with a reason; the sanitizer cases (f, g)
go through `verify_job` (compute-sanitizer over the candidate process) and must show the tool's finding.
(h, i, j are decided before any kernel runs; test_candidates_compile.py checks them on the CPU too; the
candidates of `TIMED_WORK` run in test_timed_work.py.)
Every file in kernels/candidates/ must have an `Expectation` (test_every_candidate_has_an_expectation)."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
if not torch.cuda.is_available():
    pytest.skip("needs a CUDA GPU", allow_module_level=True)

from rowscale_job import (  # noqa: E402
    CANDIDATES,
    TIMED_WORK,
    assert_verdict,
    base_of,
    rowscale_cases,
    rowscale_job,
)

from harness.judge.evaluate import build_all, candidate_kernels, default_cache_dir  # noqa: E402
from harness.worker.judge_process import run_job, verify_job  # noqa: E402
from harness.worker.sanitizer import DEFAULT_TOOLS, sanitize, sanitizer_path  # noqa: E402

pytestmark = pytest.mark.gpu
JOB_TIMEOUT_S = 300.0
HANG_TIMEOUT_S = 60.0
SANITIZER_TIMEOUT_S = 600.0
ISOLATION = ("k_null_write", "l_hang", "m_vectorized")  # run back to back in one test
PLAIN = [e for e in CANDIDATES if e.sanitizer_tool is None and e.name not in ISOLATION + TIMED_WORK]
SANITIZED = [e for e in CANDIDATES if e.sanitizer_tool is not None and e.name not in TIMED_WORK]
BY_NAME = {expect.name: expect for expect in CANDIDATES}


def adversarial_job(name: str | None):
    """Both dtypes, tokens 1, 1025 (past b's 1024 rows) and 4096, every width; two seeds (e needs a
    second call per shape); both timing modes on short budgets. c_side_stream is caught by the
    stream-ordered correctness check (harness.judge.correctness.call, run by the candidate process on its side),
    before any timing."""
    cases = rowscale_cases(tokens=(1, 1025, 4096), base=base_of(name))
    return rowscale_job(name, cases=cases, seeds=[0, 1], modes=["graph", "cold"], budget_ms_per_case=20.0,
                        case_timeout_s=30.0)


@pytest.fixture(scope="module", autouse=True)
def prebuilt():
    """Build the original and every candidate up front, one nvcc per core, into the content-hashed cache
    the workers read: each test then times its worker, not a serial compile (minutes saved). Failures
    here are not asserted: j must fail, and each test's worker reports its own build."""
    from harness.building.job_requests import build_requests
    from harness.building.nvcc_build import build_many
    from harness.judge.evaluate import default_cache_dir

    jobs = [adversarial_job(None)] + [adversarial_job(e.name) for e in CANDIDATES]
    jobs += [rowscale_job(None, base=base, cases=rowscale_cases(tokens=(1,), base=base)) for base in ("rowscale_inplace",)]
    unique = {(r.name, repr(sorted(r.overrides.items()))): r for job in jobs for _, _, r in build_requests(job)}
    build_many(list(unique.values()), default_cache_dir(jobs[0]))


def test_original_against_itself_is_correct():
    verdict = run_job(adversarial_job(None), timeout_s=JOB_TIMEOUT_S)
    assert verdict.status == "correct", verdict.reason
    assert verdict.env["gpu"] and verdict.band_speedups, verdict


def test_the_original_timed_unchecked_is_timed_with_floors():
    """`outputs_checked: false` (astra survey, bench --time-only): no outputs phase, the same timing phase;
    the verdict reads "timed", every timed case has both views and both floors."""
    job = adversarial_job(None)
    job.options.outputs_checked = False
    verdict = run_job(job, timeout_s=JOB_TIMEOUT_S)
    print(f"time-only: {verdict.status}: {verdict.reason}; phases {verdict.phases}")
    assert verdict.status == "timed" and "outputs not compared" in verdict.reason, verdict.reason
    timed = [c for c in verdict.cases if c.timed]
    assert timed and all(set(c.timings) == {"graph", "cold"} and c.floors["graph"]["practical_us"] for c in timed)
    assert all(c.trials == 0 and not c.checks for c in verdict.cases)
    assert verdict.phases["check_s"] < 1.0 and 0.9 < verdict.band_speedups["graph"]["all"] < 1.1


@pytest.mark.parametrize("expect", PLAIN, ids=[e.name for e in PLAIN])
def test_candidate_is_rejected(expect):
    assert_verdict(run_job(adversarial_job(expect.name), timeout_s=JOB_TIMEOUT_S), expect)


def test_a_crash_and_a_hang_do_not_touch_the_next_job():
    verdicts = [run_job(adversarial_job(name), timeout_s=HANG_TIMEOUT_S) for name in ISOLATION]
    for name, verdict in zip(ISOLATION, verdicts):
        assert_verdict(verdict, BY_NAME[name])


@pytest.mark.parametrize("expect", SANITIZED, ids=[e.name for e in SANITIZED])
def test_sanitizer_catches(expect):
    if sanitizer_path() is None:
        pytest.skip("compute-sanitizer not found")
    job = adversarial_job(expect.name)
    tools = (expect.sanitizer_tool,)
    verdict = verify_job(job, timeout_s=JOB_TIMEOUT_S, sanitizer_timeout_s=SANITIZER_TIMEOUT_S, tools=tools)
    assert_verdict(verdict, expect)
    # the judge's verdict may come first (crashed, incorrect) and cancel the sanitizer: then the tool runs here,
    # as it does beside the judge (racecheck's own judge naming the candidate's kernels from its builds)
    _, builds, failure = build_all(job, default_cache_dir(job))
    assert failure is None
    kernels = candidate_kernels(job, builds)
    assert kernels, "ptxas reported no kernel for the candidate's build"
    report = verdict.sanitizer or sanitize(job, tools=tools, timeout_s=SANITIZER_TIMEOUT_S)
    kinds = [(f["tool"], f["kind"]) for f in report["findings"]]
    assert any(tool == expect.sanitizer_tool and kind.startswith(expect.finding_kind) for tool, kind in kinds), report
    watched = {run["tool"]: run["kernels"] for run in report["runs"]}
    assert watched.get("racecheck", len(kernels)) == len(kernels)  # the filtered path, where racecheck ran


def test_legitimate_candidate_is_sanitizer_clean():
    """No false positives from torch's kernels, the original or the harness under any tool (memcheck, racecheck,
    initcheck)."""
    if sanitizer_path() is None:
        pytest.skip("compute-sanitizer not found")
    report = sanitize(adversarial_job("m_vectorized"), timeout_s=SANITIZER_TIMEOUT_S)
    assert report["ok"] and report["skipped"] is None, report
    assert [run["verdict_status"] for run in report["runs"]] == ["correct"] * len(DEFAULT_TOOLS), report


def test_every_candidate_has_an_expectation():
    from rowscale_job import CANDIDATE_DIR

    files = sorted(p.stem for p in CANDIDATE_DIR.glob("*.cuh"))
    assert sorted(BY_NAME) == files, "add an Expectation to rowscale_job.CANDIDATES for each candidate file"
