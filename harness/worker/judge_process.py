"""One job, one judge: run `python -m harness run` in its own process group and collect its verdict.

A candidate kernel that faults, aborts or hangs must never take the caller down with it, so every job
runs in a fresh interpreter started in a new process group (`harness.worker.process_group.run_isolated`): the
JUDGE (harness.judge.evaluate), which never loads candidate code itself but runs it in a candidate process
of its own with a scrubbed environment (harness.candidate.run).

- results travel only through the verdict file the judge writes (tmp + rename); stdout and stderr
  are kept for the reason of a failure, never parsed for results;
- a random HMAC key goes to the judge on its stdin (harness.worker.judge_channel); a verdict without a valid
  signature (written by something other than the judge) becomes "crashed";
- past `timeout_s` the whole group is killed with SIGKILL (grandchildren included, unless they left
  the group with setsid) and the verdict is "timeout";
- a worker that dies by a signal, or exits non-zero without a verdict, gives "crashed" with the most
  telling line of its stderr as the reason (e.g. "CUDA error: an illegal memory access was
  encountered");
- every verdict dict gets a "worker" entry: return code, seconds, the tail of stderr.

`ASTRA_HARNESS_EVALUATE=module:function` (or `path/to/file.py:function`) in the worker's environment
replaces `harness.judge.evaluate.evaluate`; tests use it to stand in crashing or hanging evaluations.
"""

from __future__ import annotations

import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from harness.job import Job
from harness.judge.verdict import STATUSES, Verdict
from harness.worker.judge_channel import run_judge, verify
from harness.worker.process_group import (
    EVALUATE_ENV,
    ProcessOutcome,
    describe_exit,
    harness_env,
    read_json_object,
    tail,
    telling_line,
)
from harness.worker.sanitizer import DEFAULT_TOOLS, sanitize

__all__ = ["EVALUATE_ENV", "FAILURE_STATUSES", "collect_verdict", "failure_verdict", "run_job", "verify_job"]
FAILURE_STATUSES = frozenset(STATUSES) - {"correct", "timed"}
FORGED = "verdict signature invalid (the verdict file was written by something other than the judge)"


def failure_verdict(job: Job, status: str, reason: str, outcome: ProcessOutcome | None = None) -> dict:
    """A verdict dict for a worker that could not give one itself (timeout, crash, no verdict file)."""
    worker = worker_info(outcome) if outcome is not None else {}
    return Verdict(status=status, reason=reason, correct=False, faster=False, name=job.name,
                   candidate_label=job.candidate_label, worker=worker).to_dict()


def worker_info(outcome: ProcessOutcome) -> dict:
    """What a verdict records about the process that produced it."""
    return {"returncode": outcome.returncode, "seconds": round(outcome.seconds, 3),
            "stderr_tail": tail(outcome.stderr)}


def collect_verdict(job: Job, out_path: Path, outcome: ProcessOutcome, timeout_s: float,
                    key: bytes | None = None) -> dict:
    """Turn a finished worker (its verdict file, exit status, stderr) into one verdict dict.

    A verdict file written before a non-zero exit is kept, but a passing status in it becomes
    "crashed": a worker that dies after judging may have judged in a corrupted CUDA context. With
    `key`, a verdict whose signature does not verify becomes "crashed" (`FORGED`).
    """
    if outcome.timed_out:
        last = telling_line(outcome.stderr)
        reason = f"worker did not finish within {timeout_s:g} s; its process group was killed"
        return failure_verdict(job, "timeout", reason + (f" (last output: {last})" if last else ""), outcome)
    verdict = read_json_object(out_path)
    if verdict is not None and "status" not in verdict:
        verdict = None
    line = telling_line(outcome.stderr)
    exit_text = describe_exit(outcome.returncode)
    if verdict is None:
        if outcome.returncode == 0:
            reason = "worker exited with status 0 but wrote no verdict" + (f" ({line})" if line else "")
        else:
            reason = f"worker {exit_text}" + (f": {line}" if line else "")
        return failure_verdict(job, "crashed", reason, outcome)
    signed = key is None or verify(verdict, key)
    verdict.pop("signature", None)
    verdict["worker"] = worker_info(outcome)
    if outcome.returncode == 0 and not signed:
        return failure_verdict(job, "crashed", FORGED, outcome)
    if outcome.returncode != 0 and verdict.get("status") not in FAILURE_STATUSES:
        verdict.update(status="crashed", correct=False, faster=False,
                       reason=f"worker {exit_text} after writing its verdict" + (f": {line}" if line else ""))
    return verdict


def run_job(job: Job, *, timeout_s: float, python: str = sys.executable, env: dict[str, str] | None = None,
            progress: Callable[[str], None] | None = None) -> Verdict:
    """Evaluate `job` in a fresh worker process; always returns a Verdict, never raises for the job.

    `timeout_s` bounds the whole worker (build, checks, timing). `env` replaces our environment for
    the worker (the directory holding this `harness` package still goes first on PYTHONPATH).
    `progress` gets the judge's phase lines as it runs (building, judging case i/N, timing).
    """
    start = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="astra-job-") as tmp:
        outcome, out_path, key = run_judge(job.to_json(), tmp, timeout_s=timeout_s, python=python,
                                           env=harness_env(env), progress=progress)
        verdict = Verdict.from_dict(collect_verdict(job, out_path, outcome, timeout_s, key))
    if verdict.phases:  # the judge's own; the process start (imports, CUDA context) is the rest
        verdict.phases["judge_process_s"] = round(time.monotonic() - start, 3)
    return verdict


def verify_job(job: Job, *, timeout_s: float, sanitizer_timeout_s: float = 900.0,
               tools: tuple[str, ...] = DEFAULT_TOOLS, python: str = sys.executable,
               env: dict[str, str] | None = None, progress: Callable[[str], None] | None = None) -> Verdict:
    """`run_job`, then, for a "correct" verdict with `options.sanitizer`, compute-sanitizer (`tools`) over
    the candidate process on its smallest cases and the smallest of every band and build variant
    (`harness.sanitizer.sanitize`). Findings turn the verdict
    into "sanitizer"; a tool that is missing, ran out of time or could not conclude turns it into
    "sanitizer_unavailable" (fail closed: not a pass). The report is kept as the verdict's `sanitizer`.
    """
    verdict = run_job(job, timeout_s=timeout_s, python=python, env=env, progress=progress)
    if verdict.status != "correct" or not job.options.sanitizer:
        return verdict
    if progress is not None:
        progress(f"compute-sanitizer ({', '.join(tools)}) on the smallest cases of every band and variant")
    start = time.monotonic()
    report = sanitize(job, tools=tools, timeout_s=sanitizer_timeout_s, python=python, env=env)
    verdict.phases["sanitizer_s"] = round(time.monotonic() - start, 3)
    verdict.sanitizer = report
    if report["findings"]:
        first = report["findings"][0]
        more = len(report["findings"]) - 1
        verdict.status, verdict.correct, verdict.faster = "sanitizer", False, False
        verdict.reason = f"{first['tool']}: {first['message']}" + (f" (+{more} more)" if more else "")
    elif report.get("unavailable"):
        verdict.status, verdict.correct, verdict.faster = "sanitizer_unavailable", False, False
        verdict.reason = f"compute-sanitizer asked for but not conclusive: {report['unavailable']}"
    return verdict
