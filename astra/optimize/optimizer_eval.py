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
"""

from __future__ import annotations

import difflib
from dataclasses import replace

from astra import paths
from astra.errors import RunStateError
from astra.optimize.agent_registry import agent_kind
from astra.optimize.driver import emit_best_patch, run_identity, run_optimize
from astra.optimize.options import OptimizeOptions
from astra.optimize.rundir import RunDir, RunState, list_runs
from astra.spec.model import KernelSpec
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


def run_eval(specs: list[KernelSpec], tree_for, opts: OptimizeOptions, *, fresh: bool = False, say=print,
             events=None) -> dict:
    """The loop over each spec (`tree_for(name)` gives its SGLang tree); {rows, geomean_speedup}.
    Earlier runs are reused or resumed unless `fresh` (see the module's docstring)."""
    rows = []
    for spec in specs:
        tree = tree_for(spec.name)
        original = (tree.csrc_dir / spec.kernel_file).read_text()
        earlier = None if fresh or opts.dry_run else earlier_run(spec.name, tree.version, agent_kind(opts), original,
                                                                 run_identity(spec, opts))
        if earlier is not None and finished(earlier.state()):
            run_dir, state = earlier, earlier.state()
            say(f"{spec.name}: run {run_dir.root.name} finished earlier ({state.stopped}): reused; "
                "`astra eval --fresh` runs it again")
        else:
            if earlier is not None:
                state = earlier.state()
                say(f"{spec.name}: run {earlier.root.name} was cut off after {len(state.history)} candidate(s)"
                    + (f" ({state.stopped})" if state.stopped else "") + ": continuing it")
            run_opts = replace(opts, resume=earlier.root.name) if earlier is not None else opts
            run_dir, state = run_optimize(spec, tree, run_opts, say=say, events=events)
        entry = row(run_dir, spec)
        if state.best is not None and not opts.dry_run:
            entry["patch"] = emit_best_patch(run_dir, spec, tree, sanitizer_required=opts.sanitizer)
        rows.append(entry)
    return {"rows": rows, "geomean_speedup": positive_geomean([r["speedup"] for r in rows])}
