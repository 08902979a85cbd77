"""Running a harness command in its own process group, and reading what it left behind.

Shared by `harness.worker.judge_process` (one judge per job), `harness.judge.evaluate` (the judge's candidate process, with
a scrubbed environment: `scrub_env`) and `harness.worker.sanitizer` (the candidate under compute-sanitizer). Output goes to files, never pipes: a hung grandchild holding a pipe open
cannot block us, and results never come from stdout (the verdict file is the only channel).
"""

from __future__ import annotations

import json
import logging
import os
import re
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from harness.worker import children
from harness.worker.children import kill_group

EVALUATE_ENV = "ASTRA_HARNESS_EVALUATE"  # module:function or file.py:function replacing evaluate (tests)
REASON_MAX_CHARS = 400
TAIL_LINES = 30
PACKAGE_PARENT = str(Path(__file__).resolve().parents[2])  # the folder that holds the harness package

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


class Isolated:
    """A command started in a new process group, stdout/stderr to `logs`/{stdout,stderr}.log (default:
    `cwd`), `stdin_data` (bytes) written to its stdin and closed, else stdin is /dev/null.

    `poll()` says whether it ended; `finish(timeout_s)` waits at most that long, kills the whole group
    (SIGKILL: a process stuck in a CUDA call ignores SIGTERM) whatever the end, and returns the
    ProcessOutcome (returncode None when it had to be killed for time). It is one of this process's tracked
    children (harness.worker.children: killed when this process is told to stop); with `die_with_parent` it
    gets SIGKILL when the thread that started it dies (Linux PR_SET_PDEATHSIG). `pass_fds`: file
    descriptors the child inherits under the same numbers (the timing link's pipes, harness.timing_link)."""

    def __init__(self, command: list[str], *, env: dict[str, str], cwd: str | Path, logs: str | Path | None = None,
                 stdin_data: bytes | None = None, die_with_parent: bool = False, pass_fds: tuple[int, ...] = ()) -> None:
        self.cwd, self.logs = Path(cwd), Path(logs or cwd)
        self.start = time.monotonic()
        self._out = open(self.logs / "stdout.log", "wb")
        self._err = open(self.logs / "stderr.log", "wb")
        stdin = subprocess.PIPE if stdin_data is not None else subprocess.DEVNULL
        self.proc = children.start(command, die_with_parent=die_with_parent, cwd=self.cwd, env=env, stdin=stdin,
                                   stdout=self._out, stderr=self._err, pass_fds=pass_fds)
        if stdin_data is not None and self.proc.stdin is not None:
            try:
                self.proc.stdin.write(stdin_data)
                self.proc.stdin.close()
            except (BrokenPipeError, OSError):
                pass  # it exited before reading: its exit status says why

    def poll(self) -> bool:
        """True once the process has exited."""
        return self.proc.poll() is not None

    def finish(self, timeout_s: float, progress: Callable[[str], None] | None = None,
               cancel: threading.Event | None = None) -> ProcessOutcome:
        """`progress`: called with each `INFO harness...` line the process writes to stderr as it runs
        (what it is building, judging or timing), so a long job says where it is. `cancel`: once set, the
        group is killed as for a timeout (returncode None)."""
        try:
            returncode: int | None = (self.proc.wait(timeout=max(timeout_s, 0.001))
                                      if progress is None and cancel is None
                                      else self._wait_echoing(timeout_s, progress, cancel))
        except subprocess.TimeoutExpired:
            returncode = None
        finally:
            kill_group(self.proc.pid)
            self.proc.wait()
            children.forget(self.proc)
            self._out.close()
            self._err.close()
        return ProcessOutcome(returncode, time.monotonic() - self.start, read_text(self.logs / "stdout.log"),
                              read_text(self.logs / "stderr.log"))

    def _wait_echoing(self, timeout_s: float, progress: Callable[[str], None] | None,
                      cancel: threading.Event | None = None) -> int:
        deadline, seen = time.monotonic() + max(timeout_s, 0.001), 0
        step = 1.0 if cancel is None else 0.1
        while True:
            try:
                returncode = self.proc.wait(timeout=max(0.001, min(step, deadline - time.monotonic())))
            except subprocess.TimeoutExpired:
                returncode = None
            if progress is not None:
                try:
                    seen = _echo_new_lines(self.logs / "stderr.log", seen, progress)
                except Exception:  # a closed stderr, a broken callback: the verdict matters, not the news
                    progress = None
            if returncode is not None:
                return returncode
            if time.monotonic() >= deadline or (cancel is not None and cancel.is_set()):
                raise subprocess.TimeoutExpired(self.proc.args, timeout_s)

    def kill(self) -> ProcessOutcome:
        """Kill the group now and collect the outcome (returncode None: killed by us)."""
        kill_group(self.proc.pid)
        outcome = self.finish(5.0)
        return ProcessOutcome(None, outcome.seconds, outcome.stdout, outcome.stderr)


