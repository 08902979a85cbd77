"""The judge's half of timing: the paired timing of every timed case, the environment it measures itself, and
the numbers turned into speedups, floors and suspect flags.

`time_cases` times each timed case in each view with the original in this process and the candidate in its
candidate process (harness.judge.paired_timing), and verifies every timed launch (harness.judge.timed_outputs): a
difference fails the case. `apply_timings` keeps a view only when both sides' statistics are finite, positive
and ordered (harness.candidate.exchange.valid_stats), and computes the speedup, its noise, both floors and the suspect
flags from the judge's own environment (the `env` of harness.environment.measured: the GPU's performance
model, harness.timing.perf_model, measured in a judge and cached per GPU; the floors, harness.timing.roofline). The graph view's input sets are the
count the judge chose (`info.input_sets`). A copy of each shape's bytes is timed here too (a reference). A
view that could not be measured (out of memory, the original's capture failing) is returned as an
"incomplete" reason; the candidate's own capture failing fails its case, as before.
"""

from __future__ import annotations

import logging
import math
import shutil
from pathlib import Path
from typing import Any, Callable

import torch

from harness.candidate.exchange import Malformed, read_trial, valid_stats
from harness.job import TIMING_MODES, Case, Job, dtype_size
from harness.judge.inputs import storage_numel
from harness.judge.paired_timing import Pair, time_view
from harness.judge.phase_clock import PhaseClock
from harness.judge.timed_outputs import Checked, LaunchCheck, dump_dir
from harness.judge.verdict import CaseResult, ModeTiming
from harness.timing.copy_reference import copy_floor
from harness.timing.modes import sets_needed
from harness.timing.perf_model import PerfModel
from harness.timing.quiet_gpu import QuietGpu
from harness.timing.roofline import floor_entry, floors, roofline_entry, suspect
from harness.timing.stats import speedup
from harness.timing.timing_side import TimingSide

log = logging.getLogger(__name__)


def time_cases(job: Job, results: list[CaseResult], checked: dict[str, Checked], orig_launches: dict[str, Any],
               run, device: torch.device, quiet: QuietGpu | None, reference=None,
               clock: PhaseClock | None = None) -> dict[str, dict[str, Any]]:
    """Every timed case in every view of the job, paired (harness.judge.paired_timing): {case id: {view: entry}}.
    Verification failures fail their case (notes, when the outputs were not checked: the original timed
    against itself). `run`: the candidate process (harness.candidate_run.CandidateRun, with a link);
    `reference`: the spec's reference (values are judged as the checked calls' are). Raises
    LinkBroken/ProcessGone (the candidate process failed) and Interference. `clock` adds up where the seconds
    go (estimate, prepare, hold, orig_turns, cand_turns, verify, close; within prepare and verify, the
    original's part and the wait for the candidate's: prepare_orig, prepare_cand, digests_orig, digests_cand)."""
    remote = run.remote_side(job.options.case_timeout_s)
    clock = clock if clock is not None else PhaseClock()
    timings: dict[str, dict[str, Any]] = {}
    for index, (case, result) in enumerate(zip(job.cases, results)):
        if not (case.timed and result.timed):
            continue
        log.info("timing %s (%s)", case.id, " and ".join(job.options.modes))
        remote.case = index
        record = checked.get(case.id) if job.options.outputs_checked else None
        orig = TimingSide("orig", orig_launches[case.variant], case, device, job.options.digest_key,
                          reuse_digests=record is not None and record.reusable_orig_digests)
        pair = Pair(orig, remote, run.pause(), quiet, clock)
        timings[case.id] = {}
        for view in job.options.modes:
            if view not in TIMING_MODES:
                timings[case.id][view] = {"error": f"unknown timing mode {view!r}", "side": None, "kind": "unknown"}
                continue

            def make_check(seeds: list[int], case=case, orig=orig, view=view, record=record) -> LaunchCheck:
                return LaunchCheck(case, job, view, seeds, record,
                                   orig.set_args, lambda indices: _fetch(remote, run.work, case, indices, device),
                                   reference)

            outcome = time_view(case, view, pair, job.options, make_check, device)
            timings[case.id][view] = outcome.entry
            for reason in outcome.failures:
                if job.options.outputs_checked:
                    result.fail(reason)
                else:
                    result.notes.append(f"timed launches: {reason}")
        torch.cuda.empty_cache()
    placement_noise(job.cases, timings)
    return timings


def placement_noise(cases: list[Case], timings: dict[str, dict[str, Any]]) -> None:
    """Write into every timed entry's info the relative standard error its ratio owes to placement
    (harness.timing.placement): per view and band, the pooled variance of the cases' log block ratios around each
    case's mean, over the blocks of one case (`placement_rel_stderr`)."""
    groups: dict[tuple[str, str], list[list[float]]] = {}
    for case in cases:
        for view, entry in timings.get(case.id, {}).items():
            ratios = (entry.get("info") or {}).get("block_ratios") if isinstance(entry, dict) else None
            if ratios and all(isinstance(r, (int, float)) and r > 0 for r in ratios):
                groups.setdefault((view, case.band), []).append([math.log(r) for r in ratios])
    spread: dict[tuple[str, str], float] = {}
    for key, logs in groups.items():
        squares = sum((v - sum(ls) / len(ls)) ** 2 for ls in logs for v in ls)
        dof = sum(len(ls) - 1 for ls in logs)
        blocks = max(len(ls) for ls in logs)
        if dof > 0:
            spread[key] = math.sqrt(squares / dof / blocks)
    for case in cases:
        for view, entry in timings.get(case.id, {}).items():
            if isinstance(entry, dict) and (view, case.band) in spread:
                entry.setdefault("info", {})["placement_rel_stderr"] = round(spread[(view, case.band)], 6)


