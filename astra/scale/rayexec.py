"""Tasks on a Ray cluster: CPU tasks as `num_cpus=1` Ray tasks, GPU tasks as `num_gpus=1` Ray tasks.

Ray is optional (`pip install 'astra[ray]'`) and imported only here, only when asked for. Where to
connect (`address`):

- "auto": if this process already called `ray.init`, use that session (and leave it open on close);
  else if the RAY_ADDRESS variable is set, connect there (failing if it cannot); else connect to the
  cluster last started on this machine with `ray start` (Ray records it under /tmp/ray); if there is
  none, start a local Ray instance on this machine (`ray.init(address="local")`, with `cpus`/`gpus`
  as its resources when given, else every CPU and GPU Ray detects) and shut it down on close().
- anything else ("HOST:PORT", "ray://HOST:PORT"): connect there, or fail with an AstraError.

Either way, a session this process already opened with `ray.init` is used as it is, and left open.

Ray sets CUDA_VISIBLE_DEVICES for each GPU task to the GPU it was given. A task lost with its worker
or node is retried once by Ray (`max_retries=1`) and then reported; an exception raised by the task
is caught in the worker (`api.run_task`) and is its result, never retried (`retry_exceptions=False`).
Every node needs Astra (and what the task imports) installed at the same version as the driver.
`cpus`/`gpus`, when given, also cap how many CPU and GPU tasks this executor keeps in flight.
A GPU task also reserves `gpu_task_cpus` CPUs (default 1: the evaluation's candidate and judge
processes keep a core that no build takes); 0 lets builds take every core of a GPU node.
"""

from __future__ import annotations

import logging
import os
from collections import deque
from typing import Any, Iterable, Iterator

from astra.errors import AstraError, BadInput, EnvironmentFailure, NoGpu, ToolMissing
from astra.scale.api import (
    MAX_ATTEMPTS,
    ExecutorBase,
    Outcome,
    Task,
    checked_tasks,
    host,
    one_line,
    outcome_from,
    run_task,
)

# Ray exceptions that mean the worker or its node went away (the only ones Ray's max_retries covers)
_LOST = ("WorkerCrashedError", "NodeDiedError", "OutOfMemoryError", "LocalRayletDiedError", "ObjectLostError")


def import_ray() -> Any:
    """The `ray` module, or ToolMissing saying how to install it."""
    try:
        import ray
    except ImportError:
        raise ToolMissing("--ray needs Ray, which is not installed here: pip install 'astra[ray]'") from None
    return ray


def _attempt_number() -> int | None:
    """0 for a task's first run, 1 for Ray's retry (a private Ray API; None where it is missing)."""
    try:
        import ray

        return int(ray._private.worker.global_worker.core_worker.get_current_task_attempt_number())
    except Exception:  # any Ray without this accessor: the attempt count is then unknown
        return None


def ray_entry(fn, args: tuple, kind: str) -> dict:
    """What a Ray worker runs: the task's envelope plus where it ran and which attempt this was."""
    envelope = run_task(fn, args)
    device = os.environ.get("CUDA_VISIBLE_DEVICES", "?")
    envelope["where"] = f"{host()}:gpu{device}" if kind == "gpu" else f"{host()}:cpu"
    envelope["attempt"] = _attempt_number()
    return envelope


