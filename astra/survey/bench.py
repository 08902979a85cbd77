"""One kernel's bench, as a task an executor can run anywhere: `bench_one` is a top-level, picklable
function of plain arguments that returns the verdict as a dict (harness `Verdict.to_dict()`).

`serial_run` runs tasks one after another in this process; it is the default `Run` of
`astra.survey.run.survey`. Any other `Run` (a pool, the astra.scale executor: one
`Task(key=task.name, fn=bench_one, args=task.args(), kind="gpu")` per task, each `Outcome` turned into a
`BenchResult`) may yield results in any order; the survey writes each record as its result arrives.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Callable, Iterable, Iterator, Sequence

from astra.errors import AstraError
from astra.spec.trees import tree_for
from astra.text import one_line

VIEWS = ("graph", "cold")


@dataclass(frozen=True)
class BenchSettings:
    """How each kernel is timed: both views by default (the ranking picks one), the harness's budget."""

    modes: tuple[str, ...] = VIEWS
    budget_ms: float | None = None
    # False (the survey's default): the original is timed against itself without its outputs phase. The
    # probe has already run every case, checked determinism and which tensors it writes; the survey
    # only needs the times, and comparing the original with itself took most of a bench's wall time.
    outputs_checked: bool = False
    sandbox: bool = True  # False: --no-sandbox (the verdicts record it)


@dataclass(frozen=True)
class BenchTask:
    """One kernel to bench: its name, its spec file, which SGLang (None, None: the spec's own version)."""

    name: str
    spec_file: str
    sglang_version: str | None
    sglang_src: str | None
    settings: BenchSettings = BenchSettings()

    def args(self) -> tuple:
        """The positional arguments of `bench_one` for this task."""
        return (self.name, self.spec_file, self.sglang_version, self.sglang_src, self.settings)


@dataclass
class BenchResult:
    """What came back for one task: a verdict dict, or a one-line error; wall seconds where measured."""

    name: str
    verdict: dict | None
    error: str | None = None
    wall_s: float | None = None


Bench = Callable[..., dict]
Run = Callable[[Sequence[BenchTask]], Iterable[BenchResult]]


def bench_one(name: str, spec_file: str, sglang_version: str | None, sglang_src: str | None,
              settings: BenchSettings) -> dict:
    """`astra bench` of one spec (the original over its timed cases, both views): the verdict as a dict.
    Raises AstraError (NoGpu, UnknownKernel, a source mismatch, ...) like `astra bench` does."""
    from astra.spec.resolve import resolve
    from astra.spec.source_check import require_same_source
    from astra.verify import runner

    spec = resolve(spec_file or name)
    tree = tree_for(spec, sglang_version, sglang_src)
    require_same_source(spec, tree)
    opts = runner.CheckOptions(modes=list(settings.modes), sanitizer=False, budget_ms=settings.budget_ms,
                               outputs_checked=settings.outputs_checked, sandbox=settings.sandbox)
    return runner.bench_original(spec, tree, opts).to_dict()


def prebuild(tasks: Sequence[BenchTask], say: Callable[[str], None] = lambda _: None) -> dict[str, str]:
    """Build every task's original variants at once, one nvcc per CPU core, into the cache the bench
    workers read (they then find their modules built instead of compiling one kernel at a time).
    Returns {name: why} for tasks whose spec or builds failed here; their benches report it."""
    from astra import paths
    from astra.spec import jobs
    from astra.spec.resolve import resolve
    from harness import build_many

    requests, failed = [], {}
    owner = []
    for task in tasks:
        try:
            spec = resolve(task.spec_file or task.name)
            tree = tree_for(spec, task.sglang_version, task.sglang_src)
            mine = [req for side, _, req in jobs.spec_build_requests(spec, tree) if side == "orig"]
        except AstraError as err:
            failed[task.name] = one_line(err, 300)
            continue
        requests.extend(mine)
        owner.extend([task.name] * len(mine))
    if not requests:
        return failed
    start = time.monotonic()
    say(f"building {len(requests)} variant(s) of {len(tasks) - len(failed)} kernel(s) on every CPU core")
    results = build_many(requests, paths.sub("builds"))
    broken = {}
    for name, result in zip(owner, results):
        if not result.ok and name not in broken:
            broken[name] = one_line(result.error or "build failed", 300)
    say(f"built in {time.monotonic() - start:.0f} s; {len(broken)} kernel(s) with a failed build")
    failed.update(broken)
    return failed


def serial_run(tasks: Sequence[BenchTask], bench: Bench = bench_one) -> Iterator[BenchResult]:
    """Each task in turn, in this process; an AstraError becomes that kernel's error, the rest go on."""
    for task in tasks:
        start = time.monotonic()
        try:
            verdict = bench(*task.args())
        except AstraError as err:
            yield BenchResult(task.name, None, one_line(err, 400), time.monotonic() - start)
        else:
            yield BenchResult(task.name, verdict, None, time.monotonic() - start)


def gpu_name() -> str | None:
    """The name of CUDA device 0, as torch would report it (None: no CUDA build of torch, or no GPU here).
    Asked of the driver, without importing torch (harness.environment.cuda_devices)."""
    from harness.environment.cuda_devices import device_name, torch_cuda

    return device_name(0) if torch_cuda() else None


def executor_run(executor, bench: Bench = bench_one) -> Run:
    """A `Run` over an astra.scale executor: one GPU task per kernel (a local worker per GPU, or a Ray task
    holding one GPU), results in completion order; a task that raised or whose worker died twice is that
    kernel's error, the rest go on."""
    from astra.scale import Task

    def run(tasks: Sequence[BenchTask]) -> Iterator[BenchResult]:
        for out in executor.map([Task(key=t.name, fn=bench, args=t.args(), kind="gpu") for t in tasks]):
            if out.ok:
                yield BenchResult(out.key, out.value, None, None)
            else:
                yield BenchResult(out.key, None, one_line(f"{out.error} (on {out.where or 'a worker'}, "
                                                          f"{out.attempts} attempt(s))", 400), None)

    return run
