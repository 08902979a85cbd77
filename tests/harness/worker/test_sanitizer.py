"""harness.worker.sanitizer on the CPU: log parsing, the small job, a missing tool, and the whole run against a
stand-in `compute-sanitizer` that replays canned logs around the candidate command the judge starts
(the stand-in judges of fake_evals.py run a stand-in candidate through the judge's sanitizer prefix)."""

from __future__ import annotations

import io
import json
import os
import stat
import sys
import time
from pathlib import Path

import pytest

from harness.candidate.run import candidate_prefix
from harness.job import ArgSpec, BuildBase, Case, Job, Options
from harness.judge.evaluate import candidate_kernels
from harness.worker.judge_channel import JudgeConfig, current, encode_config, read_config
from harness.worker.judge_process import EVALUATE_ENV, verify_job
from harness.worker.sanitizer import (
    WATCHED_ONLY,
    classify,
    kernel_filter,
    parse_report,
    sanitize,
    sanitizer_prefix,
    small_job,
)

FAKE_EVALS = Path(__file__).with_name("fake_evals.py")

MEMCHECK_LOG = """\
========= COMPUTE-SANITIZER
========= Invalid __global__ read of size 2 bytes
=========     at void rowscale::rowscale_kernel<__nv_bfloat16>(const T1 *, const T1 *, T1 *, long)+0x1c0
=========     by thread (255,0,0) in block (0,0,0)
=========     Address 0x7f3a5c000200 is out of bounds
=========     and is 1 bytes after the nearest allocation at 0x7f3a5c000000 of size 512 bytes
=========     Saved host backtrace up to driver entry point at kernel launch time
=========         Host Frame: [0x2f8e1] in libcuda.so.1
=========
========= ERROR SUMMARY: 1 error
"""

RACECHECK_LOG = """\
========= COMPUTE-SANITIZER
========= Error: Race reported between Write access at void rowscale::rowscale_kernel<float>(const T1 *, const T1 *, T1 *, long)+0x90
=========     and Read access at void rowscale::rowscale_kernel<float>(const T1 *, const T1 *, T1 *, long)+0xb0 [248 hazards]
=========
========= Warning: Race reported between Read access at void other_kernel()+0x10
=========     and Write access at void other_kernel()+0x20 [2 hazards]
=========
========= RACECHECK SUMMARY: 2 hazards displayed (1 error, 1 warning)
"""

CLEAN_LOG = "========= COMPUTE-SANITIZER\n========= ERROR SUMMARY: 0 errors\n"

INITCHECK_LOG = """\
========= COMPUTE-SANITIZER
========= Uninitialized __global__ memory read of size 4 bytes
=========     at void rowscale::rowscale_kernel<float>(const T1 *, const T1 *, T1 *, long)+0x80
=========     by thread (0,0,0) in block (0,0,0)
=========
========= ERROR SUMMARY: 1 error
"""

# A stand-in compute-sanitizer: takes the real options, runs the command, writes a canned log.
FAKE_TOOL = """#!{python}
import json, os, subprocess, sys, time
start = time.time()
if os.environ.get("FAKE_TOOL_STARTED"):
    open(os.environ["FAKE_TOOL_STARTED"], "a").close()
if os.environ.get("FAKE_TOOL_ARGV"):
    with open(os.environ["FAKE_TOOL_ARGV"], "a") as handle:
        handle.write(json.dumps(sys.argv[1:]) + "\\n")
args = sys.argv[1:]
opts = {{}}
while args and args[0].startswith("--"):
    opts[args[0]] = args[1]
    args = args[2:]
rc = subprocess.call(args)
log = open(os.environ["FAKE_LOG_DIR"] + "/" + opts["--tool"] + ".log").read()
open(opts["--log-file"], "w").write(log)
found = "Invalid" in log or "Error:" in log
time.sleep(float(os.environ.get("FAKE_TOOL_SECONDS", "0")))
if os.environ.get("FAKE_TOOL_TIMES"):
    with open(os.environ["FAKE_TOOL_TIMES"], "a") as handle:
        handle.write(f"{{start}} {{time.time()}}\\n")
sys.exit(int(opts["--error-exitcode"]) if found else rc)
"""


