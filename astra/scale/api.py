"""What every executor shares: the task, its outcome, the protocol, and the code that runs a task.

A `Task` is a top-level picklable callable with picklable arguments and a kind: "cpu" (a build:
one per CPU core) or "gpu" (an evaluation: one per GPU at a time, in a process whose
CUDA_VISIBLE_DEVICES names exactly its GPU, so code that says "cuda" or device 0 is right). An
`Outcome` is what came back: the value, or a one-line error, how many attempts it took (a worker
that dies is retried once; an exception raised by the task is a result and never retried), where it
ran, and the small files (`artifacts`) it brought back to the driver.

`run_task` is the one piece of code that runs inside a worker, local or Ray: it turns the task's
return value or exception into a plain dict (the envelope) that crosses the process boundary.
"""

from __future__ import annotations

import socket
import traceback as tb
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterable, Iterator, Literal, Protocol, runtime_checkable

from astra.errors import BadInput

KINDS = ("cpu", "gpu")
MAX_ATTEMPTS = 2  # a task whose worker dies is retried once, on a fresh worker


@dataclass(frozen=True)
class Task:
    """One unit of work. `fn(*args)` runs in a worker process; `key` names it in the outcome."""

    key: str
    fn: Callable[..., Any]
    args: tuple = ()
    kind: Literal["cpu", "gpu"] = "cpu"

    def __post_init__(self):
        if self.kind not in KINDS:
            raise BadInput(f"task {self.key!r}: kind must be one of {', '.join(KINDS)}, not {self.kind!r}")
        if not isinstance(self.args, tuple):
            raise BadInput(f"task {self.key!r}: args must be a tuple, not {type(self.args).__name__}")


@dataclass(frozen=True)
class Artifacts:
    """Return this from a task to bring small files back: `value` becomes `Outcome.value`,
    `files` ({relative path: bytes}, see `files.collect_files`) becomes `Outcome.artifacts`."""

    value: Any
    files: dict[str, bytes] = field(default_factory=dict)


@dataclass
class Outcome:
    """What one task came to. `ok` is False for an exception raised by the task (attempts == 1),
    a worker that died on every attempt ("worker died twice: ..."), or a task that could not be sent.
    `where` is "host:cpuN" or "host:gpuD" (D = the CUDA_VISIBLE_DEVICES the task saw)."""

    key: str
    ok: bool
    value: Any = None
    error: str | None = None
    attempts: int = 1
    where: str = ""
    artifacts: dict[str, bytes] = field(default_factory=dict)
    traceback: str | None = None

    def write_artifacts(self, dest: str | Path) -> list[Path]:
        """Write the files the task brought back under the driver-side folder `dest`."""
        from astra.scale.files import write_files

        return write_files(self.artifacts, dest)


@runtime_checkable
class Executor(Protocol):
    """Submit many tasks, get their outcomes as they finish (in completion order, not input order)."""

    def map(self, tasks: Iterable[Task]) -> Iterator[Outcome]: ...

    def close(self) -> None: ...


class ExecutorBase:
    """Context-manager plumbing shared by the executors (`with make_executor() as ex: ...`)."""

    def close(self) -> None:  # pragma: no cover - overridden
        raise NotImplementedError

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def checked_tasks(tasks: Iterable[Task]) -> list[Task]:
    """The tasks as a list, refusing anything that is not a `Task` and duplicate keys."""
    tasks = list(tasks)
    seen: set[str] = set()
    for task in tasks:
        if not isinstance(task, Task):
            raise BadInput(f"executor.map takes Task objects, not {type(task).__name__}")
        if task.key in seen:
            raise BadInput(f"two tasks share the key {task.key!r}; keys name outcomes and must be unique")
        seen.add(task.key)
    return tasks


def one_line(exc: BaseException) -> str:
    """`Type: message` on one line (a multi-line message is joined with ' | ')."""
    lines = [ln.strip() for ln in str(exc).splitlines() if ln.strip()]
    return f"{type(exc).__name__}: {' | '.join(lines)}" if lines else type(exc).__name__


def host() -> str:
    return socket.gethostname()


def run_task(fn: Callable[..., Any], args: tuple) -> dict:
    """Run one task in this (worker) process and return its envelope: a plain picklable dict with
    ok, value, error, traceback and artifacts. Exceptions are results; KeyboardInterrupt is not."""
    try:
        value = fn(*args)
    except KeyboardInterrupt:
        raise
    except BaseException as exc:  # SystemExit from a task is its result too, not the worker's end
        return {"ok": False, "value": None, "error": one_line(exc), "traceback": tb.format_exc(), "artifacts": {}}
    files: dict[str, bytes] = {}
    if isinstance(value, Artifacts):
        value, files = value.value, dict(value.files)
    return {"ok": True, "value": value, "error": None, "traceback": None, "artifacts": files}


def outcome_from(key: str, envelope: dict, attempts: int, where: str) -> Outcome:
    return Outcome(key=key, ok=envelope["ok"], value=envelope["value"], error=envelope["error"], attempts=attempts,
                   where=where, artifacts=envelope["artifacts"], traceback=envelope["traceback"])
