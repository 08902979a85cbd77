"""`astra eval`: the optimize loop over several kernels, summarised in the shape of the Astra paper's
Table 2 (kernel, lines before and after, time before and after, speedup, correct), so any model or the
offline agent can be compared with the paper's 1.32x average.

Time is the geometric mean over the spec's timed shapes of the graph-mode medians (the serving view);
"after" is the best verified candidate's, "before" the original's, both from that candidate's verdict
(measured interleaved in one worker). A kernel whose run verified nothing keeps its original: speedup
1.0, as the loop never ships an unverified change.
"""

from __future__ import annotations

import json
from pathlib import Path

from astra import spec as spec_mod, table
from astra.optimize_cmd import run_optimize
from harness.stats import geomean


def _geomean(values: list[float]) -> float | None:
    """harness.stats.geomean over the positive values; None when there are none."""
    values = [v for v in values if v and v > 0]
    return geomean(values) if values else None


def _times(verdict: dict | None, side: str) -> float | None:
    medians = [((c.get("timings", {}).get("graph") or {}).get(side) or {}).get("median_us")
               for c in (verdict or {}).get("cases", []) if c.get("timed")]
    return _geomean([m for m in medians if m])


def row(run, spec) -> dict:
    state = run.state()
    original = run.original()
    best_source, _, verdict = run.candidate(state.best) if state.best else (original, None, None)
    baseline = json.loads((run.root / "baseline.json").read_text()) if (run.root / "baseline.json").exists() else None
    before = _times(verdict, "orig") if verdict else _times(baseline, "orig")
    after = _times(verdict, "cand") if verdict else before
    return {"kernel": spec.name, "lines_before": len(original.splitlines()), "lines_after": len(best_source.splitlines()),
            "us_before": before, "us_after": after,
            "speedup": (before / after) if before and after else None,
            "correct": bool(verdict and verdict.get("status") == "correct") if state.best else None,
            "candidates": len(state.history), "run": run.root.name}


def run(args, tree_for) -> int:
    names = [n.strip() for n in args.kernels.split(",") if n.strip()]
    specs = [spec_mod.load(n) for n in names]
    rows = []
    for spec in specs:
        args.name = spec.name
        run_dir, _ = run_optimize(args, spec, tree_for(spec.name))
        rows.append(row(run_dir, spec))
    speedups = [r["speedup"] for r in rows if r["speedup"]]
    print(table.render(["kernel", "lines before", "lines after", "us before", "us after", "speedup", "correct",
                        "candidates"],
                       [[r["kernel"], r["lines_before"], r["lines_after"], r["us_before"], r["us_after"], r["speedup"],
                         {True: "yes", False: "NO", None: "(original kept)"}[r["correct"]], r["candidates"]]
                        for r in rows]))
    mean = _geomean(speedups)
    print(f"average speedup (geomean over kernels): {'x%.3f' % mean if mean else 'n/a (nothing timed)'}; "
          "the Astra paper reports 1.32x (o4-mini, five rounds, simplified kernels)")
    if args.json:
        Path(args.json).write_text(json.dumps({"rows": rows, "geomean_speedup": mean}, indent=1))
    return 0
