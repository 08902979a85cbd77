"""`evaluate(job) -> Verdict`: build, drop-in check, correctness, timing and roofline of one candidate.

Runs inside one worker process on the GPU (harness.worker starts it). Steps:

1. build the original and the candidate (the original tree with `job.kernel_file` replaced by
   `job.candidate_source`) for every variant the cases use, in parallel, through the build cache;
   with no candidate source the original is checked against itself (speedups measure the noise);
2. drop-in: the candidate exports every name the original does, with the same typed signatures;
3. environment: GPU, versions, copy bandwidth and the empty-launch floor, measured here;
4. correctness of every case (harness.check);
5. timing of the timed cases in every mode of `job.options.modes` (harness.timing), roofline and
   suspect flags per mode, the torch-copy floor per shape, band geomeans and slower shapes.

Failures become verdicts (build_failed, missing_export, signature_mismatch, incorrect, suspect); a
sticky CUDA error raises `check.ContextLost`, which the worker turns into "crashed".
"""

from __future__ import annotations

import logging
import math
import os
import time
from dataclasses import asdict
from pathlib import Path
from typing import Any

import torch

from harness.build import BuildResult, build_many, export_signatures, load_module
from harness.check import ContextLost, Launch, check_case, ensure_usable, load_reference
from harness.envinfo import driver_version
from harness.inputs import clone_inputs, make_inputs, set_bytes, to_call_args
from harness.job import Case, Job
from harness.plan import SIDES, build_requests, variants_used
from harness.roofline import copy_floor, measure_copy_bandwidth, roofline_entry, suspect
from harness.stats import speedup
from harness.timing import CaptureError, cold_launch_floor, l2_bytes, launch_overhead_floor, time_cold, time_graph
from harness.toolchain import BuildFailure, nvcc_release, tvm_ffi_version
from harness.verdict import CaseResult, ModeTiming, Verdict, decide

__all__ = ["evaluate", "ContextLost", "collect_env", "default_cache_dir"]
log = logging.getLogger(__name__)


def default_cache_dir(job: Job) -> Path:
    """`job.options.cache_dir`, else $ASTRA_HOME/builds (ASTRA_HOME defaults to ~/.cache/astra)."""
    if job.options.cache_dir:
        return Path(job.options.cache_dir).expanduser()
    root = os.environ.get("ASTRA_HOME")
    return (Path(root).expanduser() if root else Path.home() / ".cache" / "astra") / "builds"


def _build_summary(side: str, variant: str, result: BuildResult) -> dict[str, Any]:
    return {"side": side, "variant": variant, "ok": result.ok, "seconds": result.seconds,
            "cache_hit": result.cache_hit, "key": result.key, "error": result.error,
            "resources": [asdict(r) for r in result.resources]}


def _one_line(text: str | None, limit: int = 300) -> str:
    lines = [line.strip() for line in (text or "").splitlines() if line.strip()]
    line = lines[0] if lines else "no output"
    return line if len(line) <= limit else line[: limit - 3] + "..."


def _failure(job: Job, status: str, reason: str, **extra: Any) -> Verdict:
    return Verdict(status=status, reason=reason, correct=False, faster=False, name=job.name,
                   candidate_label=job.candidate_label, **extra)


def _exports(job: Job, variant: str) -> list[str]:
    wrappers = job.variants[variant].cuda_wrappers + job.variants[variant].cpp_wrappers
    return list(dict.fromkeys([w[0] for w in wrappers] + [job.entry]))


def _drop_in(job: Job, modules: dict[tuple[str, str], Any]) -> tuple[dict, str | None, str]:
    """Signatures per variant and export, and (status, reason) of the first drop-in failure."""
    signatures: dict[str, dict] = {}
    for key in variants_used(job):
        names = _exports(job, key)
        orig = export_signatures(modules[("orig", key)], names)
        cand = export_signatures(modules[("cand", key)], names)
        signatures[key] = {name: {"orig": orig[name], "cand": cand[name]} for name in names}
        for name in names:
            if orig[name] is None:
                return signatures, "missing_export", f"the original module of {key} lacks export {name}"
            if cand[name] is None:
                return signatures, "missing_export", f"candidate does not export {name} (variant {key})"
            if cand[name] != orig[name]:
                return signatures, "signature_mismatch", f"{name}: candidate {cand[name]} != original {orig[name]}"
    return signatures, None, ""


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


