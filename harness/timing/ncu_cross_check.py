"""Cross-check of the harness's cold timing with Nsight Compute's `gpu__time_duration`.

A profiled worker (`python -m harness ncu-launch JOB --manifest M`) builds the original, and for each
timed case prepares inputs, then launches the entry once between two marker kernels (torch's
`spin_kernel`, from `torch.cuda._sleep`). Nsight Compute profiles the kernels of the marked region only
(`marked`: the CUDA profiler API around each pair of markers, `--profile-from-start off`), with its caches
flushed before each (`--cache-control all`, like the cold mode) at the clocks the card
runs (`--clock-control none`); the kernels between a pair of markers are the case's, and their
durations add up to the case's time. Input preparation happens outside the markers and is ignored.

Event timing (cold mode) includes the launch latency that `gpu__time_duration` does not, so small
shapes are expected to differ by a few microseconds; the report shows both, per shape, and a "net"
ratio that takes that fixed overhead out: (cold - (cold empty launch - ncu empty launch)) / ncu, both
empty launches measured by the tool (the worker's `cold_launch_floor_us`, the markers' median here).
"""

from __future__ import annotations

import csv
import io
import json
import sys
import tempfile
from contextlib import contextmanager
from pathlib import Path

from harness.job import Job
from harness.worker.process_group import harness_env, run_isolated

MARKER = "spin_kernel"
METRIC = "gpu__time_duration.sum"
# ncu profiles nothing until the process calls cudaProfilerStart: the kernels that make a shape's inputs
# (random fills, clones, poisoned outputs: tens per shape) are not replayed under every metric
FROM_MARKED_REGIONS = ["--profile-from-start", "off"]
_UNITS_NS = {"nsecond": 1.0, "ns": 1.0, "usecond": 1e3, "us": 1e3, "msecond": 1e6, "ms": 1e6, "second": 1e9, "s": 1e9}


def ncu_path() -> str | None:
    from harness.building.toolchain import cuda_tool

    return cuda_tool("ncu")


def parse_csv(text: str) -> list[tuple[str, float]]:
    """(kernel name, duration in ns) of each profiled kernel, in launch order, from `ncu --csv`."""
    start = text.find('"ID"')
    if start < 0:
        return []
    rows = list(csv.DictReader(io.StringIO(text[start:])))
    out: list[tuple[int, str, float]] = []
    for row in rows:
        if row.get("Metric Name") != METRIC:
            continue
        value = float(str(row["Metric Value"]).replace(",", ""))
        scale = _UNITS_NS.get(str(row.get("Metric Unit", "nsecond")).strip(), 1.0)
        name = row.get("Kernel Name") or row.get("Function Name") or row.get("Name") or ""  # ncu versions differ
        out.append((int(row["ID"]), name, value * scale))
    return [(name, ns) for _, name, ns in sorted(out)]


def marker_durations(kernels: list[tuple[str, float]], marker: str = MARKER) -> list[float]:
    """Durations (ns) of the marker kernels themselves: an empty launch as Nsight Compute sees it."""
    return [ns for name, ns in kernels if marker in name]


def split_by_markers(kernels: list[tuple[str, float]], marker: str = MARKER) -> list[list[float]]:
    """Durations of the kernels between each pair of marker kernels (begin, end, begin, end, ...)."""
    groups: list[list[float]] = []
    inside = False
    for name, ns in kernels:
        if marker in name:
            if inside:
                inside = False
            else:
                groups.append([])
                inside = True
        elif inside:
            groups[-1].append(ns)
    return groups


@contextmanager
def marked(torch):
    """The region ncu profiles: the work queued before it is finished outside it, a marker kernel opens and
    one closes it (`split_by_markers`), and the profiler stops once the region's kernels are done."""
    torch.cuda.synchronize()
    torch.cuda.profiler.start()
    try:
        torch.cuda._sleep(1)
        yield
        torch.cuda._sleep(1)
        torch.cuda.synchronize()
    finally:
        torch.cuda.profiler.stop()


def launch_cases(job: Job, manifest: Path) -> None:
    """The profiled side: one launch of the original per timed case, between two markers."""
    import torch

    from harness.judge.evaluate import _launch, _load_all, default_cache_dir
    from harness.judge.inputs import clone_inputs, make_inputs, poison_outputs, to_call_args

    job.candidate_source = None
    modules, _, failure = _load_all(job, default_cache_dir(job))
    if failure is not None:
        raise RuntimeError(failure.reason)
    ids = []
    for case in (c for c in job.cases if c.timed):
        launch = _launch(modules[("orig", case.variant)], job.entry)
        args = to_call_args(poison_outputs(clone_inputs(make_inputs(case, 0, "cuda")), case.args), case.args)
        with marked(torch):
            launch(args)
        ids.append(case.id)
    manifest.write_text(json.dumps(ids))


def cross_check(job: Job, *, timeout_s: float = 900.0) -> dict:
    """{case id: ncu microseconds} for the job's timed cases, or a `skipped` reason."""
    exe = ncu_path()
    if exe is None:
        return {"skipped": "ncu (Nsight Compute) not found on PATH or in $CUDA_HOME/bin", "cases": {}}
    with tempfile.TemporaryDirectory(prefix="astra-ncu-") as tmp:
        job_path, manifest, log = Path(tmp) / "job.json", Path(tmp) / "cases.json", Path(tmp) / "ncu.csv"
        job_path.write_text(job.to_json())
        command = [exe, "--csv", "--metrics", METRIC, "--cache-control", "all", "--clock-control", "none",
                   *FROM_MARKED_REGIONS, "--print-units", "base", "--log-file", str(log),
                   sys.executable, "-m", "harness", "ncu-launch", str(job_path), "--manifest", str(manifest)]
        outcome = run_isolated(command, timeout_s=timeout_s, env=harness_env(), cwd=tmp)
        if not manifest.exists() or not log.exists():
            tail = (outcome.stderr or outcome.stdout).strip().splitlines()[-1:] or ["no output"]
            return {"skipped": f"the profiled worker did not finish (exit {outcome.returncode}): {tail[0]}",
                    "cases": {}}
        ids = json.loads(manifest.read_text())
        kernels = parse_csv(log.read_text())
        groups = split_by_markers(kernels)
        markers = sorted(marker_durations(kernels))
    if len(groups) != len(ids):
        return {"skipped": f"{len(groups)} marked groups for {len(ids)} cases (ncu output not as expected)",
                "cases": {}}
    empty_us = markers[len(markers) // 2] / 1000.0 if markers else None
    return {"skipped": None, "cases": {i: sum(g) / 1000.0 for i, g in zip(ids, groups)}, "empty_us": empty_us}
