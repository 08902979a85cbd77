"""Memory roofline: copy bandwidth measured in the worker, achieved bandwidth per shape, suspect flags.

The ceiling is a large device-to-device copy measured on the same GPU in the same process, counting
bytes read plus bytes written (the way the spec's `bytes` formula counts). A kernel that must move B
bytes cannot take less than B / bandwidth (`floor_us`); a candidate measured clearly below that, or
below the cost of an empty launch in a graph, or far faster than the original at once, is suspect:
it probably skips work (an unwritten output that happens to compare equal, a cached result).
"""

from __future__ import annotations

import math
from typing import Any

import torch

from harness.stats import Stats, median
from harness.timing import time_graph

COPY_BYTES = 1 << 30  # bytes moved per copy (read + write): 512 MiB each way
SUSPECT_MARGIN = 0.9  # a time under 0.9 x the floor is suspect
LAUNCH_MARGIN = 0.8  # a graph launch under 0.8 x the empty-kernel time is suspect
MAX_PLAUSIBLE_SPEEDUP = 50.0


def measure_copy_bandwidth(device: torch.device | str | None = None, nbytes: int = COPY_BYTES,
                           repeats: int = 10) -> float:
    """Bytes per second of a D2D copy (read + write counted), median of `repeats` after 2 warm-ups."""
    device = torch.device(device or "cuda")
    half = nbytes // 2
    src = torch.empty(half, dtype=torch.uint8, device=device).fill_(1)
    dst = torch.empty_like(src)
    for _ in range(2):
        dst.copy_(src)
    times_ms = []
    for _ in range(repeats):
        begin, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        begin.record()
        dst.copy_(src)
        end.record()
        end.synchronize()
        times_ms.append(begin.elapsed_time(end))
    del src, dst
    return 2 * half / (median(times_ms) / 1000.0)


COPY_METHODS = {
    "memcpy": lambda a: a[1].copy_(a[0]),  # cudaMemcpyAsync device to device
    "kernel": lambda a: torch.bitwise_or(a[0], 0, out=a[1]),  # an elementwise SM kernel, 16-byte vectors
}


def copy_floor(nbytes: int, device: torch.device | str | None = None, *, budget_ms: float = 100.0,
               method: str = "kernel") -> Stats | None:
    """Graph-mode time of a copy of `nbytes` (read + write; half each way, as int32 words) with the same
    input rotation as the kernels: the practical floor DESIGN.md asks reports to compare against.

    The default copies with an elementwise SM kernel, not cudaMemcpy: on an H200, a captured memcpy
    of sizes off a power of two ran at 2.73-2.75 TB/s (fused_add_rmsnorm 16384x4096: 195.5 us) against
    4.16-4.24 TB/s for the kernel and for power-of-two memcpys (127.6 us for the same bytes)."""
    words = nbytes // 2 // 4  # int32 words read (and as many written)
    if words <= 0:
        return None
    device = torch.device(device or "cuda")

    def make(_: int) -> list[torch.Tensor]:
        return [torch.ones(words, dtype=torch.int32, device=device), torch.empty(words, dtype=torch.int32, device=device)]

    timing = time_graph({"copy": COPY_METHODS[method]}, make, 8 * words, budget_ms=budget_ms, device=device)
    return timing.stats["copy"]


def roofline(nbytes: int, median_us: float, bandwidth: float) -> dict[str, float]:
    """achieved_Bps (bytes / time), fraction (of the copy bandwidth) and floor_us (bytes / bandwidth)."""
    floor_us = nbytes / bandwidth * 1e6 if bandwidth > 0 else 0.0
    achieved = nbytes / (median_us * 1e-6) if median_us > 0 else math.inf
    return {"achieved_Bps": achieved, "fraction": achieved / bandwidth if bandwidth > 0 else 0.0,
            "floor_us": floor_us}


def suspect(speedup: float, cand_us: float, nbytes: int, bandwidth: float, *,
            launch_floor_us: float | None = None, max_speedup: float = MAX_PLAUSIBLE_SPEEDUP) -> str | None:
    """Why a candidate's time is implausible, or None. Flags: below 0.9 x the roofline floor; below
    0.8 x the empty-launch floor (pass it for graph mode only); a speedup over `max_speedup`."""
    floor_us = nbytes / bandwidth * 1e6 if bandwidth > 0 else 0.0
    if floor_us > 0 and cand_us < SUSPECT_MARGIN * floor_us:
        return (f"candidate {cand_us:.3g} us is under the roofline floor {floor_us:.3g} us "
                f"({nbytes} bytes at {bandwidth / 1e12:.2f} TB/s)")
    if launch_floor_us and cand_us < LAUNCH_MARGIN * launch_floor_us:
        return f"candidate {cand_us:.3g} us is under an empty launch's {launch_floor_us:.3g} us"
    if speedup > max_speedup:
        return f"speedup {speedup:.1f}x exceeds the plausible {max_speedup:.0f}x"
    return None


def roofline_entry(nbytes: int, orig: Stats, cand: Stats, bandwidth: float) -> dict[str, Any]:
    """The per-mode roofline record of a case: both sides' fractions and achieved bandwidths."""
    o, c = roofline(nbytes, orig.median_us, bandwidth), roofline(nbytes, cand.median_us, bandwidth)
    return {"floor_us": o["floor_us"], "orig_fraction": o["fraction"], "cand_fraction": c["fraction"],
            "orig_Bps": o["achieved_Bps"], "achieved_Bps": c["achieved_Bps"]}
