"""The candidate process: the only process that loads and runs candidate code.

Started by the judge (harness.judge.evaluate) as

    python -m harness candidate request.json --work DIR --phase outputs|timing

in its own process group, with a scrubbed environment (harness.worker.process_group.scrub_env) and its own temporary
directory as cwd, HOME and TMPDIR. The request (written by the judge) holds the job, the device, the
.so paths of the candidate (never the original's), the exports per variant, the judge's trial list per
case and, for timing, the numbers of the link's pipes. Results go to DIR in the formats of harness.candidate.exchange
or up the link; nothing is printed as a result.

- `outputs`: the export signatures of the candidate's modules first, then for every case and every
  trial the inputs generated here (harness.judge.correctness.trial_inputs: the same data the judge generates),
  one stream-ordered call with poisoned outputs (harness.judge.correctness.run_side), every tensor argument's
  bytes after the call (kept on the GPU under a CUDA IPC handle where the driver allows: harness.candidate.cuda_ipc;
  else written to a file); then two runs on identical inputs for determinism (sha256 of each), then two
  launches back to back on the first seed's inputs (harness.judge.back_to_back). Cases are streamed one
  directory at a time, with backpressure (harness.candidate.exchange.wait_for_room).
- `timing`: the candidate's modules ONLY (the original is timed in the judge, out of this process's
  reach); the candidate's side of the paired timing (harness.timing.timing_side), driven by the judge over the
  two pipes whose numbers the request carries (harness.timing.timing_link: estimate, prepare, sample, digests,
  dump, close, exit). The judge stops this process's group between its turns (harness.timing.quiet_gpu).

Every phase runs inside the OS sandbox (harness.sandbox): the trusted warm-up, then the seal, then the
candidate's modules are loaded, then no new executable mappings.

A CUDA fault that leaves the context unusable escapes as `ContextLost` (exit status 1, the CUDA error
on stderr), which the judge reports as "crashed".

The judge may start the `outputs` process while the modules are still building (the request then has no
"cand_so" but their "modules_dir"): it warms up, then waits for the judge's `go.json` with the built and
scanned modules' paths (`module_paths`), so its start overlaps the build.

The process closes itself in before it loads anything (harness.sandbox.Confinement, as the request's
"sandbox" says): Landlock floor before torch, the warm-up, then the tight list and seccomp stage 1
before the modules load, stage 2 (no new executable mapping) before the first call. Its writable
directories are its cwd (HOME, TMPDIR) and the work directory; the only files beside the installation
it can read are the modules it loads. Refused (no Landlock or seccomp here): exit status 4, nothing loaded.
"""

from __future__ import annotations

import json
import logging
import os
import sys
import time
from pathlib import Path
from typing import Any

from harness.candidate import cuda_ipc
from harness.candidate.exchange import DONE, GO, SIGNATURES, CaseWriter, wait_for_room, write_json_atomic
from harness.sandbox import Confinement, SandboxUnavailable
from harness.worker.process_group import exit_now

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


def module_paths(request: dict[str, Any], box: Confinement, poll_s: float = 0.01) -> dict[str, str]:
    """{variant: path} of the modules to load: the request's, or, for a process the judge started while they
    were still building (no "cand_so", a "modules_dir"), those of the judge's `GO` file (in the request's
    "control" directory, which this process reads and cannot write) once it is written
    (after the warm-up: the start overlaps the build). Each must lie in the modules' directory, and the seal's
    tight list then names these files alone (`box.readable`). The judge kills a process it never sends on."""
    if request.get("cand_so"):
        return dict(request["cand_so"])
    go = Path(request["control"]) / GO
    while not go.exists():
        time.sleep(poll_s)
    paths = {str(k): str(v) for k, v in json.loads(go.read_text())["cand_so"].items()}
    root = os.path.realpath(request["modules_dir"])
    for path in paths.values():
        if os.path.commonpath([root, os.path.realpath(path)]) != root:
            raise SystemExit(f"module {path} is not in the modules' directory {root}")
    box.readable = [Path(path) for path in paths.values()]
    return paths


def run_outputs(request: dict[str, Any], work: Path, box: Confinement) -> None:
    """The `outputs` phase (see the module docstring)."""
    from harness.building.module_loading import export_signatures, load_module, warm_signature_probe
    from harness.job import Job
    from harness.judge.back_to_back import chained_call
    from harness.judge.correctness import determinism_digests, run_side, trial_inputs

    job = Job.from_dict(request["job"])
    device = _device(request["device"])
    box.warm_up(device)
    warm_signature_probe()  # before the modules come (beside their build): their signatures are then read at once
    sanitized = bool(request.get("sanitized"))  # under compute-sanitizer: files, and digests on the host
    ipc = not sanitized and device.type == "cuda" and cuda_ipc.available()  # the driver API loaded before the seal
    cand_so = module_paths(request, box)
    box.seal()
    modules = {variant: load_module(path) for variant, path in cand_so.items()}
    box.lock_exec()
    signatures = {variant: export_signatures(modules[variant], request["exports"][variant]) for variant in modules}
    write_json_atomic(work / SIGNATURES, signatures)
    seed0 = job.options.seeds[0] if job.options.seeds else 0
    pending: list[CaseWriter] = []  # cases whose outputs the judge may still be copying from this process
    for index, case in enumerate(job.cases):
        wait_for_room(work)
        pending = [writer for writer in pending if not writer.released()]
        log.info("candidate outputs %s", case.id)
        launch = _launch(modules[case.variant], job.entry)
        writer = CaseWriter(work, index, case, ipc=ipc)
        pending.append(writer)
        for kind, seed in request["trials"][index]:
            if launch is None:
                writer.add_trial(kind, seed, f"no export {job.entry}", None)
                continue
            inputs = trial_inputs(case, (kind, seed), device)
            args, error = run_side(launch, inputs, case, device, f"{case.id}: cand seed {seed} ({kind})")
            writer.add_trial(kind, seed, error, None if error else args)
            del inputs, args
        if launch is None:
            writer.add_chain(f"no export {job.entry}", None)
        else:
            launches, error = chained_call(launch, trial_inputs(case, ("seed", seed0), device), case, device,
                                           f"{case.id}: cand back to back")
            writer.add_chain(error, launches)
            del launches
        writer.finish(determinism_digests(launch, case, seed0, device, job.options.digest_key, sanitized)
                      if launch is not None else None)
    (work / DONE).touch()
    if any(writer.kept for writer in pending):  # the judge reads the last cases from this process's memory
        wait_for_room(work, backlog=0)


