"""Summarise graph-mode upper tails from `astra bench --json` files (one per timing configuration):
per file, how many timed shapes have p90 over 1.5 x the median, the worst p90/median, and where the
slow samples (over 2 x the median) fell: first after a synchronisation or not.

Usage: python3 scripts/tails_summary.py OUT/tails_*.json
"""

from __future__ import annotations

import json
import sys
from pathlib import Path


def summarise(path: Path) -> dict:
    data = json.loads(path.read_text())
    tails, worst, slow, slow_first, samples, settings = 0, 1.0, 0, 0, 0, None
    for verdict in data.values():
        for case in verdict.get("cases", []):
            graph = (case.get("timings") or {}).get("graph")
            if not graph:
                continue
            info = graph.get("info", {})
            settings = settings or {k: info.get(k) for k in ("keep_busy_us", "pause_gc")}
            for side in ("orig", "cand"):
                stats = graph[side]
                ratio = stats["p90_us"] / stats["median_us"]
                tails += ratio > 1.5
                worst = max(worst, ratio)
                samples += stats["n"]
                position = info.get("batch_position", {}).get(side, {})
                slow += position.get("slow_samples", 0)
                slow_first += position.get("slow_first", 0)
    return {"file": path.name, "settings": settings, "sides_with_p90_over_1.5x": tails, "worst_p90_over_median": worst,
            "slow_samples": slow, "slow_first_after_sync": slow_first, "samples": samples}


def main(paths: list[str]) -> int:
    print(f"{'file':>24} {'settings':>40} {'p90>1.5x':>9} {'worst':>6} {'slow':>6} {'1st':>5} {'samples':>8}")
    for path in paths:
        row = summarise(Path(path))
        print(f"{row['file']:>24} {json.dumps(row['settings']):>40} {row['sides_with_p90_over_1.5x']:>9} "
              f"{row['worst_p90_over_median']:>6.2f} {row['slow_samples']:>6} {row['slow_first_after_sync']:>5} "
              f"{row['samples']:>8}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
