"""Keeping the candidate out of the original's samples: its process group stopped, the GPU checked quiet.

The judge times the original in its own process between the candidate process's samples
(harness.paired_timing). Before each of the original's turns:

1. the candidate process has synchronised its device (harness.timing_side: cudaDeviceSynchronize covers
   every stream of its context, private ones included) and replied;
2. `GroupPause.stop` sends SIGSTOP to its process group and waits until the process is reported stopped
   (waitid WSTOPPED, without reaping: the group stop completes only once every thread has stopped), so no
   host thread of the candidate can launch, copy or spin the CPU while the original samples;
3. `QuietGpu.wait` checks that no other context keeps the GPU busy: an empty kernel launched and
   synchronised from the judge must come back within `bound_us` (a few times its latency on the idle
   device, measured before the candidate process started) `QUIET_STREAK` times in a row. Work that a
   stopped process left on the GPU (a kernel queued by a thread after the synchronisation, a kernel that
   spins) holds the GPU: contexts are time-sliced, so the empty kernel waits for a slice. Such work is
   waited out; work that keeps the GPU busy past `QUIET_LIMIT_S` raises `Interference` (the verdict
   `interferes`: the candidate cannot be timed fairly).

`GroupPause.resume` sends SIGCONT before the candidate's next command. The group is the candidate process's
own (harness.process.Isolated starts it in a new session); a process that left the group is the sandbox's
concern, and whatever GPU work it runs still shows in the quiet check.
"""

from __future__ import annotations

import math
import os
import signal
import time

import torch

STOP_TIMEOUT_S = 10.0  # a candidate process that does not stop in this time is treated as gone
SPIN_S = 0.005  # polled without sleeping for this long after SIGSTOP, then every 100 us
QUIET_LIMIT_S = 0.2  # GPU work of another context past this keeps the GPU busy: `interferes`
QUIET_STREAK = 3
QUIET_FACTOR = 4.0
QUIET_MARGIN_US = 50.0
QUIET_CAP_US = 1000.0
BASELINE_PROBES = 30


class Interference(RuntimeError):
    """GPU work of another context kept the device busy while the candidate process was stopped."""


class ProcessGone(RuntimeError):
    """The candidate process ended (or never stopped) while the coordinator held it."""


class GroupPause:
    """SIGSTOP/SIGCONT of the candidate's process group (`pid` leads it: its group id is its pid)."""

    def __init__(self, pid: int, pgid: int | None = None) -> None:
        self.pid, self.pgid = pid, pgid if pgid is not None else pid
        self.stopped = False

    def stop(self, timeout_s: float = STOP_TIMEOUT_S) -> None:
        """Stop the group and wait until its leader is reported stopped (every thread of it)."""
        try:
            os.killpg(self.pgid, signal.SIGSTOP)
        except ProcessLookupError as error:
            raise ProcessGone("the candidate process is gone") from error
        self.stopped = True
        started = time.monotonic()
        deadline = started + timeout_s
        while True:
            try:
                info = os.waitid(os.P_PID, self.pid, os.WSTOPPED | os.WEXITED | os.WNOWAIT | os.WNOHANG)
            except ChildProcessError as error:
                raise ProcessGone("the candidate process is gone") from error
            if info is not None:
                if info.si_code == os.CLD_STOPPED:
                    return
                raise ProcessGone("the candidate process ended")  # left for its owner to reap
            now = time.monotonic()
            if now > deadline:
                raise ProcessGone(f"the candidate process did not stop within {timeout_s:g} s")
            if now - started < SPIN_S:
                os.sched_yield()  # a group stops within tens of microseconds: a sleep would add its granularity
            else:
                time.sleep(0.0001)

    def resume(self) -> None:
        if not self.stopped:
            return
        self.stopped = False
        try:
            os.killpg(self.pgid, signal.SIGCONT)
        except ProcessLookupError:
            return  # gone: the next command finds out


class QuietGpu:
    """The idle GPU's empty-kernel latency (measured at construction: construct it while no candidate runs)
    and the check that the GPU is that idle again (see the module docstring)."""

    def __init__(self, device: torch.device | str, probes: int = BASELINE_PROBES) -> None:
        self.device = torch.device(device)
        self.probe_us()  # the first launch loads the kernel
        self.baseline_us = math.inf
        self.refine(probes)
        self.waited_s = 0.0  # over every wait so far
        self.longest_s = 0.0

    def refine(self, probes: int = BASELINE_PROBES) -> None:
        """Measure the idle latency again and keep the lower baseline (so the tighter bound): a host busy
        compiling, say, slows the first measurement. Call it only while no candidate process has GPU work."""
        self.baseline_us = min(self.baseline_us, min(self.probe_us() for _ in range(probes)))
        self.bound_us = min(QUIET_CAP_US, max(QUIET_FACTOR * self.baseline_us, self.baseline_us + QUIET_MARGIN_US))

    def probe_us(self) -> float:
        """Host microseconds for an empty kernel to be launched and come back."""
        stream = torch.cuda.current_stream(self.device)
        start = time.perf_counter()
        _empty_kernel(self.device)
        stream.synchronize()
        return (time.perf_counter() - start) * 1e6

    def wait(self, limit_s: float = QUIET_LIMIT_S) -> float:
        """Return once `QUIET_STREAK` probes in a row came back within `bound_us` (seconds waited); raise
        `Interference` when the GPU stays busy past `limit_s`."""
        start = time.monotonic()
        streak, slowest = 0, 0.0
        while streak < QUIET_STREAK:
            latency = self.probe_us()
            streak = streak + 1 if latency <= self.bound_us else 0
            slowest = max(slowest, latency)
            waited = time.monotonic() - start
            if streak < QUIET_STREAK and waited > limit_s:
                raise Interference(f"the GPU stayed busy {waited * 1000:.0f} ms after the candidate process was "
                                   f"stopped and its device synchronised (an empty kernel took up to {slowest:.0f} us, "
                                   f"{self.baseline_us:.0f} us when idle): work of the candidate ran into the "
                                   "original's timing")
        waited = time.monotonic() - start
        self.waited_s += waited
        self.longest_s = max(self.longest_s, waited)
        return waited


def _empty_kernel(device: torch.device) -> None:
    sleep = getattr(torch.cuda, "_sleep", None)
    if sleep is not None:
        sleep(0)
    else:
        torch.zeros(1, device=device).add_(1.0)