def test_parse_memcheck():
    (finding,) = parse_report(MEMCHECK_LOG, "memcheck")
    assert finding["kind"] == "invalid_global_read" and finding["tool"] == "memcheck"
    assert finding["kernel"] == "void rowscale::rowscale_kernel<__nv_bfloat16>(const T1 *, const T1 *, T1 *, long)"
    assert "by thread (255,0,0)" in finding["message"] and "out of bounds" in finding["message"]
    assert "Host Frame" not in finding["message"]


def test_parse_racecheck_separates_warnings():
    findings = parse_report(RACECHECK_LOG, "racecheck")
    assert [f["kind"] for f in findings] == ["race", "race_warning"]
    assert "[248 hazards]" in findings[0]["message"]


def test_parse_clean_and_noise():
    assert parse_report(CLEAN_LOG, "memcheck") == []
    assert parse_report("no prefix here\nInvalid __global__ read\n", "memcheck") == []


@pytest.mark.parametrize("header, kind", [
    ("Invalid __shared__ write of size 4 bytes", "invalid_shared_write"),
    ("Invalid __local__ read of size 8 bytes", "invalid_local_read"),
    ("Error: Race reported between Write access at k()+0x10", "race"),
    ("ERROR: Potential RAW hazard detected at __shared__ 0x0 in block (0,0,0) :", "race"),
    ("Uninitialized __global__ memory read of size 4 bytes", "uninitialized_read"),
    ("Barrier error detected. Divergent thread(s) in warp", "barrier"),
    ("Error: Target application returned an error", "target_error"),
    ("Note: something informative", "note"),
    ("Something nobody has seen before", "other"),
])
def test_classify(header, kind):
    assert classify(header) == kind


