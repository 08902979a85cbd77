"""The gate between the judge's checks and its timing, through which compute-sanitizer runs beside them.

compute-sanitizer needs the built modules and a GPU; the outputs phase needs a GPU too, but not a quiet one
(values do not depend on what else runs), while the timing phase must have the GPU to itself. So
`harness.worker.judge_process.verify_job` gives the judge a folder (`Options.timing_gate`):

1. the judge writes `built` once the modules are built and the idle GPU's latency is measured
   (`harness.timing.quiet_gpu`), then goes on with its outputs phase; the file names the kernels the
   candidate's modules hold (ptxas's report of their builds), which the sanitizer then watches;
2. the worker, seeing `built`, runs the sanitizer's tools (harness.worker.sanitizer) over the built modules,
   at the same time as that outputs phase, and writes `sanitized`: "clean", or the reason to stop;
3. the judge waits for `sanitized` before its first timed sample: no sanitized process is alive while it
   times. When the sanitizer did not come out clean, the judge skips the timing (the worker then gives the
   verdict the sanitizer's status).

Files are written whole (tmp + rename), so a reader never sees half of one.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

BUILT = "built"
SANITIZED = "sanitized"
CLEAN = "clean"
POLL_S = 0.05


def _write(folder: str | Path, name: str, text: str) -> None:
    path = Path(folder) / name
    tmp = path.with_suffix(".tmp")
    tmp.write_text(text)
    os.replace(tmp, path)


def mark_built(folder: str | Path | None, kernels: list[str] | None = None) -> None:
    """The judge: its modules are built and the idle GPU measured (no-op without a gate). `kernels`: the
    mangled names of every kernel the candidate process's modules hold; None where they are not known."""
    if folder:
        _write(folder, BUILT, json.dumps({"kernels": kernels}))


def built_kernels(folder: str | Path) -> list[str] | None:
    """The kernels `mark_built` named (None: not known, or an older judge's empty file)."""
    text = (Path(folder) / BUILT).read_text().strip()
    kernels = json.loads(text).get("kernels") if text else None
    return [str(name) for name in kernels] if kernels else None


def mark_sanitized(folder: str | Path, outcome: str) -> None:
    """The worker: `CLEAN`, or "STATUS: reason" when the judge must not time ("sanitizer: memcheck: ...",
    "sanitizer_unavailable: ...")."""
    _write(folder, SANITIZED, outcome)


def built(folder: str | Path) -> bool:
    return (Path(folder) / BUILT).exists()


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
