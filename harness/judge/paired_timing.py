"""The judge's timing of one case in one view: the original in the judge, the candidate in its own process,
interleaved sample by sample, every timed launch verified.

Candidate code never runs in the judge, and the original never runs where candidate code is loaded: the
original is timed by a `harness.timing_side.TimingSide` in the judge process (which loads only original
modules), the candidate by the same class in the candidate process, driven over pipes
(`harness.timing_link.RemoteSide`). Both sides get the same sets (harness.timed_sets), the same restore,
flush, events and synchronisation per sample, so the views mean what they meant (harness.timing):

- `graph`: a replay of one CUDA graph per side holding one launch per set, a sample's time divided by the
  launches. The sets are as many as make a replay last MIN_REPLAY_US on the slower side's eager estimate,
  bounded by memory (`sets_budget`) and MAX_GRAPH_SETS; no set is read twice within a replay, and L2 is
  flushed before every replay, so no launch finds its inputs in L2.
- `cold`: one launch per sample after an L2 flush, each side cycling through COLD_SETS sets (fewer when memory
  is short), so that every set holds the outputs of its latest launch.

Blocks: a view is timed in harness.timing.placement's BLOCKS blocks; before each, both sides place their sets
anew behind pads of one random layout (where the sets land moves a µs kernel's time by whole timer ticks), so
the placement is sampled like any other random factor; `info.block_ratios` holds each block's ratio of
medians, from which the judge widens the case's noise band (harness.judge.timings.placement_noise).

Order: ABBA by rounds (o c, c o, o c, ...), consecutive samples of one side run as one turn. In the graph view
a round is one sample per side; in the cold view COLD_TURN, so a turn is at most COLD_SETS samples: since a
cold side cycles through its sets, a verification sees every launch of the side's last turn (with a single
set, when memory is short, rounds are one sample and a verification sees a turn's last launch). Before each of
the original's turns the candidate process is stopped and the GPU checked quiet (harness.quiet_gpu: an
`Interference` rejects the candidate); before each command to the candidate it is resumed. The stop rule is
harness.timing's (`stop_reason`) over both sides' samples of the block, with the block's share of the case's
budget per side, checked every BATCH rounds and at the round where each side first has `min_samples` (rounded up
to an even number of rounds, so each side goes first as often as the other): a block that converges stops at its
minimum instead of at the next multiple of BATCH.

Verification (harness.timed_outputs.LaunchCheck): after one round drawn at random among the first
`min_samples` rounds of a block drawn at random, and after the last sample of every block, both sides'
digests of every set (every launch of the replay) are compared; a set whose outputs differ from the original's is compared by value (the candidate
writes its outputs to the work directory) where bit-for-bit equality is not required. A difference fails the
case, naming the view and the launch.

`time_view` returns the entry the verdict has always carried ({"orig": Stats, "cand": Stats, "info": {...}}, or
{"error", "side", "kind"} when a side could not be timed) and the verification's failures.
"""

from __future__ import annotations

import math
import random
import time
from dataclasses import dataclass, field
from typing import Any, Callable

import torch

from harness.judge.correctness import ensure_usable
from harness.judge.phase_clock import PhaseClock
from harness.timing import modes
from harness.timing.modes import (
    BATCH,
    COLD_MIN_SAMPLES,
    MAX_SAMPLES,
    MIN_REPLAY_US,
    MIN_SAMPLES,
    CaptureError,
    sampling_settings,
    stop_reason,
)
from harness.timing.placement import layout_seeds
from harness.timing.quiet_gpu import GroupPause, Interference, ProcessGone, QuietGpu
from harness.timing.stats import Stats, median
from harness.timing.timed_sets import set_footprint, timing_seeds
from harness.timing.timing_link import LinkBroken, SideFailed

MAX_GRAPH_SETS = 4096
COLD_TURN = 4  # cold samples per side and round: turns of up to 8 samples, over COLD_SETS = 2 x COLD_TURN sets
COLD_SETS = 2 * COLD_TURN
SETS_MAX_BYTES = 8 << 30  # per side: the original's sets in the judge, the candidate's in its process
SETS_FREE_SHARE = 0.25  # of the GPU memory free in the judge when a view starts


