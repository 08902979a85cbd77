"""Nsight Compute profiles of a kernel's shapes, for the planners (the LLM agent's, the profiling agent's).

    profiler = Profiler(spec, tree)
    result = profiler(source, case_id, extra_shapes)   # source None: the original
    results = profiler.many(source, [case_a, case_b], extra_shapes)   # one profiled process for all
    text(result, "original")    # "shape S: 1 kernel(s), 12.3 us; DRAM 78.1% of peak (2.61 TB/s); ..."

`ncu` runs a profiled process (`python -m astra.optimize.ncu_profile JOB MANIFEST`, a scrubbed environment
and the OS sandbox's seccomp part, as any process that runs candidate code: docs/threat-model.md) that builds the
job and, shape after shape, launches the entry once to warm up and once between two marker kernels, as
`harness.timing.ncu_cross_check` does for `astra bench --ncu`; the kernels between a pair of markers are that
shape's, and only they (and the markers) are profiled (`ncu_cross_check.marked`). Replayed under every metric,
the kernels that make the inputs took most of a profile: 35 to 120 s after the baseline, per kernel, in an
`astra eval --offline` of twelve kernels on 4 x H100 (2026-11-28), whose budget was 120 s a kernel. A
candidate's code runs inside the region and could stop the profiler itself: a profile advises the planners, it
never decides a verdict.

Per shape: DRAM throughput (% of peak and bytes/s) and achieved occupancy, weighted by each kernel's duration,
the most registers per thread, local-memory (spill) instructions, and the top 3 warp-stall reasons (cycles per
issued instruction, WarpStateStats' metrics). With
`diagnose=True` (the offline agent's profiling agent, astra.optimize.profiling) it also asks for DIAGNOSIS and
the instruction mix per pipe: sectors and requests of global loads and stores and the bytes used per sector,
theoretical occupancy and its launch__occupancy_limit_* limiters, waves and the SM count. Without ncu,
a GPU or a timed shape the result is {"available": False, "why": ...}, and the prompt says so.
"""

from __future__ import annotations

import csv
import io
import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

from harness import Job

STALL_PREFIX, STALL_SUFFIX = "smsp__average_warps_issue_stalled_", "_per_issue_active.ratio"
METRICS = {
    "gpu__time_duration.sum": "duration_ns",
    "dram__throughput.avg.pct_of_peak_sustained_elapsed": "dram_pct",
    "dram__bytes.sum.per_second": "dram_Bps",
    "sm__warps_active.avg.pct_of_peak_sustained_active": "occupancy_pct",
    "launch__registers_per_thread": "registers",
    "launch__grid_size": "grid",
    "launch__block_size": "block",
    "smsp__sass_inst_executed_op_local_ld.sum": "local_loads",
    "smsp__sass_inst_executed_op_local_st.sum": "local_stores",
}
STALLS = r"regex:smsp__average_warps_issue_stalled_[a-z0-9_]+_per_issue_active\.ratio"
NOT_STALLS = ("selected",)  # issuing, not stalled
# What the profiling agent (astra.optimize.profiling) adds for its symptoms (Hopper, sm_90): how global
# accesses use their sectors, what limits occupancy, the SM count and waves, and the instruction mix per pipe.
DIAGNOSIS = {
    "l1tex__t_sectors_pipe_lsu_mem_global_op_ld.sum": "ld_sectors",
    "l1tex__t_requests_pipe_lsu_mem_global_op_ld.sum": "ld_requests",
    "l1tex__t_sectors_pipe_lsu_mem_global_op_st.sum": "st_sectors",
    "l1tex__t_requests_pipe_lsu_mem_global_op_st.sum": "st_requests",
    "smsp__sass_average_data_bytes_per_sector_mem_global_op_ld.pct": "ld_efficiency_pct",
    "smsp__sass_average_data_bytes_per_sector_mem_global_op_st.pct": "st_efficiency_pct",
    "sm__maximum_warps_per_active_cycle_pct": "theoretical_occupancy_pct",
    "launch__occupancy_limit_registers": "limit_registers",
    "launch__occupancy_limit_shared_mem": "limit_shared_mem",
    "launch__occupancy_limit_warps": "limit_warps",
    "launch__occupancy_limit_blocks": "limit_blocks",
    "launch__waves_per_multiprocessor": "waves",
    "device__attribute_multiprocessor_count": "sm_count",
}
PIPE_PREFIX, PIPE_SUFFIX = "sm__inst_executed_pipe_", ".sum"
PIPES = r"regex:sm__inst_executed_pipe_[a-z0-9]+\.sum$"


def unavailable(why: str) -> dict:
    return {"available": False, "why": why}