class RayExecutor(ExecutorBase):
    """The Executor protocol on Ray; see the module docstring for `address`."""

    def __init__(self, address: str = "auto", cpus: int | None = None, gpus: int | None = None,
                 gpu_task_cpus: float = 1):
        if not address:
            raise BadInput("the Ray address is empty; use 'auto' or HOST:PORT")
        if cpus is not None and cpus < 1:
            raise BadInput(f"cpus must be 1 or more, not {cpus}")
        if gpus is not None and gpus < 0:
            raise BadInput(f"gpus must be 0 or more, not {gpus}")
        self._ray = ray = import_ray()
        self._owns = False
        self._limits = {"cpu": cpus, "gpu": gpus}
        if not ray.is_initialized():
            self._connect(address, cpus, gpus)
            self._owns = True
        options = {"max_retries": MAX_ATTEMPTS - 1, "retry_exceptions": False}
        self._remote = {"cpu": ray.remote(num_cpus=1, num_gpus=0, **options)(ray_entry),
                        "gpu": ray.remote(num_cpus=gpu_task_cpus, num_gpus=1, **options)(ray_entry)}

    def _connect(self, address: str, cpus: int | None, gpus: int | None) -> None:
        ray = self._ray
        quiet = {"logging_level": logging.WARNING, "include_dashboard": False}
        try:
            if address != "auto":
                ray.init(address=address, logging_level=logging.WARNING)
                return
            try:
                ray.init(address="auto", logging_level=logging.WARNING)
                return
            except ConnectionError:
                if os.environ.get("RAY_ADDRESS"):
                    raise
            ray.init(address="local", num_cpus=cpus, num_gpus=gpus, **quiet)
        except AstraError:
            raise
        except Exception as exc:
            raise EnvironmentFailure(f"could not connect to Ray at {address!r}: {one_line(exc)}") from None

    @property
    def gpus(self) -> int:
        """GPUs in the cluster now (capped by `gpus` when given)."""
        total = int(self._ray.cluster_resources().get("GPU", 0))
        limit = self._limits["gpu"]
        return total if limit is None else min(total, limit)

    def map(self, tasks: Iterable[Task]) -> Iterator[Outcome]:
        """Submit the tasks to Ray; yield outcomes as they finish. Raises NoGpu at once for GPU tasks
        on a cluster without GPUs (they would wait forever). Stopping early cancels the rest."""
        tasks = checked_tasks(tasks)
        if any(t.kind == "gpu" for t in tasks) and self.gpus == 0:
            raise NoGpu("GPU tasks need a GPU and the Ray cluster has none (ray status shows its resources)")
        return self._run(tasks)

    def _run(self, tasks: list[Task]) -> Iterator[Outcome]:
        ray = self._ray
        queues: dict[str, deque] = {"cpu": deque(), "gpu": deque()}
        for task in tasks:
            queues[task.kind].append(task)
        running: dict[Any, Task] = {}
        try:
            while True:
                for kind, queue in queues.items():
                    limit = self._limits[kind]
                    while queue and (limit is None or sum(t.kind == kind for t in running.values()) < limit):
                        task = queue.popleft()
                        running[self._remote[kind].remote(task.fn, task.args, kind)] = task
                if not running:
                    return
                done, _ = ray.wait(list(running), num_returns=1)
                for ref in done:
                    yield self._outcome(running.pop(ref), ref)
        finally:
            for ref in running:
                try:
                    ray.cancel(ref, force=True)
                except Exception as exc:  # already finished or its worker gone: nothing left to stop
                    logging.getLogger(__name__).debug("ray.cancel: %s", one_line(exc))

    def _outcome(self, task: Task, ref) -> Outcome:
        ray = self._ray
        try:
            envelope = ray.get(ref)
        except ray.exceptions.RayTaskError as exc:  # raised outside the task's own code (arguments, result)
            cause = exc.cause if getattr(exc, "cause", None) is not None else exc
            return Outcome(key=task.key, ok=False, error=one_line(cause), attempts=1, where="ray")
        except ray.exceptions.RayError as exc:
            if type(exc).__name__ in _LOST:
                return Outcome(key=task.key, ok=False, attempts=MAX_ATTEMPTS, where="ray",
                               error=f"worker died twice: {one_line(exc)}")
            return Outcome(key=task.key, ok=False, error=one_line(exc), attempts=1, where="ray")
        attempt = envelope.pop("attempt")
        where = envelope.pop("where")
        return outcome_from(task.key, envelope, 1 if attempt is None else attempt + 1, where)

    def close(self) -> None:
        """Disconnect (and stop the local instance) if this executor started Ray; safe to call twice."""
        if self._owns and self._ray.is_initialized():
            self._ray.shutdown()
        self._owns = False
