"""The judge's half of timing: the environment it measures itself, and the candidate's numbers checked.

The candidate process (harness.candidate, phase `timing`) times both sides interleaved, because that is
where both modules may be loaded. Its numbers are untrusted: `apply_timings` keeps a mode only when both
sides' statistics are finite, positive and ordered (harness.exchange.valid_stats), and computes the
speedup, its noise, the roofline and the suspect flags here from the judge's own environment
(`collect_env`: copy bandwidth and launch floors measured in the judge). The copy floor per shape is
measured here too. A mode that could not be measured (out of memory, the original's capture failing,
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
from harness.job import Job
from harness.roofline import copy_floor, measure_copy_bandwidth, roofline_entry, suspect
from harness.stats import speedup
from harness.timing import cold_launch_floor, l2_bytes, launch_overhead_floor
from harness.toolchain import BuildFailure, nvcc_release, tvm_ffi_version
from harness.verdict import CaseResult, ModeTiming


def collect_env(device: torch.device) -> dict[str, Any]:
    """GPU, toolkit and library versions, L2 size, copy bandwidth and the empty-launch floor."""
    props = torch.cuda.get_device_properties(device)
    try:
        nvcc = "%d.%d" % nvcc_release()
    except BuildFailure:
        nvcc = None
    env = {"gpu": props.name, "capability": f"{props.major}.{props.minor}", "sm_count": props.multi_processor_count,
           "memory_bytes": props.total_memory, "l2_bytes": l2_bytes(device), "driver": driver_version(),
           "cuda_runtime": torch.version.cuda, "nvcc": nvcc, "torch": torch.__version__, "tvm_ffi": tvm_ffi_version()}
    env["copy_bandwidth_Bps"] = measure_copy_bandwidth(device)
    env["launch_floor_us"] = launch_overhead_floor(device).median_us
    env["cold_launch_floor_us"] = cold_launch_floor(device).median_us
    return env


def apply_mode(result: CaseResult, mode: str, entry: Any, env: dict[str, Any]) -> str | None:
    """One mode's untrusted numbers into `result`; an "incomplete" reason when it could not be measured."""
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
    bandwidth = env["copy_bandwidth_Bps"]
    result.roofline[mode] = roofline_entry(result.bytes, orig, cand, bandwidth)
    floor = env.get("launch_floor_us") if mode == "graph" else None
    why = suspect(ratio, cand.median_us, result.bytes, bandwidth, launch_floor_us=floor)
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
        if not (case.timed and result.timed):
            continue
        per_mode = timings.get(case.id)
        for mode in job.options.modes:
            why = apply_mode(result, mode, per_mode.get(mode) if isinstance(per_mode, dict) else None, env)
            if why:
                incomplete.append(why)
        if "graph" in job.options.modes and case.bytes > 0:
            stats = copy_floor(case.bytes, device, budget_ms=job.options.budget_ms_per_case / 4)
            result.copy_us = stats.median_us if stats else None
        torch.cuda.empty_cache()
    return incomplete
