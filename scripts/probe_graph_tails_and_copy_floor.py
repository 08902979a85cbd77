"""Probe two timing questions on a GPU with torch kernels only (seconds), printing one table each.

1. Graph-mode upper tail: is it the first sample after each synchronisation (GPU idle while the host
   enqueues)? The same elementwise op is timed with the pre-batch spin off and on; `batch_position`
   says where the slow samples fall.
2. Copy floor: is `copy_reference.copy_floor` proportional to bytes and stable across calls in one process?

Usage (GPU machine, repository root): python3 scripts/probe_graph_tails_and_copy_floor.py [--json OUT] [--copy-only]
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import torch  # noqa: E402

from harness.timing import modes as timing_mod  # noqa: E402
from harness.timing.copy_reference import copy_floor  # noqa: E402
from harness.timing.modes import time_graph  # noqa: E402

CONFIGS = (("old: no spin, gc on", 0.0, False), ("no spin, gc paused", 0.0, True), ("new: auto spin, gc paused", None, True))


def tail_probe(tokens: int, width: int, spin_us: float | None, pause_gc: bool) -> dict:
    """A silu_and_mul-sized elementwise op (x[:, :d] * x[:, d:] into out), graph mode, one configuration."""
    timing_mod.PAUSE_GC = pause_gc
    def make(_: int):
        x = torch.randn(tokens, 2 * width, dtype=torch.bfloat16, device="cuda")
        return [x, torch.empty(tokens, width, dtype=torch.bfloat16, device="cuda")]

    op = lambda a: torch.mul(a[0][:, :width], a[0][:, width:], out=a[1])  # noqa: E731
    nbytes = tokens * width * 2 * 3
    timing = time_graph({"a": op, "b": op}, make, nbytes, budget_ms=300.0, keep_busy_us=spin_us)
    out = {"shape": f"{tokens}x{width}", "spin_us": spin_us, "pause_gc": pause_gc, "stop": timing.info["stop"],
           "launches_per_sample": timing.info["launches_per_sample"]}
    for side, stats in timing.stats.items():
        pos = timing.info["batch_position"].get(side, {})
        out[side] = {"n": stats.n, "p10": stats.p10_us, "median": stats.median_us, "p90": stats.p90_us, **pos}
    return out


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--json", type=Path)
    parser.add_argument("--copy-only", action="store_true", help="only the copy-floor table")
    args = parser.parse_args()
    print(f"GPU: {torch.cuda.get_device_name()}")
    tails = []
    for t, w in (() if args.copy_only else ((1024, 14336), (4096, 14336), (8, 8192))):
        for label, spin, pause in CONFIGS:
            tails.append({"config": label, **tail_probe(t, w, spin, pause)})
    timing_mod.PAUSE_GC = True
    print("\n== graph-mode tail by configuration (side a; b is the same op); us per launch ==")
    print(f"{'shape':>11} {'config':>26} {'p10':>8} {'median':>8} {'p90':>8} {'first':>8} {'others':>8} {'slow':>5} {'1st':>4}")
    for row in tails:
        a = row["a"]
        print(f"{row['shape']:>11} {row['config']:>26} {a['p10']:>8.2f} {a['median']:>8.2f} {a['p90']:>8.2f} "
              f"{a.get('first_after_sync_us', 0):>8.2f} {a.get('others_us', 0):>8.2f} "
              f"{a.get('slow_samples', 0):>5} {a.get('slow_first', 0):>4}")
    floors = []
    # sizes the bench's copy floor used (spec bytes formulas) and powers of two; memcpy vs an SM kernel
    sizes = (("fused 16384x4096", 536879104), ("rmsnorm 16384x8192", 536887296), ("rmsnorm 16384x5120", 335554560),
             ("2^29", 536870912), ("2^28", 268435456), ("16.8MB", 16777216))
    for label, nbytes in sizes:
        for method in ("memcpy", "kernel"):
            stats = copy_floor(nbytes, budget_ms=60.0, method=method)
            floors.append({"label": label, "method": method, "bytes": nbytes, "median_us": stats.median_us,
                           "p10": stats.p10_us, "p90": stats.p90_us, "TBps": nbytes / stats.median_us / 1e6})
    print("\n== copy floor (graph mode, rotating inputs): cudaMemcpy (tensor.copy_) vs an elementwise SM kernel ==")
    print(f"{'size':>20} {'method':>7} {'median us':>10} {'p10':>8} {'p90':>8} {'TB/s':>6}")
    for row in floors:
        print(f"{row['label']:>20} {row['method']:>7} {row['median_us']:>10.2f} {row['p10']:>8.2f} {row['p90']:>8.2f} "
              f"{row['TBps']:>6.2f}")
    if args.json:
        args.json.write_text(json.dumps({"gpu": torch.cuda.get_device_name(), "tails": tails, "copy_floor": floors},
                                        indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
