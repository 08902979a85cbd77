"""`astra eval`: the optimize loop over several kernels, summarised in the shape of the Astra paper's
Table 2 (kernel, lines changed, time before and after overall and per band, speedup, correct, the agent),
so any model or the offline agent can be compared with the paper's 1.32x average. Without a kernel
list, the targets are the survey's top kernels by recoverable time (astra.survey.targets). Every kernel
with a verified win gets its patch (the emitter's own bar applies).

Time is the geometric mean over the spec's timed shapes of the graph-mode medians (the serving view);
"after" is the best verified candidate's, "before" the original's, both from that candidate's verdict
(measured interleaved in one worker). A kernel whose run verified nothing keeps its original: speedup
1.0, as the loop never ships an unverified change.

An evaluation continues where it stopped: a kernel whose earlier run (same SGLang version, agent and
original source) finished is reused, one that was cut off (killed, out of time on a shared GPU box) is
resumed; `fresh=True` (`astra eval --fresh`) starts every kernel over.

With more than one GPU visible (and more than one kernel), or on Ray, the kernels run at once, one GPU
task each (astra.scale, as `astra survey` does): `in_worker` runs `eval_one`, a top-level function of plain
arguments that resolves the spec and the SGLang tree inside the worker. The worker sees exactly its GPU,
so each kernel's loop judges its candidates there. Rows come back in the order the kernels were given; a
kernel whose task raised or whose worker died twice is a row with its error, and the rest go on. The
summary counts the candidates judged during the evaluation and divides by its wall time (per hour).
"""

from __future__ import annotations

import difflib
import os
import time
from dataclasses import replace
from typing import Callable

from astra import paths
from astra.errors import BadInput, RunStateError
from astra.optimize.agent_registry import agent_kind
from astra.optimize.driver import emit_best_patch, run_identity, run_optimize
from astra.optimize.evaluator import visible_gpus
from astra.optimize.options import OptimizeOptions
from astra.optimize.rundir import RunDir, RunState, list_runs, per_hour
from astra.scale.api import Executor, host
from astra.sglang.tree import SglangTree
from astra.spec.model import KernelSpec
from astra.spec.trees import tree_for
from astra.text import one_line
from harness import Verdict, geomean

BANDS = ("decode", "middle", "prefill")


def positive_geomean(values: list[float | None]) -> float | None:
    """harness.geomean over the positive values; None when there are none."""
    values = [v for v in values if v and v > 0]
    return geomean(values) if values else None


def _times(verdict: Verdict | None, side: str, band: str | None = None) -> float | None:
    return positive_geomean([c.median_us("graph", side) for c in (verdict.cases if verdict else [])
                             if c.timed and (band is None or c.band == band)])


def lines_changed(before: str, after: str) -> int:
    """Lines added plus lines removed (a unified diff's +/- lines)."""
    return sum(1 for line in difflib.unified_diff(before.splitlines(), after.splitlines(), lineterm="")
               if line[:1] in "+-" and not line.startswith(("+++", "---")))


def row(run: RunDir, spec: KernelSpec) -> dict:
    state = run.state()
    original = run.original()
    best_source, _, verdict = run.candidate(state.best) if state.best else (original, None, None)
    before = _times(verdict, "orig") if verdict else _times(run.baseline(), "orig")
    after = _times(verdict, "cand") if verdict else before
    bands = {}
    for band in BANDS:
        b = _times(verdict, "orig", band) if verdict else _times(run.baseline(), "orig", band)
        a = _times(verdict, "cand", band) if verdict else b
        if b:
            bands[band] = {"us_before": b, "us_after": a, "speedup": (b / a) if a else None}
    slower = [s for s in (verdict.slower_shapes if verdict else []) if s.get("mode") == "graph"]
    return {"kernel": spec.name, "lines_before": len(original.splitlines()), "lines_after": len(best_source.splitlines()),
            "lines_changed": lines_changed(original, best_source),
            "us_before": before, "us_after": after, "bands": bands,
            "speedup": (before / after) if before and after else None,
            "worst_shape": min((s.get("speedup") for s in slower if s.get("speedup")), default=None),
            "correct": bool(verdict and verdict.status == "correct") if state.best else None,
            "candidates": len(state.history), "agent": state.agent, "run": run.root.name, "patch": None}


