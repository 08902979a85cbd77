"""The gate between the judge's checks and its timing, through which compute-sanitizer runs beside them.

compute-sanitizer needs the built modules and a GPU; the outputs phase needs a GPU too, but not a quiet one
(values do not depend on what else runs), while the timing phase must have the GPU to itself, and the judge's
measurements of the idle GPU (its latency, harness.timing.quiet_gpu; the performance model,
harness.environment.measured) want it idle. So `harness.worker.judge_process.verify_job` gives the judge a folder
(`Options.timing_gate`):

1. the judge writes `measured` once it has measured the idle GPU, before any candidate process of its own starts
   and while its builds still run;
2. the worker, seeing `measured`, starts the sanitizer's tools (harness.worker.sanitizer): each runs a judge of
   its own, whose builds wait for this judge's compiler through the build cache's lock and reuse its modules, so
   their start (interpreters, torch, the tools' CUDA set-up) overlaps the build and their runs the outputs phase;
   it writes `sanitized` once they end: "clean", or the reason to stop;
3. the judge waits for `sanitized` before its first timed sample: no sanitized process is alive while it
   times. When the sanitizer did not come out clean, the judge skips the timing (the worker then gives the
   verdict the sanitizer's status).

Files are written whole (tmp + rename), so a reader never sees half of one.
"""

from __future__ import annotations

import os
import time
from pathlib import Path

MEASURED = "measured"
SANITIZED = "sanitized"
CLEAN = "clean"
POLL_S = 0.05


def _write(folder: str | Path, name: str, text: str) -> None:
    path = Path(folder) / name
    tmp = path.with_suffix(".tmp")
    tmp.write_text(text)
    os.replace(tmp, path)


def mark_measured(folder: str | Path | None) -> None:
    """The judge: the idle GPU is measured, the sanitizer may start (no-op without a gate)."""
    if folder:
        _write(folder, MEASURED, "")


def measured(folder: str | Path) -> bool:
    return (Path(folder) / MEASURED).exists()


def mark_sanitized(folder: str | Path, outcome: str) -> None:
    """The worker: `CLEAN`, or "STATUS: reason" when the judge must not time ("sanitizer: memcheck: ...",
    "sanitizer_unavailable: ...")."""
    _write(folder, SANITIZED, outcome)


def wait_sanitized(folder: str | Path | None, deadline: float) -> str | None:
    """The judge, before timing: None to go on (no gate, or the sanitizer came out clean), else
    "STATUS: reason" (the verdict the judge gives instead of timing). Past `deadline` (time.monotonic())
    without an answer: "timeout: ..."."""
    if not folder:
        return None
    path = Path(folder) / SANITIZED
    while not path.exists():
        if time.monotonic() >= deadline:
            return "timeout: compute-sanitizer gave no answer before the judge's deadline"
        time.sleep(POLL_S)
    outcome = path.read_text().strip()
    return None if outcome == CLEAN else outcome
