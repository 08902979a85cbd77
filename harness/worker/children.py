"""The child processes of this process end with it: when it is killed, and when it is told to stop.

Every command this process runs (nvcc, a judge, an agent's command) is started by `start` (or `started`,
`run`): in its own process group, so the whole group can be killed (nvcc's cicc and ptxas, a shell's
children), and with Linux's PR_SET_PDEATHSIG, so the kernel kills it when the thread that started it dies,
even by SIGKILL. Each is tracked until it is reaped.

`stop_on_signals()` (the command line calls it first) turns SIGTERM and SIGHUP into `Terminated` and SIGINT
into KeyboardInterrupt, raised in the main thread after every tracked group and every multiprocessing worker
has been killed and no new child may start (`start` then raises `Stopping`). Raised as an exception, the
signal unwinds every `finally` and context manager on its way out: temporary folders are removed, a run's
state says why it stopped. A pool of worker processes passes `die_with_parent` as its initializer so its
workers die with the process too.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
from contextlib import contextmanager
from typing import Iterator

PR_SET_PDEATHSIG = 1
_STOP_SIGNALS = ("SIGTERM", "SIGHUP", "SIGINT")


class Terminated(KeyboardInterrupt):
    """SIGTERM or SIGHUP, raised like Ctrl-C's KeyboardInterrupt so the same unwinding handles both."""

    def __init__(self, signum: int):
        super().__init__(signal.Signals(signum).name)
        self.signum = signum


class Stopping(subprocess.SubprocessError):
    """No child is started once this process has been told to stop."""


def stop_reason(err: KeyboardInterrupt) -> str:
    """Why a stopped process stopped, as a run's state records it."""
    if isinstance(err, Terminated):
        return f"terminated ({signal.Signals(err.signum).name})"
    return "interrupted (Ctrl-C)"


def exit_status(err: KeyboardInterrupt) -> int:
    """The shell's convention: 128 + the signal's number (130 for Ctrl-C, 143 for SIGTERM)."""
    return 128 + (err.signum if isinstance(err, Terminated) else signal.SIGINT)


def _resolve_prctl():
    """libc's prctl, resolved in the parent (nothing may be imported between fork and exec), or None."""
    try:
        import ctypes

        return ctypes.CDLL(None, use_errno=True).prctl
    except (OSError, AttributeError):
        return None  # not Linux: the group kill still ends the children of a process that unwinds


_PRCTL = _resolve_prctl()
_live: dict[int, subprocess.Popen] = {}  # pid (= its group) -> the child, until it is reaped
_lock = threading.Lock()
_stopping = threading.Event()


def _die_with_parent() -> None:  # runs in the child between fork and exec: one C call, no imports
    if _PRCTL is not None:
        _PRCTL(PR_SET_PDEATHSIG, signal.SIGKILL)


def die_with_parent(parent_pid: int) -> None:
    """In a worker process (a pool's initializer): SIGKILL when `parent_pid` dies; exit at once if it
    already has."""
    _die_with_parent()
    if os.getppid() != parent_pid:
        os._exit(1)


def start(command, *, die_with_parent: bool = True, **popen_kwargs) -> subprocess.Popen:
    """`subprocess.Popen(command, **popen_kwargs)` in a new process group, tracked until `forget`; with
    `die_with_parent` (the default) it gets SIGKILL when the calling thread dies. Raises `Stopping` once
    this process has been told to stop."""
    with _lock:
        if _stopping.is_set():
            raise Stopping("this process is stopping; no new command is started")
        proc = None
        try:
            proc = subprocess.Popen(command, start_new_session=True,
                                    preexec_fn=_die_with_parent if die_with_parent else None, **popen_kwargs)
            _live[proc.pid] = proc
        except BaseException:
            if proc is not None:
                kill_group(proc.pid)
            raise
    return proc


def forget(proc: subprocess.Popen) -> None:
    """`proc` has been reaped (or its group killed): stop tracking it."""
    _live.pop(proc.pid, None)


def kill_group(pgid: int) -> None:
    """SIGKILL every process left in group `pgid`; a group that is already empty is fine."""
    try:
        os.killpg(pgid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        return  # empty, or the id now names a group we do not own: nothing of ours is left in it


@contextmanager
def started(command, **kwargs) -> Iterator[subprocess.Popen]:
    """`start(command, **kwargs)` for the block; whatever ends it (an exception, a signal), the child's
    whole group is killed and reaped on the way out."""
    proc = start(command, **kwargs)
    try:
        yield proc
    finally:
        kill_group(proc.pid)
        proc.wait()
        forget(proc)


def run(command, *, timeout: float, input: str | bytes | None = None, **kwargs) -> subprocess.CompletedProcess:
    """`subprocess.run(command, capture_output=True, ...)` in its own group, tracked; on a timeout the whole
    group is killed and `subprocess.TimeoutExpired` raised (as subprocess.run, which kills only the child)."""
    with started(command, stdin=subprocess.PIPE if input is not None else subprocess.DEVNULL,
                 stdout=subprocess.PIPE, stderr=subprocess.PIPE, **kwargs) as proc:
        try:
            out, err = proc.communicate(input, timeout=timeout)
        except subprocess.TimeoutExpired:
            kill_group(proc.pid)
            proc.communicate()
            raise
        return subprocess.CompletedProcess(proc.args, proc.returncode, out, err)


def end_all() -> None:
    """Kill every tracked child group and every multiprocessing worker; start no new child from now on."""
    _stopping.set()
    for pid in list(_live):
        kill_group(pid)
    if "multiprocessing" in sys.modules:
        for worker in sys.modules["multiprocessing"].active_children():
            worker.kill()


def _on_signal(signum: int, frame) -> None:
    end_all()
    if signum == signal.SIGINT:
        raise KeyboardInterrupt
    raise Terminated(signum)


def stop_on_signals() -> None:
    """SIGTERM, SIGHUP and SIGINT end the children, then raise in the main thread (see the module's text).
    Call it from the main thread; elsewhere it does nothing (Python lets only that thread set handlers)."""
    if threading.current_thread() is not threading.main_thread():
        return
    for name in _STOP_SIGNALS:
        signum = getattr(signal, name)
        if signal.getsignal(signum) is not signal.SIG_IGN:  # `nohup` keeps SIGHUP ignored, a background job SIGINT
            signal.signal(signum, _on_signal)