def unavailable_reason() -> str | None:
    """Why no profile can be taken here (no ncu, no GPU), or None."""
    from harness.timing.ncu_cross_check import ncu_path

    if ncu_path() is None:
        return "ncu (Nsight Compute) not found on PATH or in $CUDA_HOME/bin"
    smi = shutil.which("nvidia-smi")
    if smi is None:
        return "no GPU: nvidia-smi not found"
    try:
        listed = subprocess.run([smi, "-L"], capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired) as err:
        return f"no GPU: nvidia-smi -L failed ({err})"
    if listed.returncode != 0 or "GPU" not in listed.stdout:
        return f"no GPU: nvidia-smi -L found none (exit {listed.returncode})"
    return None


def pick_case(verdict) -> str | None:
    """The representative shape: the timed case with the most microseconds above its practical floor
    (graph view, else cold), else the largest timed case; None without a timed case."""
    cases = [c for c in (verdict.timed_cases() if verdict else []) if c.timings]
    if not cases:
        return None

    def above(case) -> float:
        for view in ("graph", "cold"):
            floor, time = (case.floors.get(view) or {}).get("practical_us"), case.median_us(view, "cand")
            if floor is not None and time is not None:
                return time - floor
        return -1.0

    return max(cases, key=lambda c: (above(c), c.bytes)).id


def parse_csv(text: str) -> list[tuple[str, dict[str, float]]]:
    """(kernel name, {metric: value}) per profiled kernel in launch order, from `ncu --csv` (one row per
    kernel and metric); values that are not numbers ("n/a") are left out."""
    start = text.find('"ID"')
    if start < 0:
        return []
    kernels: dict[int, tuple[str, dict[str, float]]] = {}
    for row in csv.DictReader(io.StringIO(text[start:])):
        try:
            key, value = int(row["ID"]), float(str(row.get("Metric Value", "")).replace(",", ""))
        except (KeyError, ValueError):
            continue
        name = row.get("Kernel Name") or row.get("Function Name") or row.get("Name") or ""
        kernels.setdefault(key, (name, {}))[1][str(row.get("Metric Name"))] = value
    return [kernels[k] for k in sorted(kernels)]


def summarize(kernels: list[dict[str, float]]) -> dict:
    """One shape's kernels as one profile: sums, duration-weighted averages, the most registers, top stalls."""
    weights = [k.get("gpu__time_duration.sum", 0.0) for k in kernels]
    total = sum(weights)

    def weighted(metric: str) -> float | None:
        pairs = [(k[metric], w) for k, w in zip(kernels, weights) if metric in k]
        if not pairs:
            return None
        mass = sum(w for _, w in pairs)
        return sum(v * w for v, w in pairs) / mass if mass > 0 else sum(v for v, _ in pairs) / len(pairs)

    stalls: dict[str, float] = {}
    for k, w in zip(kernels, weights):
        for metric, value in k.items():
            reason = metric.removeprefix(STALL_PREFIX).removesuffix(STALL_SUFFIX)
            if metric.startswith(STALL_PREFIX) and metric.endswith(STALL_SUFFIX) and reason not in NOT_STALLS:
                stalls[reason] = stalls.get(reason, 0.0) + value * (w / total if total > 0 else 1 / len(kernels))
    top = sorted(stalls.items(), key=lambda item: -item[1])[:3]
    regs = [k[m] for k in kernels for m in ("launch__registers_per_thread",) if m in k]
    return {**diagnosis(kernels, weighted), "available": True, "kernels": len(kernels), "duration_us": total / 1000.0,
            "dram_pct": weighted("dram__throughput.avg.pct_of_peak_sustained_elapsed"),
            "dram_Bps": weighted("dram__bytes.sum.per_second"),
            "occupancy_pct": weighted("sm__warps_active.avg.pct_of_peak_sustained_active"),
            "registers": int(max(regs)) if regs else None,
            "grid": [int(k["launch__grid_size"]) for k in kernels if "launch__grid_size" in k],
            "block": [int(k["launch__block_size"]) for k in kernels if "launch__block_size" in k],
            "local_loads": sum(k.get("smsp__sass_inst_executed_op_local_ld.sum", 0.0) for k in kernels),
            "local_stores": sum(k.get("smsp__sass_inst_executed_op_local_st.sum", 0.0) for k in kernels),
            "top_stalls": [[reason, round(value, 3)] for reason, value in top]}


