"""The judge's half of timing: the candidate's numbers checked against the judge's own environment.

The candidate process (harness.candidate.process, phase `timing`) times both sides interleaved, because that
is where both modules may be loaded. Its numbers are untrusted: `apply_timings` keeps a mode only when both
sides' statistics are finite, positive and ordered (harness.candidate.exchange.valid_stats), and computes the
speedup, its noise, both floors and the suspect flags here from the judge's own environment (the `env` of
harness.environment.measured: the GPU's performance model, harness.timing.perf_model, measured in a judge and
cached per GPU; the floors, harness.timing.roofline). The input rotation of graph mode is recomputed here from
the job, never taken from the candidate's `info`. A copy of each shape's bytes is timed here too (a reference,
harness.timing.copy_reference). A mode that could not be measured (out of memory, the original's capture
failing, missing or malformed numbers) is returned as an "incomplete" reason; the candidate's own capture
failing fails its case, as before.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import torch

from harness.candidate.exchange import Malformed, read_timings, valid_stats
from harness.job import Case, Job, dtype_size
from harness.judge.inputs import storage_numel
from harness.judge.verdict import CaseResult, ModeTiming
from harness.timing.copy_reference import copy_floor
from harness.timing.modes import sets_needed
from harness.timing.perf_model import PerfModel
from harness.timing.roofline import floor_entry, floors, roofline_entry, suspect
from harness.timing.stats import speedup


def rotation_sets(case: Case, l2: int) -> int:
    """The input sets graph mode cycles through for `case`, as harness.timing.modes sizes them: whole storages
    of the tensors of one set (an alias once, an absent tensor not at all) against L2."""
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
    noise = math.hypot(orig.rel_stderr, cand.rel_stderr)  # relative standard error of the ratio
    result.timings[mode] = ModeTiming(orig=orig, cand=cand, speedup=ratio, ratio_rel_stderr=noise, info=info)
    model = PerfModel.from_env(env)
    sets, in_place = (rotation_sets(case, model.l2_bytes), case.in_place()) if case is not None else (1, True)
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


def apply_timings(work: Path, job: Job, results: list[CaseResult], env: dict[str, Any],
                  device: torch.device) -> list[str]:
    """The candidate process's timings.json into `results`; returns the "incomplete" reasons."""
    try:
        timings = read_timings(work)
    except Malformed as error:
        return [f"timings: {error}"]
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
            stats = copy_floor(case.bytes, device, budget_ms=job.options.budget_ms_per_case / 4)
            result.copy_us = stats.median_us if stats else None
        torch.cuda.empty_cache()
    return incomplete