def _fetch(remote, work: Path, case: Case, indices: list[int], device: torch.device) -> dict[int, dict[str, Any]]:
    """The candidate's outputs of timed sets `indices`, written by its process and read here (validated)."""
    entries = remote.dump(indices)
    directory = dump_dir(work)
    try:
        return {i: read_trial(directory, i, {"tensors": entries.get(str(i))}, case, device, prefix="s",
                              outputs_only=True) for i in indices}
    finally:
        shutil.rmtree(directory, ignore_errors=True)


def rotation_sets(case: Case, l2: int) -> int:
    """The input sets graph mode cycles through for `case`, as harness.timing sizes them: whole storages
    of the tensors of one set (an alias once, an absent tensor not at all) against L2. Used for entries
    without the judge's own count (`info.input_sets` of the paired timing)."""
    held = sum(storage_numel(a) * dtype_size(a.dtype) for a in case.tensors() if a.role != "alias")
    return sets_needed(held, l2)


def apply_mode(result: CaseResult, mode: str, entry: Any, env: dict[str, Any], case: Case | None = None) -> str | None:
    """One mode's untrusted numbers into `result`; an "incomplete" reason when it could not be measured.
    `case` gives the split of its bytes and its graph rotation (without it: roles unknown, one set)."""
    where = f"{result.id}: {mode}"
    if not isinstance(entry, dict):
        return f"{where}: no timing from the candidate process"
    if "error" in entry:
        error, kind, side = str(entry.get("error"))[:300], entry.get("kind"), entry.get("side")
        if kind == "capture" and side == "cand":
            result.fail(f"{mode}: {error}")
            return None
        if kind == "unknown":
            result.notes.append(f"{mode}: {error}; skipped")
            return None
        return f"{where}: timing failed ({'out of memory' if kind == 'oom' else kind}): {error}"
    try:
        orig, cand = valid_stats(entry.get("orig")), valid_stats(entry.get("cand"))
    except Malformed as error:
        return f"{where}: {error}"
    info = entry.get("info") if isinstance(entry.get("info"), dict) else {}
    ratio = speedup(orig, cand)
    placement = info.get("placement_rel_stderr")
    placement = float(placement) if isinstance(placement, (int, float)) and math.isfinite(placement) else 0.0
    # the relative standard error of the ratio: each side's sampling, and the placement of the sets
    noise = math.sqrt(orig.rel_stderr ** 2 + cand.rel_stderr ** 2 + max(0.0, placement) ** 2)
    result.timings[mode] = ModeTiming(orig=orig, cand=cand, speedup=ratio, ratio_rel_stderr=noise, info=info)
    model = PerfModel.from_env(env)
    sets, in_place = (rotation_sets(case, model.l2_bytes), case.in_place()) if case is not None else (1, True)
    if isinstance(info.get("input_sets"), int) and info["input_sets"] > 0:  # the judge's own count (paired timing)
        sets = info["input_sets"]
    if case is not None:
        read, written, _ = case.traffic()
    elif result.bytes_read is not None and result.bytes_written is not None:
        read, written = result.bytes_read, result.bytes_written
    else:
        read, written = result.bytes - result.bytes // 2, result.bytes // 2
    floor = floors(mode, read, written, model, sets=sets, in_place=in_place)
    result.floors[mode] = floor_entry(floor, orig.median_us, cand.median_us)
    result.roofline[mode] = roofline_entry(floor, result.bytes, orig, cand)
    why = suspect(ratio, cand.median_us, floor, result.bytes)
    if why:
        result.suspect.append(f"{mode}: {why}")
    return None


def copy_references(job: Job, device: torch.device, busy: Callable[[], bool]) -> dict[str, float | None]:
    """The copy of each timed case's bytes (`copy_us`, graph mode), measured while `busy()` holds: the judge
    measures them while nvcc builds, when the GPU would stand idle. {case id: median us (None: nothing to
    copy)}; the cases not reached before `busy()` turned false are absent (`apply_timings` measures them)."""
    copies: dict[str, float | None] = {}
    if "graph" not in job.options.modes or device.type != "cuda":
        return copies
    for case in job.cases:
        if not busy():
            break
        if case.timed and case.bytes > 0:
            copies[case.id] = _copy_us(case, job, device)
    torch.cuda.empty_cache()
    return copies


def _copy_us(case: Case, job: Job, device: torch.device) -> float | None:
    stats = copy_floor(case.bytes, device, budget_ms=job.options.budget_ms_per_case / 4)
    return stats.median_us if stats else None


def apply_timings(timings: dict[str, Any], job: Job, results: list[CaseResult], env: dict[str, Any],
                  device: torch.device, copies: dict[str, float | None] | None = None) -> list[str]:
    """The paired timings ({case id: {view: entry}}, `time_cases`) into `results`; returns the "incomplete" reasons.
    `copies`: the copy references already measured (`copy_references`), by case id."""
    copies = copies or {}
    incomplete: list[str] = []
    for case, result in zip(job.cases, results):
        result.bytes_read, result.bytes_written, result.bytes_split = case.traffic()
        if not (case.timed and result.timed):
            continue
        per_mode = timings.get(case.id)
        for mode in job.options.modes:
            why = apply_mode(result, mode, per_mode.get(mode) if isinstance(per_mode, dict) else None, env, case)
            if why:
                incomplete.append(why)
        if "graph" in job.options.modes and case.bytes > 0:
            result.copy_us = copies[case.id] if case.id in copies else _copy_us(case, job, device)
            torch.cuda.empty_cache()
    return incomplete