def sized_case(index: int, nbytes: int) -> Case:
    return Case(id=f"c{index}", band="decode", label="t", dtype="float32", dims={"n": index}, variant="v",
                bytes=nbytes, args=[ArgSpec(name="x", kind="tensor", shape=[nbytes // 4])])  # float32: allocates its bytes


def tiny_job(name: str = "succeed", **options) -> Job:
    return Job(name=name, entry="f", kernel_file="k.cuh",
               build=BuildBase(source_root="/nonexistent", include_dirs=[], cuda_files=[]), variants={},
               cases=[sized_case(i, b) for i, b in enumerate([500, 100, 300, 100])], tolerance={},
               options=Options(**options))


def test_small_job_keeps_the_smallest_cases_one_seed_no_timing():
    job = tiny_job(seeds=[4, 5, 6], sanitizer_max_cases=2)
    small = small_job(job)
    assert [c.id for c in small.cases] == ["c1", "c3"]
    assert small.options.seeds == [4] and small.options.modes == [] and small.options.sanitizer is False
    assert len(job.cases) == 4 and job.options.modes == ["graph", "cold"]  # the original is untouched
    assert small.options.extra_trials is True  # small cases keep the large/small/extreme trials


def test_small_job_covers_every_band_and_variant():
    """The smallest cases, then the smallest of each band and of each build variant they leave out: an access
    that only a larger shape makes (an out-of-bounds read from 128 rows on) still runs under the tools."""
    job = tiny_job(sanitizer_max_cases=1)
    job.cases += [sized_case(4, 4000), sized_case(5, 8000), sized_case(6, 9000), sized_case(7, 200)]
    job.cases[4].band, job.cases[5].band = "middle", "prefill"
    job.cases[6].band = "middle"
    job.cases[7].variant = "fp32"
    assert [c.id for c in small_job(job).cases] == ["c1", "c7", "c4", "c5"]
    assert [c.id for c in small_job(tiny_job(sanitizer_max_cases=2)).cases] == ["c1", "c3"]  # one band, one variant


def test_small_job_of_large_cases_drops_the_extra_trials():
    """Sized by what a case allocates, not by the traffic its spec counts (a large pool read at few rows)."""
    from harness.worker.sanitizer import TRIALS_MAX_BYTES, footprint

    job = tiny_job(sanitizer_max_cases=2)
    for case in job.cases:
        case.args[0].shape = [TRIALS_MAX_BYTES // 4 + 1]  # float32: just over the limit; bytes stay small
    assert footprint(job.cases[0]) > TRIALS_MAX_BYTES > job.cases[0].bytes
    small = small_job(job)
    assert small.options.extra_trials is False and small.options.seeds == job.options.seeds[:1]
    assert job.options.extra_trials is True
    assert small_job(tiny_job(extra_trials=False)).options.extra_trials is False  # never turned back on


def test_missing_tool_is_skipped(monkeypatch, tmp_path):
    monkeypatch.setenv("PATH", str(tmp_path))
    monkeypatch.setenv("CUDA_HOME", str(tmp_path))
    report = sanitize(tiny_job())
    assert report["ok"] is True and report["findings"] == []
    assert "compute-sanitizer not found" in report["skipped"] and report["unavailable"] == report["skipped"]


def test_missing_tool_fails_closed(monkeypatch, tmp_path):
    monkeypatch.setenv("PATH", str(tmp_path))
    monkeypatch.setenv("CUDA_HOME", str(tmp_path))
    monkeypatch.setenv(EVALUATE_ENV, f"{FAKE_EVALS}:dispatch")
    verdict = verify_job(tiny_job(), timeout_s=60)
    assert verdict.status == "sanitizer_unavailable" and verdict.correct is False and verdict.faster is False
    assert "compute-sanitizer not found" in verdict.reason


@pytest.fixture
def fake_tool(tmp_path, monkeypatch) -> Path:
    """A stand-in compute-sanitizer first on PATH; logs are read from tmp_path/logs/<tool>.log."""
    bin_dir, logs = tmp_path / "bin", tmp_path / "logs"
    bin_dir.mkdir()
    logs.mkdir()
    tool = bin_dir / "compute-sanitizer"
    tool.write_text(FAKE_TOOL.format(python=sys.executable))
    tool.chmod(tool.stat().st_mode | stat.S_IEXEC)
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.setenv("FAKE_LOG_DIR", str(logs))
    monkeypatch.setenv(EVALUATE_ENV, f"{FAKE_EVALS}:dispatch")
    return logs


def test_sanitize_reports_findings(fake_tool):
    (fake_tool / "memcheck.log").write_text(MEMCHECK_LOG)
    (fake_tool / "racecheck.log").write_text(RACECHECK_LOG)
    (fake_tool / "initcheck.log").write_text(INITCHECK_LOG)
    report = sanitize(tiny_job(), timeout_s=60)
    assert report["ok"] is False and report["skipped"] is None
    assert [(f["tool"], f["kind"]) for f in report["findings"]] == [("memcheck", "invalid_global_read"),
                                                                    ("racecheck", "race"),
                                                                    ("initcheck", "uninitialized_read")]
    memcheck, racecheck, _ = report["runs"]
    assert memcheck["returncode"] == 0 and memcheck["errors"] == 1  # the judge's exit; the candidate's was 99
    assert memcheck["verdict_status"] == "correct"  # the worker under the tool still gave its verdict
    assert [w["kind"] for w in racecheck["warnings"]] == ["race_warning"]


def test_sanitize_clean(fake_tool):
    for tool in ("memcheck", "racecheck", "initcheck"):
        (fake_tool / f"{tool}.log").write_text(CLEAN_LOG)
    report = sanitize(tiny_job(), timeout_s=60)
    assert report == {**report, "ok": True, "findings": [], "skipped": None}
    assert [run["returncode"] for run in report["runs"]] == [0, 0, 0]


def test_sanitize_timeout_is_inconclusive(fake_tool):
    (fake_tool / "memcheck.log").write_text(CLEAN_LOG)
    report = sanitize(tiny_job("hang"), tools=("memcheck",), timeout_s=3)
    assert report["ok"] is True and "memcheck did not finish within 3 s" in report["skipped"]
    assert report["unavailable"]


def test_sanitizer_timeout_fails_closed(fake_tool):
    (fake_tool / "memcheck.log").write_text(CLEAN_LOG)
    verdict = verify_job(tiny_job("hang_under_tool"), timeout_s=60, sanitizer_timeout_s=3, tools=("memcheck",))
    assert verdict.status == "sanitizer_unavailable" and not verdict.correct
    assert "did not finish within 3 s" in verdict.reason


def test_verify_job_turns_findings_into_a_sanitizer_verdict(fake_tool):
    (fake_tool / "memcheck.log").write_text(MEMCHECK_LOG)
    (fake_tool / "racecheck.log").write_text(CLEAN_LOG)
    (fake_tool / "initcheck.log").write_text(CLEAN_LOG)
    verdict = verify_job(tiny_job(), timeout_s=60, sanitizer_timeout_s=60)
    assert verdict.status == "sanitizer" and verdict.correct is False
    assert verdict.reason.startswith("memcheck: Invalid __global__ read of size 2 bytes")
    assert verdict.sanitizer["findings"][0]["kind"] == "invalid_global_read"


def test_verify_job_skips_the_sanitizer_when_disabled_or_failing(fake_tool):
    (fake_tool / "memcheck.log").write_text(MEMCHECK_LOG)
    (fake_tool / "racecheck.log").write_text(MEMCHECK_LOG)
    (fake_tool / "initcheck.log").write_text(MEMCHECK_LOG)
    assert verify_job(tiny_job(sanitizer=False), timeout_s=60).status == "correct"
    assert verify_job(tiny_job("raise"), timeout_s=60).status == "crashed"


def test_worker_failing_under_the_tool_is_inconclusive_not_a_finding(fake_tool):
    (fake_tool / "memcheck.log").write_text(CLEAN_LOG + "========= Error: Target application returned an error\n")
    report = sanitize(tiny_job("raise"), tools=("memcheck",), timeout_s=60)
    assert report["ok"] is True and report["findings"] == []
    assert "memcheck: the worker failed under the tool" in report["skipped"]
    assert "ValueError" in report["skipped"]
    assert [w["kind"] for w in report["runs"][0]["warnings"]] == ["target_error"]


def test_a_judge_out_of_memory_under_the_tool_is_inconclusive(fake_tool):
    """The judge under the tool out of GPU memory (beside the candidate's process, the other tools' and the
    main judge's) may never have run the candidate's kernels: no finding proves nothing."""
    (fake_tool / "memcheck.log").write_text(CLEAN_LOG)
    report = sanitize(tiny_job("judge_out_of_memory"), tools=("memcheck",), timeout_s=60)
    assert report["findings"] == [] and report["runs"][0]["verdict_status"] == "environment_error"
    assert "memcheck: the worker failed under the tool" in report["skipped"]
    assert "ran out of GPU memory" in report["skipped"]


def test_the_sanitizer_runs_beside_the_checks_and_before_the_timing(fake_tool, tmp_path, monkeypatch):
    """Each tool starts once the judge has measured the idle GPU (harness.judge.timing_gate), while the judge still
    builds and checks outputs, and every tool has ended before the judge's first timed sample."""
    for tool in ("memcheck", "racecheck", "initcheck"):
        (fake_tool / f"{tool}.log").write_text(CLEAN_LOG)
    monkeypatch.setenv("ASTRA_TEST_TIMES", str(tmp_path / "judge.json"))
    monkeypatch.setenv("FAKE_TOOL_TIMES", str(tmp_path / "tools.txt"))
    monkeypatch.setenv("FAKE_TOOL_SECONDS", "0.5")
    monkeypatch.setenv("FAKE_TOOL_STARTED", str(tmp_path / "a-tool-started"))
    verdict = verify_job(tiny_job("gated_checks"), timeout_s=120, sanitizer_timeout_s=120)
    assert verdict.status == "correct" and verdict.sanitizer["ok"] is True
    assert len(verdict.sanitizer["runs"]) == 3
    judge = json.loads((tmp_path / "judge.json").read_text())
    tools = [tuple(map(float, line.split())) for line in (tmp_path / "tools.txt").read_text().splitlines()]
    assert len(tools) == 3
    assert judge["tool_started_during_checks"] is True  # beside the checks
    assert all(judge["measured"] <= start for start, _ in tools)  # once the idle GPU was measured
    assert all(end <= judge["timing_starts"] for _, end in tools)  # never beside the timing
    assert verdict.phases["sanitizer_s"] > 0


def test_a_judge_that_fails_first_cancels_the_sanitizer(fake_tool):
    """An incorrect candidate is reported as soon as the judge knows; the sanitizer's runs are killed."""
    (fake_tool / "memcheck.log").write_text(CLEAN_LOG)
    start = time.monotonic()
    verdict = verify_job(tiny_job("incorrect_after_measured"), timeout_s=60, sanitizer_timeout_s=300,
                         tools=("memcheck",))
    assert verdict.status == "incorrect" and verdict.reason == "case c1: 3 elements differ"
    assert not verdict.sanitizer  # a cancelled report proves nothing and is not kept
    assert time.monotonic() - start < 60  # not the 300 s the sanitizer's hanging run was allowed


def test_findings_stop_the_judge_at_the_gate(fake_tool, tmp_path, monkeypatch):
    """With a finding, the judge never times: it reads the sanitizer's status at the gate."""
    (fake_tool / "memcheck.log").write_text(MEMCHECK_LOG)
    monkeypatch.setenv("ASTRA_TEST_TIMES", str(tmp_path / "judge.json"))
    verdict = verify_job(tiny_job("gated_checks"), timeout_s=60, sanitizer_timeout_s=60, tools=("memcheck",))
    assert verdict.status == "sanitizer" and verdict.reason.startswith("memcheck: Invalid __global__ read")
    assert verdict.correct is False and verdict.faster is False


KERNELS = ["_ZN8rowscale15rowscale_kernelIfEEvPKT_S3_PS1_l", "_ZN8rowscale11tail_kernelEv"]


def test_racecheck_alone_watches_the_candidates_kernels_alone(tmp_path):
    log = tmp_path / "log"
    filters = kernel_filter(KERNELS)
    assert [filters[i + 1] for i, word in enumerate(filters) if word == "--kernel-name"] == [f"kne={k}" for k in KERNELS]
    for tool in ("racecheck", "memcheck", "initcheck"):  # the names come from the tool's judge, once built
        assert "--kernel-name" not in sanitizer_prefix("cs", tool, log)
    assert WATCHED_ONLY == ("racecheck",)  # memcheck: run-time loaded code counts; initcheck: what torch writes


def test_a_judge_names_its_candidates_kernels_only_under_a_filtering_tool():
    wrap = ["cs", "--tool", "racecheck"]
    for config, kernels, expected in (
            (JudgeConfig(wrap=wrap, watch_own_kernels=True), KERNELS, [*wrap, *kernel_filter(KERNELS)]),
            (JudgeConfig(wrap=wrap, watch_own_kernels=True), None, wrap),  # not reported: every kernel
            (JudgeConfig(wrap=wrap, watch_own_kernels=False), KERNELS, wrap),  # memcheck, initcheck
            (JudgeConfig(), KERNELS, [])):  # no sanitizer
        config.key = b"k"
        read_config(io.StringIO(encode_config(config.key, 60.0, config.wrap, 99, config.watch_own_kernels).decode()))
        assert current().watch_own_kernels is config.watch_own_kernels
        assert candidate_prefix(kernels) == expected
    read_config(io.StringIO(""))


def test_candidate_kernels_come_from_the_candidates_builds():
    def build(side, *names):
        return {"side": side, "resources": [{"mangled": name} for name in names]}

    job = tiny_job()
    job.candidate_source = "// a candidate"
    builds = [build("orig", "_Z4origv"), build("cand", KERNELS[1]), build("cand", KERNELS[0], KERNELS[1])]
    assert candidate_kernels(job, builds) == sorted(KERNELS)
    assert candidate_kernels(job, [*builds, build("cand")]) is None  # a build that reported none: all watched
    job.candidate_source = None  # a self-check: the candidate process runs the original's modules
    assert candidate_kernels(job, builds) == ["_Z4origv"]


def test_the_sanitizer_gets_the_kernels_the_judge_built(fake_tool, tmp_path, monkeypatch):
    """racecheck's own judge names the kernels its build reported in the prefix its candidate process starts under;
    the other tools watch every kernel."""
    for tool in ("memcheck", "racecheck", "initcheck"):
        (fake_tool / f"{tool}.log").write_text(CLEAN_LOG)
    monkeypatch.setenv("FAKE_TOOL_ARGV", str(tmp_path / "argv.jsonl"))
    monkeypatch.setenv("FAKE_BUILT_KERNELS", json.dumps(KERNELS))
    monkeypatch.setenv("ASTRA_TEST_TIMES", str(tmp_path / "judge.json"))
    verdict = verify_job(tiny_job("gated_checks"), timeout_s=120, sanitizer_timeout_s=120)
    assert verdict.status == "correct"
    assert {run["tool"]: run["kernels"] for run in verdict.sanitizer["runs"]} == {
        "memcheck": "all", "racecheck": 2, "initcheck": "all"}
    argvs = [json.loads(line) for line in (tmp_path / "argv.jsonl").read_text().splitlines()]
    filters = {argv[argv.index("--tool") + 1]: [argv[i + 1] for i, word in enumerate(argv) if word == "--kernel-name"]
               for argv in argvs}
    assert filters == {"memcheck": [], "racecheck": [f"kne={k}" for k in KERNELS], "initcheck": []}
