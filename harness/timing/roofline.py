"""Floors per case and timing view, and the suspect rule.

Two floors, from the GPU's performance model (harness.timing.perf_model), per view (`graph`, `cold`):

- physical (`physical_us`): the time no legitimate kernel beats: the bytes that must cross DRAM in that
  view at the device's peak bandwidth, and never less than an empty launch of that view. A time under it
  is impossible and flags the candidate (`suspect`).
- practical (`practical_us`): bytes read / measured read bandwidth + bytes written / measured write
  bandwidth, not below the empty launch: "how far from done" is time / practical (`x_practical`).

Copy bandwidth is not a floor: a kernel that reads more than it writes beats the copy rate legitimately
(an H100's silu_and_mul 1024x14336 took 27.8 us cold against 31.4 us at copy rate; HBM3 peak 3.35 TB/s).

The bytes that must cross DRAM (`dram_bytes`) are all of them, but for what L2 can legitimately keep:
- graph: the rotation cycles through `sets` input sets; over one cycle, lines resident in L2 throughout
  save at most one crossing per access (two for in-place tensors: a read and a write-back), so at least
  bytes - k x L2 / sets cross per launch (k = 2 with an in-place tensor, else 1). A kernel that touches
  little of large tensors (store_cache scatters 8 MB into 128 MB of cache) keeps its whole cycle in L2.
- cold: L2 is flushed by reading before each launch, so every read crosses; writes may stay dirty in L2
  after the end event, so only what exceeds L2 must: bytes_read + max(0, bytes_written - L2).

Suspect: a candidate under SUSPECT_MARGIN x the DRAM part of the physical floor, under LAUNCH_MARGIN x the
empty launch of its view, or more than MAX_PLAUSIBLE_SPEEDUP x faster than the original. A candidate that
skips half its work falls under the physical floor of the full bytes.

`roofline_entry` keeps the older per-mode record (`floor_us`, `orig_fraction`, `cand_fraction`), now
against the practical floor: fraction = practical_us / time.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any

from harness.timing.stats import Stats

if TYPE_CHECKING:
    from harness.timing.perf_model import PerfModel

SUSPECT_MARGIN = 0.9  # a time under 0.9 x the physical (DRAM) floor is suspect
LAUNCH_MARGIN = 0.8  # a time under 0.8 x the empty launch of its view is suspect
MAX_PLAUSIBLE_SPEEDUP = 50.0
VIEWS = ("graph", "cold")


def dram_bytes(view: str, bytes_read: int, bytes_written: int, *, l2_bytes: int, sets: int = 1,
               in_place: bool = True) -> int:
    """Bytes that must cross DRAM per launch in `view` (see the module docstring)."""
    if view == "cold":
        return bytes_read + max(0, bytes_written - l2_bytes)
    kept = (2 if in_place else 1) * l2_bytes / max(1, sets)
    return max(0, math.ceil(bytes_read + bytes_written - kept))


def floors(view: str, bytes_read: int, bytes_written: int, model: "PerfModel", *, sets: int = 1,
           in_place: bool = True) -> dict[str, Any]:
    """Both floors of one case in one view: physical_us, practical_us and what they rest on."""
    launch = model.launch_us(view)
    dram = dram_bytes(view, bytes_read, bytes_written, l2_bytes=model.l2_bytes, sets=sets, in_place=in_place)
    dram_us = dram / model.floor_Bps * 1e6 if model.floor_Bps > 0 else 0.0
    practical = (bytes_read / model.read_Bps + bytes_written / model.write_Bps) * 1e6 if model.read_Bps > 0 else 0.0
    return {"physical_us": max(dram_us, launch), "practical_us": max(practical, launch), "dram_bytes": dram,
            "dram_us": dram_us, "launch_us": launch, "peak_Bps": model.floor_Bps}


def floor_entry(floor: dict[str, Any], orig_us: float, cand_us: float) -> dict[str, Any]:
    """The verdict's floors[view]: the floors plus both sides' medians and time / practical floor."""
    practical = floor["practical_us"]
    return {**floor, "orig_us": orig_us, "cand_us": cand_us,
            "orig_x_practical": orig_us / practical if practical > 0 else None,
            "cand_x_practical": cand_us / practical if practical > 0 else None}


def suspect(speedup: float, cand_us: float, floor: dict[str, Any], nbytes: int, *,
            max_speedup: float = MAX_PLAUSIBLE_SPEEDUP) -> str | None:
    """Why a candidate's time is implausible, or None: under SUSPECT_MARGIN x the DRAM floor, under
    LAUNCH_MARGIN x an empty launch of the view, or a speedup over `max_speedup`."""
    dram_us, launch = floor.get("dram_us") or 0.0, floor.get("launch_us") or 0.0
    if dram_us > 0 and cand_us < SUSPECT_MARGIN * dram_us:
        return (f"candidate {cand_us:.3g} us is under the physical floor {floor['physical_us']:.3g} us "
                f"({floor['dram_bytes']} of {nbytes} bytes through DRAM at {floor['peak_Bps'] / 1e12:.2f} TB/s)")
    if launch > 0 and cand_us < LAUNCH_MARGIN * launch:
        return f"candidate {cand_us:.3g} us is under the physical floor of an empty launch, {launch:.3g} us"
    if speedup > max_speedup:
        return f"speedup {speedup:.1f}x exceeds the plausible {max_speedup:.0f}x"
    return None


def roofline_entry(floor: dict[str, Any], nbytes: int, orig: Stats, cand: Stats) -> dict[str, float]:
    """The older per-mode record, against the practical floor: floor_us, orig/cand_fraction (practical /
    time) and both sides' achieved bandwidths (bytes / time)."""
    practical = floor["practical_us"]

    def achieved(us: float) -> float:
        return nbytes / (us * 1e-6) if us > 0 else math.inf

    return {"floor_us": practical, "orig_fraction": practical / orig.median_us if orig.median_us > 0 else 0.0,
            "cand_fraction": practical / cand.median_us if cand.median_us > 0 else 0.0,
            "orig_Bps": achieved(orig.median_us), "achieved_Bps": achieved(cand.median_us)}