def time_case(result: CaseResult, case: Case, launches: dict[str, Launch], job: Job, env: dict[str, Any],
              device: torch.device) -> None:
    """Both sides in every mode: timings, roofline, suspect flags, and the copy floor (graph mode)."""
    opts = job.options
    base = make_inputs(case, opts.seeds[0] if opts.seeds else 0, device)
    args0 = to_call_args(base, case.args)
    bandwidth = env["copy_bandwidth_Bps"]
    for mode in opts.modes:
        common = {"budget_ms": opts.budget_ms_per_case, "target_rel_stderr": opts.target_rel_stderr, "device": device}
        try:
            if mode == "graph":
                timing = time_graph(launches, lambda i: args0 if i == 0 else to_call_args(clone_inputs(base), case.args),
                                    set_bytes(base), **common)
            elif mode == "cold":
                timing = time_cold(launches, args0, **common)
            else:
                result.notes.append(f"unknown timing mode {mode!r} skipped")
                continue
        except CaptureError as error:
            ensure_usable(device, error, f"{case.id}: {mode} timing")
            if error.side == "cand":
                result.fail(f"{mode}: {error}")
            else:
                result.notes.append(f"{mode}: {error}")
            continue
        except torch.cuda.OutOfMemoryError as error:
            result.notes.append(f"{mode}: timing ran out of memory: {_one_line(str(error))}")
            continue
        orig, cand = timing.stats["orig"], timing.stats["cand"]
        ratio = speedup(orig, cand)
        noise = math.hypot(orig.rel_stderr, cand.rel_stderr)  # relative standard error of the ratio
        result.timings[mode] = ModeTiming(orig=orig, cand=cand, speedup=ratio, ratio_rel_stderr=noise,
                                          info=timing.info)
        result.roofline[mode] = roofline_entry(case.bytes, orig, cand, bandwidth)
        floor = env.get("launch_floor_us") if mode == "graph" else None
        why = suspect(ratio, cand.median_us, case.bytes, bandwidth, launch_floor_us=floor)
        if why:
            result.suspect.append(f"{mode}: {why}")
    if "graph" in opts.modes and case.bytes > 0:
        stats = copy_floor(case.bytes, device, budget_ms=opts.budget_ms_per_case / 4)
        result.copy_us = stats.median_us if stats else None


def _load_all(job: Job, cache_dir: Path) -> tuple[dict, list[dict], Verdict | None]:
    """Build and load every module; a failure verdict instead where a build or load fails."""
    requests = build_requests(job)
    results = build_many([r for _, _, r in requests], cache_dir)
    builds = [_build_summary(side, key, res) for (side, key, _), res in zip(requests, results)]
    modules: dict[tuple[str, str], Any] = {}
    for (side, key, _), res in zip(requests, results):
        who = "candidate" if side == "cand" else "original"
        if not res.ok:
            return modules, builds, _failure(job, "build_failed", f"{who} failed to build ({key}): "
                                             f"{_one_line(res.error)}", builds=builds)
        try:
            modules[(side, key)] = load_module(res.so_path)
        except Exception as error:  # an unloadable .so (undefined symbol, ...) is a build failure
            return modules, builds, _failure(job, "build_failed", f"{who} module failed to load ({key}): "
                                             f"{_one_line(str(error))}", builds=builds)
    if job.candidate_source is None:
        modules.update({("cand", key): modules[("orig", key)] for key in variants_used(job)})
    return modules, builds, None


def _launch(module: Any, entry: str) -> Launch:
    function = module.get_function(entry)
    return lambda args: function(*args)


def evaluate(job: Job, device: torch.device | str | None = None) -> Verdict:
    """The verdict on `job.candidate_source` against the original (see the module docstring)."""
    start = time.monotonic()
    device = torch.device(device or "cuda")
    if device.type == "cuda":
        if device.index is None:
            device = torch.device("cuda", torch.cuda.current_device())
        torch.cuda.set_device(device)
    phases: dict[str, float] = {}
    modules, builds, failure = _load_all(job, default_cache_dir(job))
    signatures: dict = {}
    if failure is None:  # a self-check compares the original with itself: it records the signatures
        signatures, status, reason = _drop_in(job, modules)
        if status:
            failure = _failure(job, status, reason, builds=builds, signatures=signatures)
    phases["build_s"] = time.monotonic() - start
    if failure is not None:
        failure.phases = {**phases, "total_s": time.monotonic() - start}
        return failure
    notes: list[str] = []
    reference = None
    if job.reference:
        try:
            reference = load_reference(job.reference)
        except Exception as error:  # the spec's reference is broken: fall back to tolerances, say so
            notes.append(f"reference.py not usable ({_one_line(str(error))}): compared with tolerances only")
    mark = time.monotonic()
    env = collect_env(device)
    phases["env_s"] = time.monotonic() - mark
    mark = time.monotonic()
    launches = {key: {side: _launch(modules[(side, key)], job.entry) for side in SIDES} for key in variants_used(job)}
    results = []
    for case in job.cases:
        log.info("checking %s", case.id)
        results.append(check_case(case, launches[case.variant], job, device, reference))
    phases["check_s"] = time.monotonic() - mark
    mark = time.monotonic()
    if all(r.correct for r in results):
        for case, result in zip(job.cases, results):
            if case.timed and result.timed:
                log.info("timing %s", case.id)
                time_case(result, case, launches[case.variant], job, env, device)
                torch.cuda.empty_cache()
    else:
        notes.append("timing skipped: the candidate is incorrect")
    phases["time_s"] = time.monotonic() - mark
    verdict = decide(results, list(job.options.modes), job.options.slowdown_threshold)
    verdict.name, verdict.candidate_label = job.name, job.candidate_label
    verdict.env, verdict.builds, verdict.signatures, verdict.notes = env, builds, signatures, notes
    verdict.phases = {**phases, "total_s": time.monotonic() - start}
    return verdict
