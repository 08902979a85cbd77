"""The judge's handle on one candidate process (harness.candidate.process): start it isolated, watch it, end it.

`CandidateRun(job, phase, ...)` writes the request file, makes the candidate's own temporary directory
(its cwd, HOME and TMPDIR) and the work directory it writes results into (harness.candidate.exchange), and starts

    [wrap...] python -m harness candidate request.json --work WORK --phase PHASE

with `harness.worker.process_group.Isolated`: a new process group, a scrubbed environment (`scrub_env`: no keys,
tokens or secrets, nothing of ASTRA_ but the timing diagnostics), stdin /dev/null, SIGKILL when the
judge dies. `wrap` is the compute-sanitizer prefix when the judge runs under `harness.worker.sanitizer`
(from the judge's private config, harness.worker.judge_channel); where that tool watches the candidate's own
kernels alone, `kernels` (their mangled names, from ptxas's report of the builds) go into it
(`candidate_prefix`). Never given: the HMAC key, the judge's verdict path.
The request says whether the candidate process must sandbox itself ("sandbox": "enforce" or "off").

`modules_dir` instead of `cand_so` starts an `outputs` process before its modules are built (its start, torch and
CUDA, overlaps the build); `go(cand_so)` then hands it the built and scanned modules (harness.candidate.process).

`failure()` turns an ended or stuck process into (status, reason): "timeout" when it made no progress
in time (its group is killed), "crashed" when it died (the most telling line of its stderr).

With `link` (phase `timing`), two pipes connect the judge and the process (harness.timing.timing_link): the
process inherits its ends under the numbers its request names; `remote_side()` is the judge's handle on
the candidate's timing side, `pause()` the stop/continue of its process group (harness.timing.quiet_gpu).
"""

from __future__ import annotations

import json
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from harness.candidate.exchange import GO, wait_for, write_json_atomic
from harness.job import Job
from harness.sandbox import decide, request_mode
from harness.timing.quiet_gpu import GroupPause
from harness.timing.timing_link import RemoteSide
from harness.worker.judge_channel import current
from harness.worker.process_group import Isolated, ProcessOutcome, describe_exit, scrub_env, telling_line

MARGIN_S = 10.0  # the judge keeps this much of its own budget to write a verdict after killing a candidate
SANITIZER_SLOWDOWN = 50.0  # sanitized runs are 10-100x slower


