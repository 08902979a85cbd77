"""What fewer cold samples would have decided: A/A verdicts (the original against a copy of itself) written with
`ASTRA_TIMING_RAW_SAMPLES=1` keep every paired sample per side and placement block (`info.raw_us`). For each
count k, every timed case's cold speedup is recomputed from the first k samples of each block (the median of
the original's over the median of the candidate's, pooled over the blocks, as the judge pools them), and the
table gives how far from 1 (the truth, A/A) it lands: the mean and the largest |log speedup| over the cases,
and the largest per band. Compare them with the cold view's floor (harness.judge.acceptance.VIEW_FLOOR).

Usage: python3 scripts/cold_sample_count.py VERDICT.json[.gz] ... [--counts 25,50,100,150,200]
"""

from __future__ import annotations

import argparse
import gzip
import json
import math
from pathlib import Path
from statistics import median


def load(path: Path) -> dict:
    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "rt") as handle:
        data = json.load(handle)
    return data.get("verdict", data)


def cold_blocks(verdict: dict) -> list[tuple[str, dict[str, list[list[float]]]]]:
    """(band, raw samples per side and block) of every timed case with raw cold samples."""
    found = []
    for case in verdict.get("cases", []):
        raw = ((case.get("timings") or {}).get("cold") or {}).get("info", {}).get("raw_us")
        if raw:
            found.append((case["band"], raw))
    return found


def speedup_of_first(raw: dict[str, list[list[float]]], k: int) -> float:
    orig = [x for block in raw["orig"] for x in block[:k]]
    cand = [x for block in raw["cand"] for x in block[:k]]
    return median(orig) / median(cand)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("verdicts", nargs="+", type=Path)
    parser.add_argument("--counts", default="25,50,100,150,200")
    args = parser.parse_args(argv)
    counts = [int(k) for k in args.counts.split(",")]
    for path in args.verdicts:
        cases = cold_blocks(load(path))
        if not cases:
            print(f"{path.name}: no raw cold samples (run the check with ASTRA_TIMING_RAW_SAMPLES=1)")
            continue
        least = min(len(block) for _, raw in cases for side in raw.values() for block in side)
        print(f"{path.name}: {len(cases)} timed cases, at least {least} cold samples per side and block")
        bands = sorted({band for band, _ in cases})
        print(f"{'k':>6} {'mean |log|':>11} {'max |log|':>10} " + " ".join(f"{'max ' + b:>13}" for b in bands))
        for k in [*counts, None]:
            devs = [(band, abs(math.log(speedup_of_first(raw, k or 10**9)))) for band, raw in cases]
            per_band = [max(d for b, d in devs if b == band) for band in bands]
            label = "all" if k is None else str(k)
            print(f"{label:>6} {sum(d for _, d in devs) / len(devs):11.4f} {max(d for _, d in devs):10.4f} "
                  + " ".join(f"{d:13.4f}" for d in per_band))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
