"""Copies timed for reference: a copy of a shape's bytes in graph mode (`copy_floor`, the verdict's `copy_us`),
the copy methods the performance model measures its copy bandwidth with (`COPY_METHODS`), and a plain
device-to-device copy's bandwidth (`measure_copy_bandwidth`).

Copy bandwidth is not a floor (harness.timing.roofline): a kernel that reads more than it writes beats the
copy rate legitimately.
"""

from __future__ import annotations

import torch

from harness.timing.modes import time_graph
from harness.timing.stats import Stats, median

COPY_BYTES = 1 << 30  # bytes moved per copy (read + write): 512 MiB each way


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
    input rotation as the kernels: a reference point in reports (`copy_us`), not a floor.

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
