"""Stand-in evaluations for the worker tests, selected with ASTRA_HARNESS_EVALUATE=<this file>:dispatch.

`dispatch(job)` behaves as `job.name` says: "succeed", "segfault", "abort", "hang" (spawns a grandchild
first), "raise", "cuda_error", "judge_out_of_memory", "exit_after_verdict", "forge" (writes a passing verdict itself and exits
0, as a candidate that reached the verdict file would), "silent_exit", "hang_under_tool" (succeeds,
but hangs when run under a sanitizer), "gated_checks", "incorrect_after_measured" (the timing gate, see each).
"succeed" follows the judge's timing gate (harness.judge.timing_gate) as the real judge does. Each records its pid (and a grandchild's) in $ASTRA_TEST_PIDFILE
when set, so tests can check that nothing survives. Under a sanitizer (the judge's private config has a
`wrap` prefix) each also runs a stand-in candidate process through that prefix, as the real judge does.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

from harness.candidate.run import candidate_prefix, watched_kernels
from harness.job import Job
from harness.judge import timing_gate
from harness.judge.verdict import Verdict
from harness.worker.judge_channel import current
from harness.worker.sanitizer import WATCHED_KERNELS


def _record(**pids: int) -> None:
    path = os.environ.get("ASTRA_TEST_PIDFILE")
    if path:
        with open(path, "w") as handle:
            json.dump({"worker": os.getpid(), "pgid": os.getpgid(0), **pids}, handle)
    if current().wrap:  # the stand-in candidate process, under the sanitizer prefix (naming the built kernels)
        subprocess.call([*candidate_prefix(built_kernels()), sys.executable, "-c", "pass"])


def built_kernels() -> list[str] | None:
    """The kernels a stand-in build reported ($FAKE_BUILT_KERNELS, JSON), as ptxas does for the real judge."""
    return json.loads(os.environ.get("FAKE_BUILT_KERNELS", "null"))


def succeed(job: Job) -> Verdict:
    _record()
    timing_gate.mark_measured(job.options.timing_gate)  # as the real judge does (harness.judge.timing_gate)
    held = timing_gate.wait_sanitized(job.options.timing_gate, time.monotonic() + 120)
    if held is not None:
        status, _, reason = held.partition(": ")
        return Verdict(status=status, reason=reason, correct=False, faster=False, name=job.name,
                       candidate_label=job.candidate_label, notes=["timing skipped"])
    kernels = watched_kernels(built_kernels())  # as the real judge reports them
    return Verdict(status="correct", reason=f"{job.name}: all fine", correct=True, faster=True, name=job.name,
                   candidate_label=job.candidate_label, band_speedups={"graph": {"decode": 1.25, "all": 1.25}},
                   notes=["from fake_evals"], phases={WATCHED_KERNELS: len(kernels)} if kernels else {})


def gated_checks(job: Job) -> Verdict:
    """Marks the gate measured, then "builds and checks" until a sanitizer tool has started (its stand-in writes
    $FAKE_TOOL_STARTED; at most 60 s), then waits at the gate; writes when each happened, and whether a tool
    started during the checks, to $ASTRA_TEST_TIMES (the judge's side of harness.judge.timing_gate)."""
    times = {"measured": time.time()}
    timing_gate.mark_measured(job.options.timing_gate)
    if current().wrap:  # the sanitizer's own judge: no gate, and its candidate under the tool
        return succeed(job)
    started = os.environ.get("FAKE_TOOL_STARTED", "")
    deadline = time.monotonic() + 60
    while started and not os.path.exists(started) and time.monotonic() < deadline:
        time.sleep(0.05)
    times["tool_started_during_checks"] = bool(started) and os.path.exists(started)
    times["checks_done"] = time.time()
    held = timing_gate.wait_sanitized(job.options.timing_gate, time.monotonic() + 120)
    times["timing_starts"] = time.time()
    with open(os.environ["ASTRA_TEST_TIMES"], "w") as handle:
        json.dump(times, handle)
    return succeed(job) if held is None else Verdict(status=held.partition(": ")[0], reason="held", correct=False,
                                                     name=job.name, candidate_label=job.candidate_label)


def incorrect_after_measured(job: Job) -> Verdict:
    """Measured, then an incorrect candidate found at once (the sanitizer, under way, must be cancelled)."""
    timing_gate.mark_measured(job.options.timing_gate)
    if current().wrap:
        time.sleep(600)  # the sanitizer's run would take ten minutes
    return Verdict(status="incorrect", reason="case c1: 3 elements differ", correct=False, faster=False,
                   name=job.name, candidate_label=job.candidate_label)


def segfault(job: Job) -> Verdict:
    _record()
    os.kill(os.getpid(), signal.SIGSEGV)
    raise AssertionError("unreachable")


def abort(job: Job) -> Verdict:
    _record()
    os.abort()


def hang(job: Job) -> Verdict:
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
    _record(grandchild=child.pid)
    sys.stderr.write("evaluating case rowscale/bfloat16/tokens=1\n")
    sys.stderr.flush()
    time.sleep(600)
    raise AssertionError("unreachable")


def raise_error(job: Job) -> Verdict:
    _record()
    raise ValueError("the fake evaluation failed: bad tolerance table")


def cuda_error(job: Job) -> Verdict:
    _record()
    raise RuntimeError("CUDA error: an illegal memory access was encountered\n"
                       "CUDA kernel errors might be asynchronously reported at some other API call")


def judge_out_of_memory(job: Job) -> Verdict:
    """The judge's own process out of GPU memory (torch's error, raised here)."""
    import torch

    _record()
    raise torch.cuda.OutOfMemoryError("CUDA out of memory. Tried to allocate 6.00 GiB. GPU 0 has a total capacity "
                                      "of 79.18 GiB of which 4.57 GiB is free. This process has 21.90 GiB in use")


def exit_after_verdict(job: Job) -> Verdict:
    """Writes its (passing) verdict itself, then dies before the worker could: must read as crashed."""
    out = sys.argv[sys.argv.index("--out") + 1]
    with open(out, "w") as handle:
        json.dump(succeed(job).to_dict(), handle)
    sys.stderr.write("terminate called after throwing an instance of 'std::runtime_error'\n")
    sys.stderr.flush()
    os._exit(3)


def forge(job: Job) -> Verdict:
    """A passing verdict written by someone without the key, then a clean exit: must read as crashed."""
    out = sys.argv[sys.argv.index("--out") + 1]
    with open(out, "w") as handle:
        json.dump(succeed(job).to_dict(), handle)
    os._exit(0)


def hang_under_tool(job: Job) -> Verdict:
    if current().wrap:
        time.sleep(600)
    return succeed(job)


def secrets(job: Job) -> Verdict:
    """Reports whether this judge got the HMAC key on stdin and none in its argv or environment."""
    key = current().key
    leaked = key is not None and (key.hex() in " ".join(sys.argv) or any(key.hex() in v for v in os.environ.values()))
    return Verdict(status="correct", reason=f"key={'yes' if key else 'no'} leaked={leaked}", correct=True,
                   name=job.name, candidate_label=job.candidate_label)


def silent_exit(job: Job) -> Verdict:
    _record()
    os._exit(0)


BEHAVIOURS = {
    "succeed": succeed, "segfault": segfault, "abort": abort, "hang": hang, "raise": raise_error,
    "cuda_error": cuda_error, "judge_out_of_memory": judge_out_of_memory, "exit_after_verdict": exit_after_verdict, "silent_exit": silent_exit,
    "forge": forge, "hang_under_tool": hang_under_tool, "secrets": secrets, "gated_checks": gated_checks,
    "incorrect_after_measured": incorrect_after_measured,
}


def dispatch(job: Job) -> Verdict:
    return BEHAVIOURS[job.name](job)