@dataclass
class Pair:
    """The two sides of one case: `orig` in this process, `cand` (a RemoteSide, or a local side in tests);
    `pause` stops the candidate process between its turns, `quiet` checks the GPU before the original's."""

    orig: Any
    cand: Any
    pause: GroupPause | None = None
    quiet: QuietGpu | None = None
    clock: PhaseClock = field(default_factory=PhaseClock)  # where the timing's seconds go (the verdict's phases)

    def hold_candidate(self) -> None:
        """Before the original's turn: the candidate process stopped, the GPU quiet."""
        if self.pause is not None and not self.pause.stopped:
            self.pause.stop()
        if self.quiet is not None:
            self.quiet.wait()

    def release_candidate(self) -> None:
        if self.pause is not None:
            self.pause.resume()

    def both(self, method: str, *args: Any) -> tuple[Any, Any]:
        """`method(*args)` of both sides: the candidate's (a remote side) asked first and carried out in its
        process while the original's runs here, else one after the other. Only for what is not timed: the
        sides' sets made and warmed up (`prepare`), their digests (`digests`). The clock gets the original's
        part (`<method>_orig`) and the wait for the candidate's after it (`<method>_cand`)."""
        start = getattr(self.cand, f"start_{method}", None)
        if start is None:
            with self.clock(f"{method}_orig"):
                mine = getattr(self.orig, method)(*args)
            with self.clock(f"{method}_cand"):
                return mine, getattr(self.cand, method)(*args)
        collect = start(*args)
        try:
            with self.clock(f"{method}_orig"):
                mine = getattr(self.orig, method)(*args)
        except BaseException:
            try:
                collect()  # the reply is read, so the link stays in step for whatever comes next
            except (LinkBroken, SideFailed):
                pass
            raise
        with self.clock(f"{method}_cand"):
            return mine, collect()


@dataclass
class ViewOutcome:
    """One view of one case: the entry for the verdict and what verification found."""

    entry: dict[str, Any]
    failures: list[str] = field(default_factory=list)


def sets_budget(device: torch.device) -> int:
    """Bytes one side may hold in timed sets: a share of the GPU memory free now, at most SETS_MAX_BYTES."""
    if device.type != "cuda":
        return SETS_MAX_BYTES
    free, _ = torch.cuda.mem_get_info(device)
    return int(min(SETS_MAX_BYTES, SETS_FREE_SHARE * free))


def graph_sets(estimate_us: float, footprint: int, budget: int) -> int:
    """Launches (= sets) per graph replay: enough to last MIN_REPLAY_US, within `budget` bytes and
    MAX_GRAPH_SETS, at least one."""
    wanted = math.ceil(MIN_REPLAY_US / max(estimate_us, 1e-3))
    room = budget // footprint if footprint > 0 else MAX_GRAPH_SETS
    return max(1, min(wanted, MAX_GRAPH_SETS, room))


def cold_sets(footprint: int, budget: int) -> int:
    """Sets of a cold view: COLD_SETS, fewer when they do not fit in `budget` bytes, at least one."""
    room = budget // footprint if footprint > 0 else COLD_SETS
    return max(1, min(COLD_SETS, room))


def minimum_rounds(min_samples: int, per_round: int) -> int:
    """The first round after which each side has `min_samples` samples (`per_round` a round), rounded up to an
    even number of rounds: ABBA then has each side first as often as the other."""
    return 2 * math.ceil(min_samples / (2 * max(1, per_round)))


def abba(first_round: int, end_round: int, per_round: int = 1) -> list[tuple[str, int]]:
    """Turns (side, samples) of rounds [first_round, end_round), each side `per_round` samples a round:
    o c, c o, o c, ..., runs of one side merged (so a turn is at most 2 x per_round samples)."""
    order: list[str] = []
    for r in range(first_round, end_round):
        order += ["orig", "cand"] if r % 2 == 0 else ["cand", "orig"]
    turns: list[tuple[str, int]] = []
    for side in order:
        if turns and turns[-1][0] == side:
            turns[-1] = (side, turns[-1][1] + per_round)
        else:
            turns.append((side, per_round))
    return turns


def time_view(case, view: str, pair: Pair, options, make_check: Callable[[list[int]], Any],
              device: torch.device, rng: random.Random | None = None) -> ViewOutcome:
    """Time `case` in `view` on both sides of `pair` and verify the timed launches (see the module docstring).
    `make_check(seeds)` gives the LaunchCheck of this view's sets. Raises LinkBroken, ProcessGone or
    Interference (the candidate process failed or interfered); a side that cannot be timed gives an entry
    with an error instead."""
    rng = rng or random.Random()
    broken = False
    try:
        return _time_view(case, view, pair, options, make_check, device, rng)
    except (LinkBroken, ProcessGone, Interference):
        broken = True
        raise
    except SideFailed as error:
        return ViewOutcome({"error": str(error)[:300], "side": "cand", "kind": error.kind})
    except CaptureError as error:  # the original's capture (the candidate's comes as SideFailed)
        return ViewOutcome({"error": str(error)[:300], "side": error.side, "kind": "capture"})
    except torch.cuda.OutOfMemoryError as error:
        torch.cuda.empty_cache()
        return ViewOutcome({"error": str(error).strip().splitlines()[0][:300], "side": None, "kind": "oom"})
    except RuntimeError as error:
        ensure_usable(device, error, f"{case.id}: {view} timing")
        return ViewOutcome({"error": str(error).strip()[:300], "side": None, "kind": "other"})
    finally:
        with pair.clock("close"):
            pair.orig.close()
            if not broken:
                try:
                    pair.cand.close()
                except SideFailed:
                    pass  # a side that cannot free its sets changes no number; the next command shows the rest


