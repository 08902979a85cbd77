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

import copy
import os
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path

from harness.job import Job
from harness.judge import timing_gate
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


def with_build_arch(job: Job, env: dict[str, str] | None = None) -> Job:
    """`job` with nvcc's target resolved here (harness.building.toolchain.default_arch) where it names none.

    The judge starts its builds before it imports torch (harness.judge.early_build); with the target in the job,
    they start nvcc without asking the device at all. Here it costs a question to the CUDA driver, which the
    caller asked already (it checked for a GPU). A judge given other GPUs than ours (`env` with another
    CUDA_VISIBLE_DEVICES) picks its own."""
    if job.build.arch or (env is not None and env.get("CUDA_VISIBLE_DEVICES") != os.environ.get("CUDA_VISIBLE_DEVICES")):
        return job
    from harness.building.toolchain import default_arch

    resolved = copy.deepcopy(job)
    resolved.build.arch = default_arch()
    return resolved


def run_job(job: Job, *, timeout_s: float, python: str = sys.executable, env: dict[str, str] | None = None,
            progress: Callable[[str], None] | None = None) -> Verdict:
    """Evaluate `job` in a fresh worker process; always returns a Verdict, never raises for the job.

    `timeout_s` bounds the whole worker (build, checks, timing). `env` replaces our environment for
    the worker (the directory holding this `harness` package still goes first on PYTHONPATH).
    `progress` gets the judge's phase lines as it runs (building, judging case i/N, timing).
    """
    start = time.monotonic()
    job = with_build_arch(job, env)
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
    """`run_job` with, when `options.sanitizer`, compute-sanitizer (`tools`) over the candidate process on its
    smallest cases and the smallest of every band and build variant (`harness.sanitizer.sanitize`).

    The sanitizer runs beside the judge's build and outputs phase (harness.judge.timing_gate): it starts once the
    judge has measured the idle GPU (its tools' own judges then wait for the judge's builds through the build
    cache), and the judge waits for it before timing, so nothing sanitized runs while the judge times. A judge that fails the candidate first (incorrect, crashed, ...)
    cancels the sanitizer and its verdict stands. Findings turn the verdict into "sanitizer"; a tool that is
    missing, ran out of time or could not conclude turns it into "sanitizer_unavailable" (fail closed: not a
    pass), and the judge skips its timing in both cases. The report is kept as the verdict's `sanitizer`.
    """
    job = with_build_arch(job, env)  # once for the judge and the sanitizer's judges
    if not job.options.sanitizer:
        return run_job(job, timeout_s=timeout_s, python=python, env=env, progress=progress)
    box: dict = {}
    with tempfile.TemporaryDirectory(prefix="astra-gate-") as gate:
        gated = copy.deepcopy(job)
        gated.options.timing_gate = gate
        judge = threading.Thread(target=_judge_into, daemon=True, name="judge",
                                 args=(box, gated, timeout_s + sanitizer_timeout_s, python, env, progress))
        judge.start()
        while judge.is_alive() and not timing_gate.measured(gate):
            time.sleep(timing_gate.POLL_S)
        report, seconds = None, 0.0
        if timing_gate.measured(gate):
            if progress is not None:
                progress(f"compute-sanitizer ({', '.join(tools)}) on the smallest cases of every band and variant, "
                         "beside the build and the checks")
            cancel = threading.Event()
            threading.Thread(target=_cancel_unless_correct, args=(judge, box, cancel), daemon=True).start()
            start = time.monotonic()
            try:
                report = sanitize(job, tools=tools, timeout_s=sanitizer_timeout_s, python=python, env=env,
                                  cancel=cancel)
            finally:
                timing_gate.mark_sanitized(gate, _gate_outcome(report))
            seconds = time.monotonic() - start
        judge.join()
    if "error" in box:
        raise box["error"]
    verdict: Verdict = box["verdict"]
    if report is None or report.get("cancelled") or verdict.status not in _SANITIZER_DECIDES:
        return verdict
    verdict.phases["sanitizer_s"] = round(seconds, 3)
    verdict.sanitizer = report
    status, reason = _sanitized_status(report)
    if status is not None:
        verdict.status, verdict.correct, verdict.faster, verdict.reason = status, False, False, reason
    return verdict


# The verdicts the sanitizer's report may still change: a correct one, or the judge's stop at the gate.
_SANITIZER_DECIDES = frozenset({"correct", "sanitizer", "sanitizer_unavailable"})


def _judge_into(box: dict, job: Job, timeout_s: float, python: str, env, progress) -> None:
    try:
        box["verdict"] = run_job(job, timeout_s=timeout_s, python=python, env=env, progress=progress)
    except BaseException as error:  # re-raised by verify_job in its own thread
        box["error"] = error


def _cancel_unless_correct(judge: threading.Thread, box: dict, cancel: threading.Event) -> None:
    """Once the judge has ended: cancel the sanitizer if the candidate failed without it."""
    judge.join()
    verdict = box.get("verdict")
    if verdict is None or verdict.status not in _SANITIZER_DECIDES:
        cancel.set()


def _sanitized_status(report: dict | None) -> tuple[str | None, str]:
    """(status, reason) a sanitizer report gives a correct verdict: (None, "") when clean."""
    if report is None:
        return "sanitizer_unavailable", "compute-sanitizer asked for but not run"
    if report["findings"]:
        first = report["findings"][0]
        more = len(report["findings"]) - 1
        return "sanitizer", f"{first['tool']}: {first['message']}" + (f" (+{more} more)" if more else "")
    if report.get("unavailable"):
        return "sanitizer_unavailable", f"compute-sanitizer asked for but not conclusive: {report['unavailable']}"
    return None, ""


def _gate_outcome(report: dict | None) -> str:
    """What the judge reads at its timing gate (harness.judge.timing_gate)."""
    status, reason = _sanitized_status(report)
    return timing_gate.CLEAN if status is None else f"{status}: {reason}"