class TimingServer:
    """The candidate's side of the paired timing: one `harness.timing.timing_side.TimingSide` at a time,
    driven by the judge's commands (harness.timing.timing_link); errors are replies ("capture", "oom",
    "other"), a lost CUDA context ends the process."""

    def __init__(self, job, launches: dict[str, Any], device, work: Path) -> None:
        self.job, self.launches, self.device, self.work = job, launches, device, work
        self.side = None

    def _side(self, index: Any):
        from harness.timing.timing_side import TimingSide

        if not isinstance(index, int) or not 0 <= index < len(self.job.cases):
            raise ValueError(f"no case {index!r}")
        case = self.job.cases[index]
        launch = self.launches.get(case.variant)
        if launch is None:
            raise ValueError(f"no export {self.job.entry} for {case.variant}")
        return TimingSide("cand", launch, case, self.device, self.job.options.digest_key)

    def handle(self, command: dict[str, Any]) -> dict[str, Any] | None:
        import torch

        from harness.judge.correctness import ensure_usable
        from harness.timing.modes import CaptureError

        op = command.get("op")
        if op == "exit":
            return None
        try:
            return self._run(op, command)
        except CaptureError as error:
            ensure_usable(self.device, error, f"timing {op}")
            return {"error": str(error)[:300], "kind": "capture"}
        except torch.cuda.OutOfMemoryError as error:
            torch.cuda.empty_cache()
            return {"error": str(error).strip().splitlines()[0][:300], "kind": "oom"}
        except (RuntimeError, ValueError, TypeError, LookupError) as error:
            ensure_usable(self.device, error, f"timing {op}")
            return {"error": str(error).strip()[:300] or type(error).__name__, "kind": "other"}

    def _run(self, op: Any, command: dict[str, Any]) -> dict[str, Any]:
        from harness.candidate.exchange import write_tensors
        from harness.judge.timed_outputs import dump_dir
        from harness.timing.placement import MAX_LAYOUT

        if op == "estimate":
            return {"us": self._side(command.get("case")).estimate(int(command["seed"]))}
        if op == "prepare":
            self.close()
            self.side = self._side(command.get("case"))
            layout = int(command.get("layout") or 0)
            if not 0 <= layout <= MAX_LAYOUT:
                raise ValueError(f"layout {layout} out of range")
            self.side.prepare(str(command["view"]), [int(seed) for seed in command["seeds"]], layout)
            return {}
        if op == "close":
            self.close()
            return {}
        if self.side is None:
            raise ValueError(f"{op} before prepare")
        if op == "sample":
            return {"us": self.side.sample(int(command["count"]))}
        if op == "digests":
            return {"digests": self.side.digests()}
        if op == "dump":
            directory = dump_dir(self.work)
            directory.mkdir(exist_ok=True)
            return {"tensors": {str(i): write_tensors(directory, "s", int(i), self.side.case, self.side.set_args(int(i)),
                                                      outputs_only=True) for i in command["sets"]}}
        raise ValueError(f"unknown command {op!r}")

    def close(self) -> None:
        if self.side is not None:
            self.side.close()
            self.side = None


def run_timing(request: dict[str, Any], work: Path, box: Confinement) -> None:
    """The `timing` phase (see the module docstring)."""
    from harness.building.module_loading import load_module
    from harness.job import Job
    from harness.timing.timing_link import serve

    job = Job.from_dict(request["job"])
    device = _device(request["device"])
    box.warm_up(device)
    box.seal()
    launches = {variant: _launch(load_module(path), job.entry) for variant, path in request["cand_so"].items()}
    box.lock_exec()
    server = TimingServer(job, launches, device, work)
    link = request["link"]
    log.info("candidate timing: serving the judge")
    serve(int(link["commands"]), int(link["replies"]), server.handle)
    server.close()


def main(request_path: str, work: str, phase: str) -> int:
    """Entry of `python -m harness candidate`."""
    _die_with_parent()
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    request = json.loads(Path(request_path).read_text())
    work_dir = Path(work)
    # before the modules are known (a process started beside their build): their directory, until the seal
    readable = request["cand_so"].values() if request.get("cand_so") else [request["modules_dir"], request["control"]]
    box = Confinement(request.get("sandbox"), writable=[Path.cwd(), work_dir], readable=readable)
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
    if not request.get("sanitized"):  # compute-sanitizer's tools report as the process ends: theirs stays whole
        _end_at_once()
    return 0


def _end_at_once() -> None:
    """End without the interpreter's teardown, whose half second the judge would wait out: the results are
    delivered and read. One last synchronisation first, so that a fault of work still queued ends the process
    non-zero, as it would have on the way out."""
    torch = sys.modules.get("torch")
    if torch is not None and torch.cuda.is_initialized():
        torch.cuda.synchronize()
    exit_now(0)
