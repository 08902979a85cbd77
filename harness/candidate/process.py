"""The candidate process: the only process that loads and runs candidate code.

Started by the judge (harness.judge.evaluate) as

    python -m harness candidate request.json --work DIR --phase outputs|timing

in its own process group, with a scrubbed environment (harness.worker.process_group.scrub_env) and its own temporary
directory as cwd, HOME and TMPDIR. The request (written by the judge) holds the job, the device, the
.so paths of the candidate (and, for timing, of the original), the exports per variant and the judge's
trial list per case. Results go to DIR in the formats of harness.candidate.exchange; nothing is printed as a result.

- `outputs`: the export signatures of the candidate's modules first, then for every case and every
  trial the inputs generated here (harness.judge.correctness.trial_inputs: the same data the judge generates),
  one stream-ordered call with poisoned outputs (harness.judge.correctness.run_side), every tensor argument's
  bytes after the call; then two runs on identical inputs for determinism (sha256 of each). Cases are
  streamed one directory at a time, with backpressure (harness.candidate.exchange.wait_for_room).
- `timing`: both modules, every timed case in every mode of the job (graph and cold, interleaved,
  harness.timing.modes): {mode: {orig, cand, info}} or {mode: {error, side, kind}} per case, in timings.json;
  then, per case, one call made the way each mode times it, whose output digest the judge compares with
  the checked call's (harness.judge.timed_outputs).

A CUDA fault that leaves the context unusable escapes as `ContextLost` (exit status 1, the CUDA error
on stderr), which the judge reports as "crashed".

The process closes itself in before it loads anything (harness.sandbox.Confinement, as the request's
"sandbox" says): Landlock floor before torch, the warm-up, then the tight list and seccomp stage 1
before the modules load, stage 2 (no new executable mapping) before the first call. Its writable
directories are its cwd (HOME, TMPDIR) and the work directory; the only files beside the installation
it can read are the modules it loads. Refused (no Landlock or seccomp here): exit status 4, nothing loaded.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any

from harness.candidate.exchange import DONE, SIGNATURES, TIMINGS, CaseWriter, wait_for_room, write_json_atomic
from harness.sandbox import Confinement, SandboxUnavailable

log = logging.getLogger(__name__)
SANDBOX_REFUSED = 4  # exit status: the sandbox was required and cannot be had here


def _die_with_parent() -> None:
    """SIGKILL this process when its parent (the judge, or compute-sanitizer) dies."""
    try:
        import ctypes
        import signal

        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass


def _device(name: str):
    import torch

    device = torch.device(name)
    if device.type == "cuda":
        if device.index is None:
            device = torch.device("cuda", torch.cuda.current_device())
        torch.cuda.set_device(device)
    return device


def _launch(module: Any, entry: str):
    try:
        function = module.get_function(entry)
    except AttributeError:
        return None
    return lambda args: function(*args)


def run_outputs(request: dict[str, Any], work: Path, box: Confinement) -> None:
    """The `outputs` phase (see the module docstring)."""
    from harness.building.module_loading import export_signatures, load_module
    from harness.job import Job
    from harness.judge.correctness import determinism_digests, run_side, trial_inputs

    job = Job.from_dict(request["job"])
    device = _device(request["device"])
    box.warm_up(device)
    box.seal()
    modules = {variant: load_module(path) for variant, path in request["cand_so"].items()}
    box.lock_exec()
    signatures = {variant: export_signatures(modules[variant], request["exports"][variant]) for variant in modules}
    write_json_atomic(work / SIGNATURES, signatures)
    seed0 = job.options.seeds[0] if job.options.seeds else 0
    for index, case in enumerate(job.cases):
        wait_for_room(work)
        log.info("candidate outputs %s", case.id)
        launch = _launch(modules[case.variant], job.entry)
        writer = CaseWriter(work, index, case)
        for kind, seed in request["trials"][index]:
            if launch is None:
                writer.add_trial(kind, seed, f"no export {job.entry}", None)
                continue
            inputs = trial_inputs(case, (kind, seed), device)
            args, error = run_side(launch, inputs, case, device, f"{case.id}: cand seed {seed} ({kind})")
            writer.add_trial(kind, seed, error, None if error else args)
            del inputs, args
        writer.finish(determinism_digests(launch, case, seed0, device) if launch is not None else None)
    (work / DONE).touch()


def measure_case(case, launches: dict, job, device) -> dict[str, dict[str, Any]]:
    """Both sides of one case in every mode: {mode: {orig, cand, info}} or {mode: {error, side, kind}}."""
    import torch

    from harness.judge.correctness import ensure_usable
    from harness.judge.inputs import clone_inputs, make_inputs, set_bytes, to_call_args
    from harness.timing.modes import CaptureError, time_cold, time_graph

    opts = job.options
    base = make_inputs(case, opts.seeds[0] if opts.seeds else 0, device)
    args0 = to_call_args(base, case.args)
    results: dict[str, dict[str, Any]] = {}
    for mode in opts.modes:
        common = {"budget_ms": opts.budget_ms_per_case, "target_rel_stderr": opts.target_rel_stderr, "device": device}
        try:
            if mode == "graph":
                timing = time_graph(launches, lambda i: args0 if i == 0 else to_call_args(clone_inputs(base), case.args),
                                    set_bytes(base), **common)
            elif mode == "cold":
                timing = time_cold(launches, args0, **common)
            else:
                results[mode] = {"error": f"unknown timing mode {mode!r}", "side": None, "kind": "unknown"}
                continue
        except CaptureError as error:
            ensure_usable(device, error, f"{case.id}: {mode} timing")
            results[mode] = {"error": str(error)[:300], "side": error.side, "kind": "capture"}
            continue
        except torch.cuda.OutOfMemoryError as error:
            torch.cuda.empty_cache()
            results[mode] = {"error": str(error).strip().splitlines()[0][:300], "side": None, "kind": "oom"}
            continue
        except RuntimeError as error:
            ensure_usable(device, error, f"{case.id}: {mode} timing")
            results[mode] = {"error": str(error).strip()[:300], "side": None, "kind": "other"}
            continue
        results[mode] = {side: timing.stats[side].to_dict() for side in ("orig", "cand")}
        results[mode]["info"] = timing.info
    return results


def run_timing(request: dict[str, Any], work: Path, box: Confinement) -> None:
    """The `timing` phase (see the module docstring)."""
    import torch

    from harness.building.module_loading import load_module
    from harness.job import Job
    from harness.judge import timed_outputs

    job = Job.from_dict(request["job"])
    device = _device(request["device"])
    box.warm_up(device)
    box.seal()
    launches = {variant: {"orig": _launch(load_module(request["orig_so"][variant]), job.entry),
                          "cand": _launch(load_module(path), job.entry)}
                for variant, path in request["cand_so"].items()}
    box.lock_exec()
    timings: dict[str, Any] = {}
    digests: dict[str, Any] = {}
    for case in job.cases:
        if case.id not in request["timed"]:
            continue
        log.info("candidate timing %s", case.id)
        timings[case.id] = measure_case(case, launches[case.variant], job, device)
        timed = [mode for mode, entry in timings[case.id].items() if "error" not in entry]
        digests[case.id] = timed_outputs.timed_digests(case, launches[case.variant]["cand"], job, device, timed)
        torch.cuda.empty_cache()
    timed_outputs.write(work, digests)  # before timings.json: the judge reads both once that one exists
    write_json_atomic(work / TIMINGS, timings)


def main(request_path: str, work: str, phase: str) -> int:
    """Entry of `python -m harness candidate`."""
    _die_with_parent()
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    request = json.loads(Path(request_path).read_text())
    work_dir = Path(work)
    modules = [*request["cand_so"].values(), *(request.get("orig_so") or {}).values()]
    box = Confinement(request.get("sandbox"), writable=[Path.cwd(), work_dir], readable=modules)
    try:
        box.begin()
    except SandboxUnavailable as error:
        log.error("SandboxUnavailable: %s; no candidate code was loaded", error)
        return SANDBOX_REFUSED
    if phase == "outputs":
        run_outputs(request, work_dir, box)
    elif phase == "timing":
        run_timing(request, work_dir, box)
    else:
        raise SystemExit(f"unknown phase {phase!r}")
    return 0