def _echo_new_lines(path: Path, seen: int, progress: Callable[[str], None]) -> int:
    """Pass the complete `INFO harness` lines written to `path` after byte `seen`; returns the new offset."""
    try:
        with open(path, "rb") as f:
            f.seek(seen)
            data = f.read()
    except OSError:
        return seen
    end = data.rfind(b"\n") + 1
    for line in data[:end].decode("utf-8", errors="replace").splitlines():
        if line.startswith("INFO harness"):
            progress(line.split(": ", 1)[-1])
    return seen + end


def run_isolated(command: list[str], *, timeout_s: float, env: dict[str, str], cwd: str | Path,
                 stdin_data: bytes | None = None, progress: Callable[[str], None] | None = None,
                 cancel: threading.Event | None = None) -> ProcessOutcome:
    """Run `command` in a new process group, stdout/stderr to `cwd`/{stdout,stderr}.log, `stdin_data`
    (when given) on its stdin, else /dev/null.

    On timeout, or once `cancel` is set, the group gets SIGKILL at once (a process stuck in a CUDA call
    ignores SIGTERM). Whatever the end, the group is killed afterwards so no grandchild outlives the command.
    """
    return Isolated(command, env=env, cwd=cwd, stdin_data=stdin_data).finish(timeout_s, progress, cancel)


# The candidate's environment: an allow-list, then a deny-list on top of it (secrets never pass).
_KEEP_NAMES = frozenset({"PATH", "LD_LIBRARY_PATH", "PYTHONPATH", "PYTHONUNBUFFERED", "LANG", "CUDA_VISIBLE_DEVICES"})
_KEEP_PREFIXES = ("CUDA_", "NVIDIA_", "LC_", "PYTORCH_", "ASTRA_TIMING_")
_SECRET_WORDS = ("KEY", "TOKEN", "SECRET", "PASSWORD", "CREDENTIAL")
_SECRET_PREFIXES = ("OPENAI_", "ANTHROPIC_", "AWS_", "HF_", "ASTRA_")
_NEEDED_ASTRA = ("ASTRA_TIMING_PAUSE_GC", "ASTRA_TIMING_KEEP_BUSY_US")  # timing diagnostics, no secrets


def is_secret(name: str) -> bool:
    """Whether a variable must never reach candidate code (by its name; see `scrub_env`)."""
    upper = name.upper()
    if upper in _NEEDED_ASTRA:
        return False
    return any(word in upper for word in _SECRET_WORDS) or upper.startswith(_SECRET_PREFIXES)


def scrub_env(env: dict[str, str], home: str | Path) -> dict[str, str]:
    """The environment of a candidate process: only what CUDA and torch need (PATH, LD_LIBRARY_PATH,
    CUDA_*, NVIDIA_*, CUDA_VISIBLE_DEVICES, PYTHONPATH with this package first, PYTHONUNBUFFERED, LANG,
    LC_*, PYTORCH_*, the ASTRA_TIMING_* diagnostics), never a name that holds KEY, TOKEN, SECRET, PASSWORD
    or CREDENTIAL or starts with OPENAI_, ANTHROPIC_, AWS_, HF_ or ASTRA_; HOME and TMPDIR are `home`."""
    kept = {k: v for k, v in env.items()
            if (k in _KEEP_NAMES or k.startswith(_KEEP_PREFIXES)) and not is_secret(k)}
    kept = harness_env(kept)
    kept["HOME"] = kept["TMPDIR"] = str(home)
    return kept


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


def exit_now(code: int) -> None:
    """End this process at once, its results delivered: the interpreter's teardown (torch, the CUDA context,
    every module's finalisers) would only add to the wait of whoever waits for the exit."""
    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)