def diagnosis(kernels: list[dict[str, float]], weighted) -> dict:
    """The DIAGNOSIS metrics where ncu reported them: sector counts summed over the shape's kernels, the
    rest duration-weighted (`weighted`: summarize's), the occupancy limits of the longest kernel, and the
    instruction mix as a share of all pipe instructions ({pipe: %})."""
    out: dict = {}
    longest = max(kernels, key=lambda k: k.get("gpu__time_duration.sum", 0.0)) if kernels else {}
    for metric, key in DIAGNOSIS.items():
        if metric.endswith(".sum"):
            values = [k[metric] for k in kernels if metric in k]
            if values:
                out[key] = sum(values)
        elif metric.startswith(("launch__occupancy_limit_", "device__")):
            if metric in longest:
                out[key] = longest[metric]
        elif (value := weighted(metric)) is not None:
            out[key] = value
    pipes: dict[str, float] = {}
    for k in kernels:
        for metric, value in k.items():
            if metric.startswith(PIPE_PREFIX) and metric.endswith(PIPE_SUFFIX):
                name = metric.removeprefix(PIPE_PREFIX).removesuffix(PIPE_SUFFIX)
                pipes[name] = pipes.get(name, 0.0) + value
    total = sum(pipes.values())
    if total > 0:
        out["inst_mix_pct"] = {p: round(100 * v / total, 1) for p, v in sorted(pipes.items(), key=lambda i: -i[1])
                               if v > 0}
    return out


def text(profile: dict, label: str) -> str:
    """One line for a prompt; an unavailable profile says why."""
    if not profile.get("available"):
        return f"{label}: no Nsight Compute profile: {profile.get('why')}"

    def num(value, fmt: str) -> str:
        return "?" if value is None else format(value, fmt)

    bandwidth = "?" if profile.get("dram_Bps") is None else f"{profile['dram_Bps'] / 1e12:.2f} TB/s"
    stalls = ", ".join(f"{r} {v:.2f}" for r, v in profile.get("top_stalls") or []) or "none reported"
    return (f"{label}, shape {profile.get('case')}: {profile['kernels']} kernel(s), {profile['duration_us']:.2f} us "
            f"under ncu (grid {profile.get('grid')}, block {profile.get('block')}); DRAM "
            f"{num(profile.get('dram_pct'), '.1f')}% of peak ({bandwidth}); achieved occupancy "
            f"{num(profile.get('occupancy_pct'), '.1f')}%; {num(profile.get('registers'), 'd')} registers per "
            f"thread; local memory (spills): {profile['local_loads']:.0f} load and {profile['local_stores']:.0f} "
            f"store instructions; top warp stalls (cycles per issued instruction): {stalls}")


class Profiler:
    """Profiles a source of `spec` on shapes of its suite with ncu (one shape: call it; several: `many`); never
    raises for a failed profile. `timeout_s` is per shape."""

    def __init__(self, spec, tree, *, timeout_s: float = 600.0, diagnose: bool = False):
        self.spec, self.tree, self.timeout_s = spec, tree, timeout_s
        # the metrics asked for: the LLM agent's (METRICS, stalls), plus DIAGNOSIS and the pipes for the profiling agent
        self.metrics = [*METRICS, STALLS, *((*DIAGNOSIS, PIPES) if diagnose else ())]

    def __call__(self, source: str | None, case_id: str | None, extra_shapes: list[dict]) -> dict:
        if case_id is None:
            return unavailable("no timed shape to profile (a build-only run, or nothing measured)")
        return self.many(source, [case_id], extra_shapes)[case_id]

    def many(self, source: str | None, case_ids: list[str], extra_shapes: list[dict]) -> dict[str, dict]:
        """The profiles of several shapes of one source, from one profiled process (one build, one CUDA
        context and one ncu start for all of them): {case id: profile}."""
        why = unavailable_reason()
        if why:
            return {case_id: unavailable(why) for case_id in case_ids}
        from astra import paths
        from astra.errors import AstraError
        from astra.spec import jobs

        try:
            job = jobs.make_job(self.spec, self.tree, candidate_source=source, extra_shapes=extra_shapes,
                                label="ncu")
            by_id = {c.id: c for c in job.cases}
            job.cases = [by_id[case_id] for case_id in case_ids if case_id in by_id]
            job.options.cache_dir = str(paths.sub("builds"))
            found = self._run(job) if job.cases else {}
        except (AstraError, OSError) as err:  # the run goes on without a profile, and the prompt says why
            return {case_id: unavailable(f"{type(err).__name__}: {err}") for case_id in case_ids}
        return {case_id: {**found[case_id], "case": case_id} if case_id in found
                else unavailable(f"shape {case_id} is not in the suite") for case_id in case_ids}

    def _run(self, job: Job) -> dict[str, dict]:
        from harness.timing.ncu_cross_check import FROM_MARKED_REGIONS, ncu_path, split_by_markers
        from harness.worker.process_group import run_isolated, scrub_env, telling_line

        ids = [case.id for case in job.cases]
        with tempfile.TemporaryDirectory(prefix="astra-ncu-profile-") as tmp:
            job_path, manifest, log = Path(tmp) / "job.json", Path(tmp) / "done.json", Path(tmp) / "ncu.csv"
            job_path.write_text(job.to_json())
            command = [ncu_path(), "--csv", "--metrics", ",".join(self.metrics), "--cache-control", "all",
                       "--clock-control", "none", *FROM_MARKED_REGIONS, "--print-units", "base",
                       "--log-file", str(log),
                       sys.executable, "-m", "astra.optimize.ncu_profile", str(job_path), str(manifest)]
            outcome = run_isolated(command, timeout_s=self.timeout_s * len(ids), env=scrub_env(dict(os.environ), tmp),
                                   cwd=tmp)
            if not manifest.exists() or not log.exists():
                how = "timed out" if outcome.timed_out else f"exit {outcome.returncode}"
                said = telling_line(outcome.stderr or outcome.stdout or "") or "no output"  # a fault's, not its stack
                return {i: unavailable(f"the profiled launch did not finish ({how}): {said[:300]}") for i in ids}
            kernels = parse_csv(log.read_text(errors="replace"))
            groups = split_by_markers(kernels)
        if len(groups) != len(ids):
            why = f"ncu reported {len(groups)} marked launch(es) for {len(ids)} shape(s) (output not as expected)"
            return {i: unavailable(why) for i in ids}
        # kernels ncu replayed outside the marked regions: the one before the seal, when only they were profiled
        unmarked = len(kernels) - 2 * len(groups) - sum(len(group) for group in groups)
        return {i: {**summarize(group), "unmarked_kernels": unmarked} if group
                else unavailable("ncu reported no kernel between the markers") for i, group in zip(ids, groups)}


