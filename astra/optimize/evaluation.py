"""`astra eval`: the optimize loop over several kernels, summarised in the shape of the Astra paper's
Table 2 (kernel, lines before and after, time before and after, speedup, correct), so any model or the
offline agent can be compared with the paper's 1.32x average.

Time is the geometric mean over the spec's timed shapes of the graph-mode medians (the serving view);
"after" is the best verified candidate's, "before" the original's, both from that candidate's verdict
(measured interleaved in one worker). A kernel whose run verified nothing keeps its original: speedup
1.0, as the loop never ships an unverified change.
"""

from __future__ import annotations

from astra.optimize.rundir import RunDir
from astra.optimize.session import OptimizeOptions, run_optimize
from astra.spec.model import KernelSpec
from harness import Verdict, geomean


def positive_geomean(values: list[float | None]) -> float | None:
    """harness.geomean over the positive values; None when there are none."""
    values = [v for v in values if v and v > 0]
    return geomean(values) if values else None


def _times(verdict: Verdict | None, side: str) -> float | None:
    return positive_geomean([c.median_us("graph", side) for c in (verdict.cases if verdict else []) if c.timed])


def row(run: RunDir, spec: KernelSpec) -> dict:
    state = run.state()
    original = run.original()
    best_source, _, verdict = run.candidate(state.best) if state.best else (original, None, None)
    before = _times(verdict, "orig") if verdict else _times(run.baseline(), "orig")
    after = _times(verdict, "cand") if verdict else before
    return {"kernel": spec.name, "lines_before": len(original.splitlines()), "lines_after": len(best_source.splitlines()),
            "us_before": before, "us_after": after,
            "speedup": (before / after) if before and after else None,
            "correct": bool(verdict and verdict.status == "correct") if state.best else None,
            "candidates": len(state.history), "run": run.root.name}


def run_eval(specs: list[KernelSpec], tree_for, opts: OptimizeOptions, *, say=print, events=None) -> dict:
    """The loop over each spec (`tree_for(name)` gives its SGLang tree); {rows, geomean_speedup}."""
    rows = []
    for spec in specs:
        run_dir, _ = run_optimize(spec, tree_for(spec.name), opts, say=say, events=events)
        rows.append(row(run_dir, spec))
    return {"rows": rows, "geomean_speedup": positive_geomean([r["speedup"] for r in rows])}