def earlier_run(kernel: str, sglang_version: str, agent: str, original: str, identity: dict) -> RunDir | None:
    """The newest run under $ASTRA_HOME/runs of this kernel, SGLang version and agent that optimized the
    same original source with the same `identity` (driver.run_identity: spec, sanitizer, suite, GPU or
    dry run) and timed the original on a GPU; None when there is none. An unreadable run is passed over."""
    for run_id in reversed(list_runs()):
        run = RunDir(paths.sub("runs") / run_id)
        try:
            state = run.state()
            same = (state.kernel, state.sglang_version, state.agent, state.identity) == (
                kernel, sglang_version, agent, identity)
            if not same or run.original() != original:
                continue
            baseline = run.baseline()
            if baseline is not None and any(c.timed for c in baseline.cases):
                return run
        except (RunStateError, OSError, ValueError, TypeError, KeyError, AttributeError):
            continue
    return None


# an error, Ctrl-C, SIGTERM or SIGHUP, an agent that could not go on
_CUT_OFF = ("failed", "interrupted", "terminated", "stopped by the agent")


def finished(state: RunState) -> bool:
    """A run that stopped by its own rule (a budget spent, nothing left to try), not cut off by an error,
    an interrupt or an agent that failed (an unreachable endpoint, an exec command that failed)."""
    return state.stopped is not None and not state.stopped.startswith(_CUT_OFF)


def eval_kernel(spec: KernelSpec, tree: SglangTree, opts: OptimizeOptions, *, fresh: bool = False, say=print,
                events=None) -> dict:
    """One kernel of the evaluation: its earlier run reused or resumed (unless `fresh`), else a new run;
    its `row`, with the patch of a verified win, `judged` (the candidates judged by this call: none for a
    reused run, the new ones of a resumed run) and `wall_s` (this call's seconds)."""
    began = time.monotonic()
    original = (tree.csrc_dir / spec.kernel_file).read_text()
    earlier = None if fresh or opts.dry_run else earlier_run(spec.name, tree.version, agent_kind(opts), original,
                                                             run_identity(spec, opts))
    if earlier is not None and finished(earlier.state()):
        run_dir, state = earlier, earlier.state()
        judged_before = len(state.history)
        say(f"{spec.name}: run {run_dir.root.name} finished earlier ({state.stopped}): reused; "
            "`astra eval --fresh` runs it again")
    else:
        judged_before = 0
        if earlier is not None:
            state = earlier.state()
            judged_before = len(state.history)
            say(f"{spec.name}: run {earlier.root.name} was cut off after {len(state.history)} candidate(s)"
                + (f" ({state.stopped})" if state.stopped else "") + ": continuing it")
        run_opts = replace(opts, resume=earlier.root.name) if earlier is not None else opts
        run_dir, state = run_optimize(spec, tree, run_opts, say=say, events=events)
    entry = row(run_dir, spec)
    if state.best is not None and not opts.dry_run:
        entry["patch"] = emit_best_patch(run_dir, spec, tree, sanitizer_required=opts.sanitizer)
    entry.update(judged=state.judged(judged_before), wall_s=time.monotonic() - began, where=None, error=None)
    return entry


def eval_one(spec_file: str, sglang_version: str | None, sglang_src: str | None, opts: OptimizeOptions,
             fresh: bool = False, *, say=print, events=None) -> dict:
    """`eval_kernel` from plain arguments, so that a worker can run it (astra.scale): the spec resolved from
    its file, the tree chosen as the command line would (astra.spec.trees). Raises what the run raises."""
    from astra.spec.resolve import resolve

    spec = resolve(spec_file)
    return eval_kernel(spec, tree_for(spec, sglang_version, sglang_src), opts, fresh=fresh, say=say, events=events)


Evaluate = Callable[..., dict]  # eval_one's signature: (spec_file, sglang_version, sglang_src, opts, fresh, *, say, events)


def in_worker(evaluate: Evaluate, name: str, spec_file: str, sglang_version: str | None, sglang_src: str | None,
              opts: OptimizeOptions, fresh: bool, events) -> dict:
    """What an executor's worker runs for one kernel: `evaluate` (eval_one) with its lines printed on the
    worker's own stdout (the driver's terminal, or Ray's log forwarding), each naming the kernel; `events`
    (a picklable printer, or None) gets every event with the kernel added as data["kernel"]. The kernel's
    loop sees the one GPU of this worker (CUDA_VISIBLE_DEVICES), so it judges its candidates there."""
    def say(text: str) -> None:
        print(text if text.startswith(f"{name}:") else f"{name}: {text}", flush=True)

    def tagged(kind: str, data: dict) -> None:
        events(kind, {**data, "kernel": name})

    device = os.environ.get("CUDA_VISIBLE_DEVICES")
    say(f"started on {host()}" + (f":gpu{device}" if device else ""))
    return evaluate(spec_file, sglang_version, sglang_src, opts, fresh, say=say,
                    events=tagged if events is not None else None)


