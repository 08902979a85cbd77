"""Tasks on this machine: a thin pool of spawned worker processes, one slot per CPU core and one per GPU.

Each slot holds at most one long-lived worker (started on first use, `spawn` context, so nothing of
the driver's state is inherited) and runs one task at a time on it; the driver waits on every busy
worker's pipe and process sentinel at once (`multiprocessing.connection.wait`) and yields outcomes as
they come. A GPU slot's worker sets CUDA_VISIBLE_DEVICES to exactly its device before it loads any
task, so a task that says "cuda" (device 0) gets that GPU, and sets ASTRA_BUILD_JOBS to its share of the
host's cores (harness.building.nvcc_build.build_jobs): the GPU workers of one host build side by side, and
each taking every core for its nvcc processes oversubscribes the host (on 4 x H100, four `astra eval` workers
prebuilding parameter-search points measured an empty kernel at 639 us on an idle GPU, and the judge of one
of them refused the original's own timing as "interferes"). When a worker dies mid-task (os._exit, a
signal, a segfault) the slot starts a fresh worker and the task runs once more; a second death is the
task's outcome, with both exit codes. One worker per slot, one pipe per worker: a death is always
pinned on the task that caused it, which a shared ProcessPoolExecutor (BrokenProcessPool fails every
task in flight, with no exit code) cannot do.
"""

from __future__ import annotations

import atexit
import multiprocessing
import os
import pickle
import signal
from collections import deque
from dataclasses import dataclass, field
from multiprocessing.connection import wait
from typing import Iterable, Iterator

from astra.errors import BadInput, NoGpu
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
from harness.building.nvcc_build import BUILD_JOBS_ENV
from harness.worker import children

_CTX = multiprocessing.get_context("spawn")
_STOP_GRACE_S = 5.0


def default_cpus() -> int:
    """The CPU cores this process may use."""
    try:
        return len(os.sched_getaffinity(0)) or 1
    except AttributeError:  # not Linux
        return os.cpu_count() or 1


def detected_gpus() -> int:
    """The CUDA devices this process may use when torch here is a CUDA build, else 0 (asked of the driver,
    without importing torch: harness.environment.cuda_devices)."""
    from harness.environment.cuda_devices import device_count, torch_cuda

    return device_count() if torch_cuda() else 0


def gpu_devices(gpus: int | None) -> list[str]:
    """CUDA_VISIBLE_DEVICES for each GPU slot: the first `gpus` entries of this process's own
    CUDA_VISIBLE_DEVICES when it names devices, else "0".."gpus-1". `gpus=None` counts with torch;
    an explicit count on a machine without GPUs gives fake slots (tests)."""
    count = detected_gpus() if gpus is None else gpus
    if count < 0:
        raise BadInput(f"gpus must be 0 or more, not {count}")
    own = [d.strip() for d in os.environ.get("CUDA_VISIBLE_DEVICES", "").split(",") if d.strip()]
    if not own:
        return [str(i) for i in range(count)]
    if count > len(own):
        raise BadInput(f"{count} GPUs asked for, but CUDA_VISIBLE_DEVICES={','.join(own)} names {len(own)}")
    return own[:count]


def exit_text(code: int | None) -> str:
    """'exit code 3' or 'exit code -9 (SIGKILL)'."""
    if code is None:
        return "exit code unknown"
    if code < 0:
        try:
            return f"exit code {code} ({signal.Signals(-code).name})"
        except ValueError:
            pass
    return f"exit code {code}"


def _worker_main(conn, device: str | None, parent: int, build_jobs: int | None = None) -> None:
    """A worker's whole life: set its GPU (and its share of the cores for builds), then run task after task
    until the driver hangs up (or dies: the worker dies with it)."""
    children.die_with_parent(parent)
    if device is not None:
        os.environ["CUDA_VISIBLE_DEVICES"] = device
    if build_jobs is not None:
        os.environ[BUILD_JOBS_ENV] = str(build_jobs)
    while True:
        try:
            data = conn.recv_bytes()
        except (EOFError, OSError):
            return
        try:
            fn, args = pickle.loads(data)
        except Exception as exc:
            envelope = _failed(f"could not load the task in the worker: {one_line(exc)}")
        else:
            envelope = run_task(fn, args)
        try:
            conn.send(envelope)
        except (pickle.PicklingError, TypeError, AttributeError) as exc:
            conn.send(_failed(f"the task's result is not picklable: {one_line(exc)}"))


def _failed(error: str) -> dict:
    return {"ok": False, "value": None, "error": error, "traceback": None, "artifacts": {}}


@dataclass
class _Job:
    task: Task
    payload: bytes
    attempts: int = 0
    deaths: list[str] = field(default_factory=list)


