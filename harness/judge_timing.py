"""The judge's half of timing: the environment it measures itself, and the candidate's numbers checked.

The candidate process (harness.candidate, phase `timing`) times both sides interleaved, because that is
where both modules may be loaded. Its numbers are untrusted: `apply_timings` keeps a mode only when both
sides' statistics are finite, positive and ordered (harness.exchange.valid_stats), and computes the
speedup, its noise, both floors and the suspect flags here from the judge's own environment
(`collect_env`: the GPU's performance model, harness.perf_model, measured in a judge and cached per GPU;
the floors, harness.roofline). The input rotation of graph mode is recomputed here from the job, never
taken from the candidate's `info`. A copy of each shape's bytes is timed here too (a reference). A mode that could not be measured (out of memory, the original's capture failing,
missing or malformed numbers) is returned as an "incomplete" reason; the candidate's own capture
failing fails its case, as before.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import torch

from harness.envinfo import driver_version
from harness.exchange import Malformed, read_timings, valid_stats
from harness.inputs import storage_numel
from harness.job import Case, Job, dtype_size
from harness.perf_model import PerfModel, for_device
from harness.roofline import copy_floor, floor_entry, floors, roofline_entry, suspect
from harness.stats import speedup
from harness.timing import l2_bytes, sets_needed
from harness.toolchain import BuildFailure, nvcc_release, tvm_ffi_version
from harness.verdict import CaseResult, ModeTiming


def collect_env(device: torch.device, cache_dir: str | Path | None = None) -> dict[str, Any]:
    """GPU, toolkit and library versions, L2 size and the performance model (cached under `cache_dir`),
    with its copy bandwidth and launch floors also under their older names."""
    props = torch.cuda.get_device_properties(device)
    try:
        nvcc = "%d.%d" % nvcc_release()
    except BuildFailure:
        nvcc = None
    env = {"gpu": props.name, "capability": f"{props.major}.{props.minor}", "sm_count": props.multi_processor_count,
           "memory_bytes": props.total_memory, "l2_bytes": l2_bytes(device), "driver": driver_version(),
           "cuda_runtime": torch.version.cuda, "nvcc": nvcc, "torch": torch.__version__, "tvm_ffi": tvm_ffi_version()}
    model = for_device(device, cache_dir)
    env["perf_model"] = model.to_dict()
    env["copy_bandwidth_Bps"] = model.copy_Bps
    env["launch_floor_us"], env["cold_launch_floor_us"] = model.launch_graph_us, model.launch_cold_us
    return env


def rotation_sets(case: Case, l2: int) -> int:
    """The input sets graph mode cycles through for `case`, as harness.timing sizes them: whole storages
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