def error_row(kernel: str, error: str) -> dict:
    """The row of a kernel whose evaluation failed (raised, or its worker died twice): nothing measured."""
    return {"kernel": kernel, "lines_before": None, "lines_after": None, "lines_changed": None, "us_before": None,
            "us_after": None, "bands": {}, "speedup": None, "worst_shape": None, "correct": None, "candidates": None,
            "agent": None, "run": None, "patch": None, "judged": 0, "wall_s": None, "where": None, "error": error}


def eval_executor(ray: str | None, gpus: int | None, kernels: int) -> Executor | None:
    """Where `astra eval` runs its kernels: None for this process (one GPU visible, or one kernel: its loop
    then judges candidates on every GPU), else an astra.scale executor with one GPU worker per kernel at a
    time: on Ray (`ray` "auto" or an address; `gpus` caps the tasks in flight), or on this host (`gpus` at
    most, default every visible GPU)."""
    if gpus is not None and gpus < 1:
        raise BadInput(f"--gpus {gpus}: give 1 or more")
    from astra.scale import make_executor

    if ray:
        return make_executor(ray=ray, gpus=gpus)
    visible = len(visible_gpus())
    workers = min(visible, gpus or visible, kernels)
    return make_executor(gpus=workers) if workers > 1 else None


def run_eval(specs: list[KernelSpec], opts: OptimizeOptions, *, sglang_version: str | None = None,
             sglang_src: str | None = None, fresh: bool = False, executor: Executor | None = None,
             evaluate: Evaluate = eval_one, say=print, events=None) -> dict:
    """Every spec's evaluation (`evaluate`, eval_one: reuse, resume or run, see the module's docstring) on the
    tree astra.spec.trees gives for (sglang_version, sglang_src): in this process one after another, or with
    an `executor` (`eval_executor`) one GPU task per kernel, at once. Rows come in the order of `specs`; with
    an executor a kernel whose task raised or whose worker died twice is a row with its `error` (the others go
    on), and `events` must be picklable (a top-level function). Returns `summary(rows, wall seconds)`."""
    began = time.monotonic()
    if executor is None:
        rows = [evaluate(str(spec.path), sglang_version, sglang_src, opts, fresh, say=say, events=events)
                for spec in specs]
    else:
        rows = _distributed(specs, opts, sglang_version, sglang_src, fresh, executor, evaluate, say, events)
    return summary(rows, time.monotonic() - began)


def _distributed(specs, opts, sglang_version, sglang_src, fresh, executor, evaluate, say, events) -> list[dict]:
    from astra.scale import Task

    kind = "cpu" if opts.dry_run else "gpu"  # a dry run only builds
    tasks = [Task(spec.name, in_worker, (evaluate, spec.name, str(spec.path), sglang_version, sglang_src, opts,
                                         fresh, events), kind) for spec in specs]
    done: dict[str, dict] = {}
    for out in executor.map(tasks):
        if out.ok:
            done[out.key] = {**out.value, "where": out.where}
            took = out.value.get("wall_s")
            say(f"{out.key}: finished on {out.where}" + (f" in {took:.0f} s" if took is not None else "")
                + (f" (attempt {out.attempts})" if out.attempts > 1 else ""))
        else:
            error = one_line(f"{out.error} (on {out.where or 'a worker'}, {out.attempts} attempt(s))", 400)
            done[out.key] = {**error_row(out.key, error), "where": out.where or None}
            say(f"{out.key}: FAILED: {error}")
    return [done.get(spec.name) or error_row(spec.name, "no result came back") for spec in specs]


def summary(rows: list[dict], wall_s: float) -> dict:
    """The evaluation's result: its rows; the geometric mean of their speedups; `wall_s`; `candidates` (the
    rows' runs hold, reused ones included); `judged`, the candidates judged in these `wall_s` (a reused run
    adds none) and `judged_per_hour`, from those; `failed`, the kernels with an error."""
    judged = sum(r.get("judged") or 0 for r in rows)
    return {"rows": rows, "geomean_speedup": positive_geomean([r["speedup"] for r in rows]), "wall_s": wall_s,
            "candidates": sum(r.get("candidates") or 0 for r in rows), "judged": judged,
            "judged_per_hour": per_hour(judged, wall_s), "failed": [r["kernel"] for r in rows if r.get("error")]}