def _time_view(case, view: str, pair: Pair, options, make_check, device: torch.device,
               rng: random.Random) -> ViewOutcome:
    seeds = timing_seeds(options.seeds, 1)
    estimate = None
    if view == "graph":
        with pair.clock("estimate"):
            estimate = max(pair.orig.estimate(seeds[0]), pair.cand.estimate(seeds[0]))
        seeds = timing_seeds(options.seeds, graph_sets(estimate, set_footprint(case), sets_budget(device)))
    else:
        seeds = timing_seeds(options.seeds, cold_sets(set_footprint(case), sets_budget(device)))
    # a cold side cycles through its sets, so a verification sees its last len(seeds) launches: a turn is
    # never longer than that (one set: turns of one or two samples, as a turn's last launch is all it sees)
    per_round = 1 if view == "graph" else max(1, len(seeds) // 2)
    min_samples = MIN_SAMPLES if view == "graph" else COLD_MIN_SAMPLES
    layouts = layout_seeds(rng)
    check = make_check(seeds)  # one per view: outputs already compared by value are not fetched again
    probe = (rng.randrange(len(layouts)), rng.randrange(max(1, min_samples // per_round)))  # (block, round) verified
    samples: dict[str, list[float]] = {"orig": [], "cand": []}
    failures: list[str] = []
    verified: list[str] = []
    block_ratios: list[float] = []
    waited = pair.quiet.waited_s if pair.quiet is not None else 0.0
    info: dict[str, Any] = {}
    rounds, stops = 0, []
    raw: dict[str, list[list[float]]] = {"orig": [], "cand": []}
    for block, layout in enumerate(layouts):
        with pair.clock("prepare"):
            info = dict(pair.both("prepare", view, seeds, layout)[0])
        block_probe = probe[1] if probe[0] == block else None
        taken, stop = sample_block(pair, options, check, min_samples, block_probe, block, len(layouts),
                                    failures, verified, per_round)
        rounds += taken["rounds"]
        stops.append(stop)
        block_ratios.append(median(taken["orig"]) / median(taken["cand"]))
        for side in samples:
            samples[side] += taken[side]
            raw[side].append([round(v, 4) for v in taken[side]])
    info.update({"stop": stops[-1], "rounds": rounds, "verified": verified, "seeds": [seeds[0], seeds[-1]],
                 "blocks": len(layouts), "block_ratios": [round(r, 5) for r in block_ratios],
                 **sampling_settings(None)})
    if estimate is not None:
        info["estimate_us"] = estimate
    if modes.RAW_SAMPLES:  # a diagnostic (ASTRA_TIMING_RAW_SAMPLES=1)
        info["raw_us"] = raw  # per side, per placement block, in sampling order
    if pair.quiet is not None:
        info["quiet_wait_ms"] = round((pair.quiet.waited_s - waited) * 1000.0, 3)
        info["quiet_bound_us"] = round(pair.quiet.bound_us, 1)
    entry = {side: Stats.from_samples(values).to_dict() for side, values in samples.items()}
    entry["info"] = info
    return ViewOutcome(entry, failures)


def sample_block(pair: Pair, options, check, min_samples: int, probe: int | None, block: int, blocks: int,
                  failures: list[str], verified: list[str], per_round: int = 1) -> tuple[dict[str, Any], str]:
    """Block `block` of `blocks`: ABBA rounds until the stop rule holds on this block's samples (its share
    of the budget); verifies after round `probe` (None: not in this block) and after the block's last sample."""
    samples: dict[str, list[float]] = {"orig": [], "cand": []}
    budget_s = options.budget_ms_per_case / 1000.0 * 2 / blocks
    rounds, stop, start, verifying = 0, None, time.perf_counter(), 0.0
    last_label = "the last sample" if block == blocks - 1 else f"the last sample of block {block + 1}"
    minimum = minimum_rounds(min_samples, per_round)
    while stop is None:
        end = rounds + BATCH if rounds >= minimum else min(rounds + BATCH, minimum)
        if probe is not None and rounds <= probe < end:
            end = probe + 1
        for side, count in abba(rounds, end, per_round):
            if side == "orig":
                with pair.clock("hold"):
                    pair.hold_candidate()
                with pair.clock("orig_turns"):
                    samples["orig"] += pair.orig.sample(count)
            else:
                with pair.clock("cand_turns"):
                    samples["cand"] += pair.cand.sample(count)
        rounds = end
        stop = stop_reason(samples, time.perf_counter() - start - verifying, budget_s, options.target_rel_stderr,
                           min_samples, MAX_SAMPLES)
        if probe is not None and rounds == probe + 1:
            label = f"sample {rounds}" if stop is None else last_label
            mark = time.perf_counter()
            with pair.clock("verify"):
                failures += check.verify(label, *pair.both("digests"))
            verified.append(label)
            verifying += time.perf_counter() - mark  # not the sampling budget's
    if verified[-1:] != [last_label]:
        with pair.clock("verify"):
            failures += check.verify(last_label, *pair.both("digests"))
        verified.append(last_label)
    return {**samples, "rounds": rounds}, stop
