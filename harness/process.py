"""Running a harness command in its own process group, and reading what it left behind.

Shared by `harness.worker` (one job per process) and `harness.sanitizer` (the same under
compute-sanitizer). Output goes to files, never pipes: a hung grandchild holding a pipe open
cannot block us, and results never come from stdout (the verdict file is the only channel).
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

EVALUATE_ENV = "ASTRA_HARNESS_EVALUATE"  # module:function or file.py:function replacing evaluate (tests)
REASON_MAX_CHARS = 400
TAIL_LINES = 30
PACKAGE_PARENT = str(Path(__file__).resolve().parent.parent)

# Most telling first: a CUDA error beats a Python exception line, which beats the last line.
_CUDA_ERROR = re.compile(r"CUDA error: .*")
_TELLING = (
    _CUDA_ERROR,
    re.compile(r"(an illegal memory access|unspecified launch failure|misaligned address|device-side assert"
               r"|out of memory|illegal instruction|CUDA driver)", re.I),
    re.compile(r"^Fatal Python error: "),
    re.compile(r"^(\w+\.)*\w*(Error|Exception|Interrupt|Exit|Failure)\b"),
    re.compile(r"^terminate called |^Aborted|^Segmentation fault"),
)


@dataclass
class ProcessOutcome:
    """How one process ended. `returncode` is None when it was killed for its timeout."""

    returncode: int | None
    seconds: float
    stdout: str
    stderr: str

    @property
    def timed_out(self) -> bool:
        return self.returncode is None


def harness_env(env: dict[str, str] | None = None) -> dict[str, str]:
    """`env` (default: ours) with the directory holding this `harness` package first on PYTHONPATH."""
    merged = dict(os.environ if env is None else env)
    parts = [p for p in merged.get("PYTHONPATH", "").split(os.pathsep) if p]
    if PACKAGE_PARENT not in parts:
        merged["PYTHONPATH"] = os.pathsep.join([PACKAGE_PARENT, *parts])
    merged.setdefault("PYTHONUNBUFFERED", "1")
    return merged


def kill_group(pgid: int) -> None:
    """SIGKILL every process left in group `pgid`; a group that is already empty is fine."""
    try:
        os.killpg(pgid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        return  # empty, or the id now names a group we do not own: nothing of ours is left in it


def run_isolated(command: list[str], *, timeout_s: float, env: dict[str, str], cwd: str | Path) -> ProcessOutcome:
    """Run `command` in a new process group, stdout/stderr to `cwd`/{stdout,stderr}.log.

    On timeout the group gets SIGKILL at once (a process stuck in a CUDA call ignores SIGTERM).
    Whatever the end, the group is killed afterwards so no grandchild outlives the command.
    """
    cwd = Path(cwd)
    start = time.monotonic()
    with open(cwd / "stdout.log", "wb") as out, open(cwd / "stderr.log", "wb") as err:
        proc = subprocess.Popen(command, cwd=cwd, env=env, stdin=subprocess.DEVNULL, stdout=out, stderr=err,
                                start_new_session=True)
        try:
            returncode: int | None = proc.wait(timeout=max(timeout_s, 0.001))
        except subprocess.TimeoutExpired:
            returncode = None
        finally:
            kill_group(proc.pid)
            proc.wait()
    seconds = time.monotonic() - start
    return ProcessOutcome(returncode, seconds, read_text(cwd / "stdout.log"), read_text(cwd / "stderr.log"))


def read_text(path: Path) -> str:
    """A file's text with undecodable bytes replaced ("" when it does not exist)."""
    try:
        return Path(path).read_bytes().decode("utf-8", errors="replace")
    except FileNotFoundError:
        return ""


def read_json_object(path: Path) -> dict | None:
    """The JSON object in `path`, or None when the file is missing, partial or not an object."""
    try:
        data = json.loads(Path(path).read_text())
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def write_json_atomic(path: str | Path, data: dict) -> None:
    """Write `data` as JSON to a temporary file beside `path`, then rename it into place."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(json.dumps(data, indent=1, default=str))
    os.replace(tmp, path)


def tail(text: str, lines: int = TAIL_LINES) -> str:
    """The last `lines` non-empty lines of `text`."""
    kept = [line for line in text.splitlines() if line.strip()]
    return "\n".join(kept[-lines:])


def clip(text: str, limit: int = REASON_MAX_CHARS) -> str:
    """`text` cut to `limit` characters (with "..." when cut)."""
    return text if len(text) <= limit else text[: limit - 3] + "..."


def telling_line(stderr: str) -> str:
    """The line of a failed process's stderr that best says what went wrong ("" when it is empty)."""
    lines = [line.strip() for line in stderr.splitlines() if line.strip()]
    for pattern in _TELLING:
        for line in reversed(lines):
            match = pattern.search(line)
            if match:
                return clip(_CUDA_ERROR.search(line).group(0) if pattern is _CUDA_ERROR else line)
    return clip(lines[-1]) if lines else ""


def describe_exit(returncode: int) -> str:
    """ "killed by SIGSEGV" for a negative return code, "exited with status N" otherwise."""
    if returncode < 0:
        try:
            return f"killed by {signal.Signals(-returncode).name}"
        except ValueError:
            return f"killed by signal {-returncode}"
    return f"exited with status {returncode}"
