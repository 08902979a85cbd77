"""Compare two `astra survey` stores case by case: do two runs (e.g. 1 worker and 2 workers) give the same times?

Usage (repository root): python scripts/compare_surveys.py STORE_A STORE_B [--views graph,cold]

For every kernel in both stores and every timed case in both records, the ratio of the original's median
(B over A) per view. Prints one line per kernel (cases, geomean ratio, the widest case ratio, each store's
wall seconds) and a last line over all cases. Reads only the stores' JSON records.
"""

from __future__ import annotations

import argparse
import math
import sys
from pathlib import Path


def records(store: Path) -> dict[str, dict]:
    """{kernel: record} of a store, read as `astra survey` reads it (unreadable files are said, not used)."""
    from astra.survey.store import Store

    found = Store(store)
    out = found.records()
    for problem in found.problems:
        print(f"{store}: {problem}", file=sys.stderr)
    return out


def medians(record: dict, view: str) -> dict[str, float]:
    """{case id: original median us} for the timed cases of a record in a view."""
    out = {}
    for case in ((record.get("verdict") or {}).get("cases") or []):
        timing = ((case.get("timings") or {}).get(view) or {}).get("orig") or {}
        if case.get("timed") and timing.get("median_us"):
            out[case["id"]] = float(timing["median_us"])
    return out


def compare(a: dict[str, dict], b: dict[str, dict], views: list[str]) -> tuple[list[str], list[float]]:
    lines, every = [], []
    for name in sorted(set(a) & set(b)):
        ratios = []
        for view in views:
            ma, mb = medians(a[name], view), medians(b[name], view)
            ratios += [mb[c] / ma[c] for c in sorted(set(ma) & set(mb))]
        every += ratios
        wall = [r.get("wall_s") for r in (a[name], b[name])]
        walls = " / ".join("-" if w is None else f"{w:.0f}" for w in wall)
        if not ratios:
            lines.append(f"{name:40s} no case timed in both")
            continue
        geo = math.exp(sum(math.log(r) for r in ratios) / len(ratios))
        widest = max(ratios, key=lambda r: abs(math.log(r)))
        lines.append(f"{name:40s} {len(ratios):10d} {geo:8.3f} {widest:8.3f}   {walls}")
    return lines, every


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("a", type=Path)
    parser.add_argument("b", type=Path)
    parser.add_argument("--views", default="graph,cold")
    args = parser.parse_args(argv)
    a, b = records(args.a), records(args.b)
    only = sorted(set(a) ^ set(b))
    lines, every = compare(a, b, [v for v in args.views.split(",") if v])
    print(f"{'kernel':40s} {'case-views':>10s} {'B/A geo':>8s} {'widest':>8s}   wall s A / B")
    print("\n".join(lines))
    if only:
        print(f"in one store only: {', '.join(only)}")
    if not every:
        print("no case timed in both stores")
        return 1
    geo = math.exp(sum(math.log(r) for r in every) / len(every))
    within = sum(1 for r in every if abs(r - 1) <= 0.05)
    print(f"all: {len(every)} case-views, B/A geomean {geo:.4f}, {within} within 5%, "
          f"widest {max(every, key=lambda r: abs(math.log(r))):.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