class CandidateRun:
    """One candidate process of one phase; use as a context manager (the group is killed on exit)."""

    def __init__(self, job: Job, phase: str, *, device: str, cand_so: dict[str, str] | None, deadline: float,
                 exports: dict[str, list[str]] | None = None, trials: list[list[tuple[str, int]]] | None = None,
                 timed: list[str] | None = None, link: bool = False, python: str = sys.executable,
                 env: dict[str, str] | None = None, modules_dir: str | None = None,
                 kernels: list[str] | None = None) -> None:
        if cand_so is None and modules_dir is None:
            raise ValueError("a candidate process needs its modules, or the directory they are built in")
        self.job, self.phase, self.deadline = job, phase, deadline
        self.root = Path(tempfile.mkdtemp(prefix=f"astra-cand-{phase}-", dir=exchange_base()))
        self.home, self.work = self.root / "home", self.root / "work"
        self.control = self.root / "control"  # what the judge hands a running process: it may read, not write
        for folder in (self.home, self.work, self.control):
            folder.mkdir()
        request = {"job": json.loads(job.to_json()), "device": device, "cand_so": cand_so, "modules_dir": modules_dir,
                   "control": str(self.control),
                   "exports": exports or {}, "trials": trials or [], "timed": timed or [],
                   "sandbox": request_mode(decide(job.options.sandbox)[0])}
        child_fds: tuple[int, ...] = ()
        self.link_fds: tuple[int, int] | None = None
        if link:
            commands_read, commands_write = os.pipe()
            replies_read, replies_write = os.pipe()
            request["link"] = {"commands": commands_read, "replies": replies_write}
            child_fds, self.link_fds = (commands_read, replies_write), (commands_write, replies_read)
        config = current()
        self.wrapped = bool(config.wrap)
        # under compute-sanitizer: outputs as files, not over CUDA IPC, and digests computed on the host, so the tool
        # watches the candidate's kernels and no harness kernel of its own
        request["sanitized"] = self.wrapped
        request_path = self.root / "request.json"
        request_path.write_text(json.dumps(request))
        self.wrap_exitcode = config.wrap_exitcode
        self.watched = watched_kernels(kernels)  # the kernels its tool watches alone (None: all, or no tool)
        command = [*candidate_prefix(kernels), python, "-m", "harness", "candidate", str(request_path), "--work", str(self.work),
                   "--phase", phase]
        try:
            self.process = Isolated(command, env=scrub_env(dict(os.environ if env is None else env), self.home),
                                    cwd=self.home, logs=self.root, die_with_parent=True, pass_fds=child_fds)
        finally:
            for fd in child_fds:  # the child's ends: only the child holds them now
                os.close(fd)
        self.outcome: ProcessOutcome | None = None
        self.stalled = False
        self._pause: GroupPause | None = None
        self._remote: RemoteSide | None = None

    def __enter__(self) -> "CandidateRun":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def go(self, cand_so: dict[str, str]) -> None:
        """Send a process started before its modules were built on: their paths, once built and scanned."""
        write_json_atomic(self.control / GO, {"cand_so": cand_so})

    def alive(self) -> bool:
        return self.outcome is None and not self.process.poll()

    def remaining(self) -> float:
        return max(0.0, self.deadline - time.monotonic())

    def wait_for(self, path: Path, timeout_s: float) -> bool:
        """Wait for `path` (a result of the candidate); on no progress in time the group is killed."""
        if wait_for(path, self.alive, min(timeout_s, self.remaining())):
            return True
        if self.alive():
            self.stalled = True
            self.outcome = self.process.kill()
        return False

    def finish(self, timeout_s: float | None = None) -> ProcessOutcome:
        """Wait for the process to exit (at most `timeout_s`, or what is left of the budget)."""
        if self.outcome is None:
            limit = self.remaining() if timeout_s is None else min(timeout_s, self.remaining())
            self.outcome = self.process.finish(limit)
            self.stalled = self.outcome.timed_out
        return self.outcome

    def clean_exit(self) -> bool:
        """Whether it exited 0 (or with the sanitizer's error exit code, under the sanitizer)."""
        outcome = self.finish()
        return outcome.returncode == 0 or (self.wrapped and outcome.returncode == self.wrap_exitcode)

    def failure(self, waiting_for: str) -> tuple[str, str]:
        """(status, reason) for a candidate process that did not deliver `waiting_for`."""
        outcome = self.finish(5.0)
        line = telling_line(outcome.stderr)
        if self.stalled or outcome.timed_out:
            return "timeout", (f"candidate process ({self.phase}) gave no {waiting_for} in time; its process group "
                               f"was killed" + (f" (last output: {line})" if line else ""))
        if outcome.returncode == 0:
            return "crashed", f"candidate process ({self.phase}) exited without {waiting_for}"
        return "crashed", f"candidate process {describe_exit(outcome.returncode)}" + (f": {line}" if line else "")

    def pause(self) -> GroupPause:
        """The stop/continue of this process's group (it leads its own group)."""
        if self._pause is None:
            self._pause = GroupPause(self.process.proc.pid)
        return self._pause

    def remote_side(self, timeout_s: float) -> RemoteSide:
        """The judge's handle on the candidate's timing side (needs `link`; one per process): every command
        first resumes a stopped group and waits at most `timeout_s` (and what is left of the budget) for its
        reply."""
        if self.link_fds is None:
            raise ValueError("a candidate process started without a link")
        if self._remote is None:
            self._remote = RemoteSide(*self.link_fds, alive=self.alive, timeout_s=timeout_s,
                                      before_call=self.pause().resume, remaining=self.remaining)
        return self._remote

    def close(self) -> None:
        if self.outcome is None:
            self.outcome = self.process.kill()
        if self.link_fds is not None:
            for fd in self.link_fds:
                os.close(fd)
            self.link_fds = None
        shutil.rmtree(self.root, ignore_errors=True)


def watched_kernels(kernels: list[str] | None) -> list[str] | None:
    """The kernels the candidate process's tool is told to watch alone: `kernels` where the judge runs under a
    tool that watches the candidate's own kernels (`JudgeConfig.watch_own_kernels`) and they are known; None
    otherwise (no tool, or every kernel watched)."""
    config = current()
    return kernels if config.wrap and config.watch_own_kernels and kernels else None


def candidate_prefix(kernels: list[str] | None) -> list[str]:
    """The command prefix a candidate process starts under: the config's `wrap` (compute-sanitizer's, or
    nothing), with one kernel filter per name of `watched_kernels(kernels)`."""
    watched = watched_kernels(kernels)
    if watched is None:
        return list(current().wrap)
    from harness.worker.sanitizer import kernel_filter

    return [*current().wrap, *kernel_filter(watched)]


SHM_MIN_FREE = 8 << 30  # /dev/shm holds the exchange when it has this much room (memory, not disk)


def exchange_base() -> str | None:
    """Where candidate directories (and their raw outputs) go: /dev/shm when it is a writable tmpfs with
    room for the backlog of large cases, else the default temporary directory (disk)."""
    shm = "/dev/shm"
    try:
        stats = os.statvfs(shm)
    except OSError:
        return None
    room = stats.f_bavail * stats.f_frsize
    return shm if room >= SHM_MIN_FREE and os.access(shm, os.W_OK) else None


def judge_deadline(start: float, job: Job) -> float:
    """When the judge must stop waiting for candidates: its own budget (from the orchestrator's config)
    less a margin, else generous bounds from the job's per-case timeout."""
    config = current()
    budget = config.timeout_s
    if budget is None:
        budget = job.options.case_timeout_s * (len(job.cases) + 4) * 2
    else:
        start = config.received_at or start
    return start + max(1.0, budget - min(MARGIN_S, 0.1 * budget))


def progress_timeout(seconds: float) -> float:
    """How long the judge waits for the candidate's next result: `seconds`, times `SANITIZER_SLOWDOWN`
    when the candidate runs under compute-sanitizer (always bounded by the judge's own deadline)."""
    return seconds * (SANITIZER_SLOWDOWN if current().wrap else 1.0)
