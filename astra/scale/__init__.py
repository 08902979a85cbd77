"""Scale-out: run many builds and evaluations at once, on this machine or on a Ray cluster.

One interface for survey, probe, bench and optimize: submit many `Task`s, get `Outcome`s as they
finish. CPU tasks (builds) run one per CPU core; GPU tasks (evaluations) one per GPU at a time, in a
process whose CUDA_VISIBLE_DEVICES names exactly its GPU. A task whose worker dies is retried once,
then reported; an exception raised by a task is its result (ok=False, a one-line error), not retried.

    from astra.scale import Task, make_executor
    with make_executor(gpus=None) as ex:                  # local; make_executor(ray="auto") for Ray
        for out in ex.map([Task("rmsnorm", build_one, (spec,)), Task("rmsnorm/eval", eval_one, (job,), "gpu")]):
            ...

`local` is the process pool on this machine; `rayexec` is the same on Ray (optional: `astra[ray]`);
`api` holds the types and the code that runs a task in a worker; `files` carries small files back.
"""

from __future__ import annotations

from astra.scale.api import Artifacts, Executor, Outcome, Task
from astra.scale.files import collect_files, write_files
from astra.scale.local import LocalExecutor
from astra.scale.rayexec import RayExecutor

__all__ = ["Artifacts", "Executor", "LocalExecutor", "Outcome", "RayExecutor", "Task", "collect_files",
           "make_executor", "write_files"]


def make_executor(ray: str | None = None, gpus: int | None = None, cpus: int | None = None) -> Executor:
    """A `LocalExecutor` (ray=None) or a `RayExecutor` connected to `ray` ("auto" or an address;
    see astra.scale.rayexec for exactly what "auto" does). `cpus`/`gpus`: slots on this machine, or
    on Ray the resources of a local instance it starts and a cap on tasks in flight. Raises ToolMissing
    (an AstraError) when Ray is asked for and not installed."""
    if ray is None:
        return LocalExecutor(cpus=cpus, gpus=gpus)
    return RayExecutor(ray, cpus=cpus, gpus=gpus)