def launch(job: Job, manifest: Path) -> None:
    """The profiled side: each of the job's cases launched once to warm up, then once between two markers."""
    import torch

    from harness.building.module_loading import load_module
    from harness.judge.evaluate import _launch, build_all, default_cache_dir
    from harness.judge.inputs import clone_inputs, make_inputs, poison_outputs, to_call_args
    from harness.sandbox import Confinement, decide, request_mode
    from harness.timing.ncu_cross_check import marked

    paths, _, failure = build_all(job, default_cache_dir(job))
    if failure is not None:
        raise RuntimeError(failure.reason)
    sos = sorted({paths[("cand", case.variant)] for case in job.cases})  # the original's in a self-check
    # the OS sandbox of every process that loads candidate code (harness.sandbox), without its Landlock part:
    # ncu's injected profiler needs files beyond the allow-list (its lock file in TMPDIR, more); seccomp (no
    # exec, fork, network, ptrace, memfd, new executable mappings) binds every thread (seen on an H100)
    box = Confinement(request_mode(decide(job.options.sandbox)[0]), writable=[manifest.parent], readable=sos,
                      filesystem=False)
    box.begin()
    box.warm_up("cuda")
    # ncu sets up its profiling at the first kernel it profiles: one kernel before the seal (under seccomp, that
    # first profile killed the process with SIGSEGV on an H100); it comes before the first marker, outside every shape
    torch.cuda.profiler.start()
    torch.zeros(1, device="cuda")
    torch.cuda.synchronize()
    torch.cuda.profiler.stop()
    box.seal()
    runs = {variant: _launch(load_module(paths[("cand", variant)]), job.entry)
            for variant in dict.fromkeys(case.variant for case in job.cases)}
    box.lock_exec()

    def args(case):
        return to_call_args(poison_outputs(clone_inputs(make_inputs(case, 0, "cuda")), case.args), case.args)

    # a case whose launch raises leaves its markers with nothing between: that profile alone fails (a sticky CUDA
    # fault ends the process, and every shape's profile with it)
    for case in job.cases:
        run, call = runs[case.variant], None
        try:
            run(args(case))
            torch.cuda.synchronize()
            call = args(case)
            torch.cuda.synchronize()
        except Exception:  # any refusal of this shape's arguments fails its profile only
            pass
        with marked(torch):  # between two marker kernels (harness.timing.ncu_cross_check.MARKER)
            if call is not None:
                try:
                    run(call)
                except Exception:  # as above
                    pass
        del call
    manifest.write_text(json.dumps({"cases": [case.id for case in job.cases]}))


if __name__ == "__main__":
    launch(Job.from_json(Path(sys.argv[1]).read_text()), Path(sys.argv[2]))