class _Slot:
    """One CPU core or one GPU: at most one worker process, at most one job on it."""

    def __init__(self, kind: str, index: int, device: str | None, build_jobs: int | None = None):
        self.kind, self.index, self.device, self.build_jobs = kind, index, device, build_jobs
        self.proc = None
        self.conn = None
        self.job: _Job | None = None

    @property
    def where(self) -> str:
        return f"{host()}:gpu{self.device}" if self.kind == "gpu" else f"{host()}:cpu{self.index}"

    def start(self, job: _Job) -> None:
        if self.proc is not None and not self.proc.is_alive():
            self.stop()  # died while idle: replace it, no attempt spent
        if self.proc is None:
            parent, child = _CTX.Pipe()
            self.proc = _CTX.Process(target=_worker_main, args=(child, self.device, os.getpid(), self.build_jobs),
                                     name=f"astra-scale-{self.kind}{self.index}")
            self.proc.start()
            child.close()
            self.conn = parent
        job.attempts += 1
        self.job = job
        try:
            self.conn.send_bytes(job.payload)
        except OSError:
            pass  # the worker is gone; reap() sees its sentinel and counts the death

    def stop(self, kill: bool = False) -> str:
        """End the worker (hang up, then terminate and kill if it lingers); returns its exit text."""
        proc, conn = self.proc, self.conn
        self.proc = self.conn = None
        if proc is None:
            return ""
        conn.close()  # an idle worker reads EOF and returns
        if kill and proc.is_alive():
            proc.terminate()
        proc.join(_STOP_GRACE_S)
        if proc.is_alive():
            proc.kill()
            proc.join(_STOP_GRACE_S)
        return exit_text(proc.exitcode)

    def reap(self, requeue: deque) -> Outcome | None:
        """The busy job's outcome if its worker answered or died for good; None while it runs
        (or after a first death, when the job goes back to the front of `requeue`)."""
        job = self.job
        if self.conn.poll():
            try:
                envelope = self.conn.recv()
            except (EOFError, OSError):
                envelope = None  # died: the pipe closed with nothing in it
            except Exception as exc:  # a result the driver cannot unpickle
                envelope = _failed(f"could not read the task's result: {one_line(exc)}")
            if envelope is not None:
                self.job = None
                return outcome_from(job.task.key, envelope, job.attempts, self.where)
        elif self.proc.is_alive():
            return None
        where = self.where
        job.deaths.append(self.stop())
        self.job = None
        if job.attempts < MAX_ATTEMPTS:
            requeue.appendleft(job)
            return None
        return Outcome(key=job.task.key, ok=False, error=f"worker died twice: {', then '.join(job.deaths)}",
                       attempts=job.attempts, where=where)


def gpu_slots(devices: list[str]) -> list[_Slot]:
    """One slot per device, each worker's builds given an equal share of the host's cores."""
    share = max(1, default_cpus() // max(1, len(devices)))
    return [_Slot("gpu", i, d, share) for i, d in enumerate(devices)]


class LocalExecutor(ExecutorBase):
    """CPU tasks on `cpus` workers (default: every core), GPU tasks on one worker per GPU
    (default: torch's count; an explicit `gpus` on a CPU-only machine gives fake slots for tests)."""

    def __init__(self, cpus: int | None = None, gpus: int | None = None):
        self.cpus = default_cpus() if cpus is None else cpus
        if self.cpus < 1:
            raise BadInput(f"cpus must be 1 or more, not {self.cpus}")
        self._gpus_asked = gpus
        self._cpu_slots = [_Slot("cpu", i, None) for i in range(self.cpus)]
        self._gpu_slots: list[_Slot] | None = None
        if gpus is not None:
            self._gpu_slots = gpu_slots(gpu_devices(gpus))
        self._busy = False
        atexit.register(self.close)

    @property
    def gpus(self) -> int:
        """GPU slots (counting them imports torch, once, the first time it is needed)."""
        if self._gpu_slots is None:
            self._gpu_slots = gpu_slots(gpu_devices(self._gpus_asked))
        return len(self._gpu_slots)

    def map(self, tasks: Iterable[Task]) -> Iterator[Outcome]:
        """Run every task; yield outcomes as they finish. Raises NoGpu at once for GPU tasks
        without a GPU. Stopping the iteration early terminates the tasks still running."""
        tasks = checked_tasks(tasks)
        if any(t.kind == "gpu" for t in tasks) and self.gpus == 0:
            raise NoGpu("GPU tasks need a CUDA GPU and none is visible here (torch sees none); "
                        "run on a GPU machine or on a Ray cluster with --ray")
        if self._busy:
            raise BadInput("this executor is already running a map; finish it before starting another")
        return self._run(tasks)

    def _run(self, tasks: list[Task]) -> Iterator[Outcome]:
        self._busy = True
        queues: dict[str, deque] = {"cpu": deque(), "gpu": deque()}
        slots = [*self._cpu_slots, *(self._gpu_slots or [])]
        try:
            for task in tasks:
                try:
                    payload = pickle.dumps((task.fn, task.args))
                except Exception as exc:
                    yield Outcome(key=task.key, ok=False, error=f"task is not picklable: {one_line(exc)}",
                                  attempts=0, where="driver")
                    continue
                queues[task.kind].append(_Job(task, payload))
            while True:
                for slot in slots:
                    if slot.job is None and queues[slot.kind]:
                        slot.start(queues[slot.kind].popleft())
                busy = [s for s in slots if s.job is not None]
                if not busy:
                    return
                wait([h for s in busy for h in (s.conn, s.proc.sentinel)])
                for slot in busy:
                    outcome = slot.reap(queues[slot.kind])
                    if outcome is not None:
                        yield outcome
        finally:
            for slot in slots:
                if slot.job is not None:  # abandoned mid-run: its result would confuse the next map
                    slot.job = None
                    slot.stop(kill=True)
            self._busy = False

    def close(self) -> None:
        """Stop every worker (idle ones exit on hang-up). Safe to call twice."""
        for slot in [*self._cpu_slots, *(self._gpu_slots or [])]:
            slot.job = None
            slot.stop()
        atexit.unregister(self.close)
