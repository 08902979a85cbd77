"""The probe's processes: a case runner that may die, a parent that outlives it, memcheck on the original.

    python -m harness probe job.json --out result.json        `probe_job`: the module's whole probe
    python -m harness probe-cases request.json --results F    `run_cases`: the case runner (a child)

`probe_job` builds the ORIGINAL (harness.judge.evaluate.build_all: the same build cache, flags and loader as a
check; a job's candidate_source is ignored), then runs the cases in a case runner started in its own
process group (harness.worker.process_group.Isolated). The runner appends one JSON line per event to its results file:
{"env": ...} once, {"begin": i} before case i, {"poison": i, "tensor": name} before each run with a tensor
poisoned, {"case": i, "result": {...}} after it (harness.probe.observation), and {"done": true} at the end, so a fault
or a hang costs one case only (and one poisoned in step 4 of harness.probe.observation costs nothing: see `probe_cases`): when the runner dies, or gives no
result within `timeout_case_s`, the case it began is recorded as crashed or hung (with the tail of its
stderr), the group is killed, and a fresh runner takes the remaining cases (after a CUDA fault the
context is gone, so a new process is the only safe way on). A runner that fails before its first case
(the module does not load), or `LOST_BEFORE_GIVING_UP` lost cases before any is kept, ends the probe.
The runner loads the module inside the OS sandbox (harness.sandbox), as a candidate process does: a
draft's original is code nobody reviewed yet. The result records `sandbox` ("enforced", "off (why)").

Then compute-sanitizer memcheck over the smallest kept case (`harness.worker.sanitizer.sanitize_command`): the
case runner itself runs under the tool, one call of the original, so what memcheck watches is the
original kernel. `ASTRA_HARNESS_PROBE_LAUNCH=module:function` (or file.py:function) in the runner's
environment replaces the built modules with `function(job) -> {variant: launch}` (tests stand in
kernels that crash, hang or write in ways of their own; no build then happens).
"""

from __future__ import annotations

import json
import logging
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Callable

from harness.candidate.process import _device  # one device rule for both workers
from harness.job import Job
from harness.sandbox import Confinement, SandboxUnavailable, decide, request_mode
from harness.worker.process_group import (
    Isolated,
    ProcessOutcome,
    clip,
    describe_exit,
    harness_env,
    read_json_object,
    tail,
    telling_line,
    write_json_atomic,
)

__all__ = ["PROBE_LAUNCH_ENV", "default_timeout", "probe_cases", "probe_isolated", "probe_job", "run_cases",
           "sanitize_case", "write_result"]
PROBE_LAUNCH_ENV = "ASTRA_HARNESS_PROBE_LAUNCH"
STARTUP_S = 180.0  # torch import, module load and CUDA context before the first case
LOST_BEFORE_GIVING_UP = 8  # cases crashed or hung in a row, none kept: the draft is wrong, stop restarting
POLL_S = 0.05
log = logging.getLogger(__name__)


# ---------------------------------------------------------------- the case runner (child)


def _emit(handle, event: dict) -> None:
    handle.write(json.dumps(event, default=str) + "\n")
    handle.flush()


def module_launches(job: Job, so_paths: dict[str, str]) -> dict[str, Callable]:
    """{variant: launch of job.entry} from the built original modules (raises if one does not load)."""
    from harness.building.module_loading import load_module

    launches = {}
    for variant, path in so_paths.items():
        function = load_module(path).get_function(job.entry)
        launches[variant] = lambda args, function=function: function(*args)
    return launches


def run_cases(request_path: str | Path, results_path: str | Path, launch_hook: Callable | None = None) -> int:
    """The case runner: probe each requested case, one JSON line per event (see the module docstring).
    Exit 0 when every case was probed, 3 after a lost CUDA context (the case is recorded as crashed), 4
    when the OS sandbox was required and cannot be had (nothing loaded; harness.sandbox)."""
    request = json.loads(Path(request_path).read_text())
    box = Confinement(request.get("sandbox"), writable=[Path(results_path).parent], readable=request["so"].values())
    with open(results_path, "a") as out:
        try:
            box.begin()  # before torch: see harness.sandbox.confine
        except SandboxUnavailable as error:
            _emit(out, {"fatal": f"{error}; nothing was loaded"})
            return 4
    import torch

    from harness.judge.correctness import ContextLost
    from harness.probe.observation import kernel_message, new_result, probe_case, relative_paths

    job = Job.from_dict(request["job"])
    roots = [job.build.source_root, *job.build.include_dirs]
    with open(results_path, "a") as out:
        try:
            device = _device(request["device"])
            if request.get("env"):  # before the seal: it runs nvidia-smi and nvcc
                from harness.environment.report import environment_report

                _emit(out, {"env": environment_report(measure=False)})
            box.warm_up(device, tvm_ffi=launch_hook is None)
            box.seal()
            launches = launch_hook(job) if launch_hook else module_launches(job, request["so"])
            box.lock_exec()
        except Exception as error:  # nothing can be probed: the parent ends the probe with this reason
            _emit(out, {"fatal": f"the original module failed to load: {kernel_message(error)}"})
            return 1
        for index in request["indices"]:
            case = job.cases[index]
            _emit(out, {"begin": index, "id": case.id})
            log.info("probe %s", case.id)
            poisoned: list[str] = []

            def on_poison(name: str, index: int = index) -> None:
                poisoned.append(name)
                _emit(out, {"poison": index, "tensor": name})

            try:
                result = probe_case(launches[case.variant], case, device, request.get("seed", 0),
                                    single=bool(request.get("single")), known=request.get("known", {}).get(str(index)),
                                    on_poison=on_poison)
            except ContextLost as error:  # the context is gone: report, and let a fresh runner go on
                why = kernel_message(str(error))
                if poisoned:  # lost with a tensor poisoned: the parent retries the case knowing it is read
                    _emit(out, {"poison_lost": index, "tensor": poisoned[-1], "why": why})
                else:
                    result = {**new_result(case), "status": "crashed", "message": why}
                    _emit(out, {"case": index, "result": relative_paths(result, roots)})
                return 3
            except torch.cuda.OutOfMemoryError as error:
                result = {**new_result(case), "status": "error", "message": f"CUDA out of memory: {kernel_message(error)}"}
            _emit(out, {"case": index, "result": relative_paths(result, roots)})
            if device.type == "cuda":
                torch.cuda.empty_cache()
        _emit(out, {"done": True})
    return 0


# ---------------------------------------------------------------- the parent


class _Lines:
    """Complete JSON lines appended to a file since the last read."""

    def __init__(self, path: Path) -> None:
        self.path, self.offset, self.partial = path, 0, b""

    def read(self) -> list[dict]:
        try:
            with open(self.path, "rb") as handle:
                handle.seek(self.offset)
                data = handle.read()
        except FileNotFoundError:
            return []
        self.offset += len(data)
        *lines, self.partial = (self.partial + data).split(b"\n")
        events = []
        for line in lines:
            try:
                event = json.loads(line)
            except ValueError:
                continue  # a torn line from a dying process: the case counts as unfinished
            if isinstance(event, dict):
                events.append(event)
        return events


def _start(job: Job, so: dict[str, str], indices: list[int], folder: Path, *, device: str, python: str,
           want_env: bool, single: bool, known: dict[int, dict[str, str]] | None = None) -> tuple[list[str], Path]:
    """Write a runner's request; return its command and results path."""
    folder.mkdir(parents=True, exist_ok=True)
    request, results = folder / "request.json", folder / "cases.jsonl"
    request.write_text(json.dumps({"job": json.loads(job.to_json()), "device": device, "so": so, "indices": indices,
                                   "seed": 0, "env": want_env, "single": single,
                                   "sandbox": request_mode(decide(job.options.sandbox)[0]),
                                   "known": {str(i): roles for i, roles in (known or {}).items()}}))
    return [python, "-m", "harness", "probe-cases", str(request), "--results", str(results)], results


def _one_runner(command: list[str], results: Path, folder: Path, *, env: dict[str, str], timeout_case_s: float,
                startup_s: float) -> tuple[list[dict], ProcessOutcome, int | None, bool]:
    """Run one case runner until it exits or stalls. Returns (events, outcome, the case it was on when
    it ended or None, whether it was killed for time)."""
    proc = Isolated(command, env=env, cwd=folder, die_with_parent=True)
    lines = _Lines(results)
    events: list[dict] = []
    current: int | None = None
    deadline = time.monotonic() + startup_s + timeout_case_s
    killed = False
    while True:
        exited = proc.poll()
        for event in lines.read():
            events.append(event)
            if "begin" in event:
                current = int(event["begin"])
            elif "case" in event:
                current = None
            deadline = time.monotonic() + timeout_case_s
        if exited:
            break
        if time.monotonic() > deadline:
            killed = True
            break
        time.sleep(POLL_S)
    outcome = proc.kill() if killed else proc.finish(5.0)
    for event in lines.read():
        events.append(event)
        current = int(event["begin"]) if "begin" in event else (None if "case" in event else current)
    return events, outcome, current, killed


def _lost_case(job: Job, index: int, outcome: ProcessOutcome, killed: bool, timeout_case_s: float) -> dict:
    """The record of a case whose runner died on it or stalled."""
    from harness.probe.observation import new_result

    line = telling_line(outcome.stderr)
    if killed:
        status = "hung"
        message = f"no result within {timeout_case_s:g} s; the runner's process group was killed"
        message += f" (last output: {line})" if line else ""
    else:
        status = "crashed"
        message = f"the case runner {describe_exit(outcome.returncode or 0)}" + (f": {line}" if line else "")
    return {**new_result(job.cases[index]), "status": status, "message": clip(message),
            "stderr_tail": tail(outcome.stderr, 20)}


def probe_cases(job: Job, so: dict[str, str], work: Path, *, device: str, timeout_case_s: float, python: str,
                env: dict[str, str], startup_s: float = STARTUP_S) -> tuple[list[dict], dict, str | None]:
    """Every case of `job` through case runners, a fresh one after each crash or hang.
    Returns (case results in job order, the runner's env report, a fatal reason or None).

    A runner that dies or stalls while a tensor of its case is poisoned (harness.probe.observation step 4) has shown
    that the tensor's prior content is read (as indices, say): the case is retried in a fresh runner with
    that finding (`known`), so it costs the case nothing; it never poisons the same tensor twice."""
    pending = list(range(len(job.cases)))
    results: dict[int, dict] = {}
    known: dict[int, dict[str, str]] = {}
    env_info: dict = {}
    attempt = 0
    while pending:
        attempt += 1
        command, path = _start(job, so, pending, work / f"runner{attempt}", device=device, python=python,
                               want_env=not env_info, single=False, known=known)
        events, outcome, current, killed = _one_runner(command, path, work / f"runner{attempt}", env=env,
                                                       timeout_case_s=timeout_case_s, startup_s=startup_s)
        began = False
        for event in events:
            if "fatal" in event:
                return _ordered(results), env_info, str(event["fatal"])
            env_info = event.get("env", env_info)
            began = began or "begin" in event
            if "case" in event:
                results[int(event["case"])] = event["result"]
        poisoning = _poisoning(events, current)
        if current is not None and poisoning is not None:
            lost = [e["why"] for e in events if e.get("poison_lost") == current and e.get("tensor") == poisoning]
            how = f"no result within {timeout_case_s:g} s" if killed else (lost or [describe_exit(outcome.returncode or 0)])[0]
            known.setdefault(current, {})[poisoning] = f"{'hung' if killed else 'crashed'} ({how})"
        elif current is not None:
            results[current] = _lost_case(job, current, outcome, killed, timeout_case_s)
            if _only_lost(results) >= LOST_BEFORE_GIVING_UP:
                left = len(job.cases) - len(results)
                return _ordered(results), env_info, (
                    f"the original crashed or hung on each of the first {len(results)} cases it ran (last: "
                    f"{results[current]['message']}); {left} more not run: check the draft's shapes and init")
        if not began:
            why = "did not start within {:g} s".format(startup_s) if killed else describe_exit(outcome.returncode or 0)
            line = telling_line(outcome.stderr)
            return _ordered(results), env_info, f"the case runner {why} before its first case" + (f": {line}" if line else "")
        pending = [index for index in pending if index not in results]
    return _ordered(results), env_info, None


def _only_lost(results: dict[int, dict]) -> int:
    """How many cases crashed or hung while none was kept (0 once one is kept)."""
    statuses = [result["status"] for result in results.values()]
    return 0 if "kept" in statuses else sum(status in ("crashed", "hung") for status in statuses)


def _poisoning(events: list[dict], current: int | None) -> str | None:
    """The tensor the runner was poisoning for case `current` when it ended (None: it was not)."""
    tensor = None
    for event in events:
        if event.get("begin") == current:
            tensor = None
        elif event.get("poison") == current and current is not None:
            tensor = str(event["tensor"])
    return tensor


def _ordered(results: dict[int, dict]) -> list[dict]:
    return [results[index] for index in sorted(results)]


def sanitize_case(job: Job, so: dict[str, str], index: int, work: Path, *, device: str, python: str,
                  env: dict[str, str], timeout_s: float) -> dict:
    """memcheck over one call of the original on case `index` (the case runner runs under the tool)."""
    from harness.worker.sanitizer import sanitize_command

    folder = work / "memcheck"
    command, path = _start(job, so, [index], folder, device=device, python=python, want_env=False, single=True)
    report = sanitize_command(command, tool="memcheck", timeout_s=timeout_s, env=env, cwd=folder)
    report["case"] = job.cases[index].id
    done = [event["result"] for event in _Lines(path).read() if "case" in event]
    if not report["findings"] and not report["skipped"] and (not done or done[0]["status"] != "kept"):
        why = done[0]["message"] if done else "the case runner gave no result"
        report["skipped"] = report["unavailable"] = f"memcheck: the case did not complete under the tool ({why})"
    return report


def probe_job(job: Job, *, device: str = "cuda", timeout_case_s: float = 120.0, sanitizer: bool = True,
              sanitizer_timeout_s: float = 900.0, python: str = sys.executable,
              env: dict[str, str] | None = None) -> dict:
    """The whole probe of one module (see the module docstring): {name, status, reason, cases, sanitizer,
    env, builds, wall_s}. Never raises for the kernel's sake."""
    from harness.judge.evaluate import build_all, default_cache_dir
    from harness.probe.observation import decide as probe_decision

    start = time.monotonic()
    run_env = harness_env(env)
    label, refusal = decide(job.options.sandbox)
    result: dict[str, Any] = {"name": job.name, "status": "failed", "reason": refusal or "", "cases": [],
                              "sanitizer": None, "env": {}, "builds": [], "seed": 0, "sandbox": label}
    if refusal:
        return result
    so: dict[str, str] = {}
    if not run_env.get(PROBE_LAUNCH_ENV):
        original = Job.from_dict({**json.loads(job.to_json()), "candidate_source": None})
        paths, result["builds"], failure = build_all(original, default_cache_dir(original))
        if failure is not None:
            result.update(reason=failure.reason, wall_s=round(time.monotonic() - start, 3))
            return result
        so = {variant: path for (side, variant), path in paths.items() if side == "orig"}
    with tempfile.TemporaryDirectory(prefix="astra-probe-") as tmp:
        cases, result["env"], fatal = probe_cases(job, so, Path(tmp), device=device, timeout_case_s=timeout_case_s,
                                                  python=python, env=run_env)
        result["cases"] = cases
        if fatal:
            result.update(reason=fatal, wall_s=round(time.monotonic() - start, 3))
            return result
        kept = [i for i, case in enumerate(cases) if case["status"] == "kept"]
        if sanitizer and kept:
            smallest = min(kept, key=lambda i: (job.cases[i].bytes, job.cases[i].id))
            result["sanitizer"] = sanitize_case(job, so, smallest, Path(tmp), device=device, python=python,
                                                env=run_env, timeout_s=sanitizer_timeout_s)
    result["status"], result["reason"] = probe_decision(cases, result["sanitizer"] if sanitizer else None)
    result["wall_s"] = round(time.monotonic() - start, 3)
    return result


def probe_isolated(job: Job, *, timeout_s: float, device: str = "cuda", timeout_case_s: float = 120.0,
                   sanitizer: bool = True, sanitizer_timeout_s: float = 900.0, python: str = sys.executable,
                   env: dict[str, str] | None = None, on_start: Callable[[Isolated], None] | None = None) -> dict:
    """`python -m harness probe` in its own process group (what `astra probe` runs, one per module and GPU
    slot); a probe process that dies or overruns `timeout_s` gives a failed result saying so. `on_start`
    gets the process handle (a caller that is interrupted kills its group)."""
    with tempfile.TemporaryDirectory(prefix="astra-probe-job-") as tmp:
        job_path, out = Path(tmp) / "job.json", Path(tmp) / "result.json"
        job_path.write_text(job.to_json())
        command = [python, "-m", "harness", "probe", str(job_path), "--out", str(out), "--device", device,
                   "--timeout-case", str(timeout_case_s), "--sanitizer-timeout", str(sanitizer_timeout_s)]
        command += [] if sanitizer else ["--no-sanitizer"]
        proc = Isolated(command, env=harness_env(env), cwd=tmp, die_with_parent=True)
        if on_start is not None:
            on_start(proc)
        outcome = proc.finish(timeout_s)
        result = read_json_object(out)
    if result is not None and "status" in result:
        return result
    line = telling_line(outcome.stderr)
    why = (f"did not finish within {timeout_s:g} s" if outcome.timed_out
           else f"{describe_exit(outcome.returncode or 0)} without a result")
    return {"name": job.name, "status": "failed", "reason": f"the probe process {why}" + (f": {line}" if line else ""),
            "cases": [], "sanitizer": None, "env": {}, "builds": [], "stderr_tail": tail(outcome.stderr, 10)}


def write_result(path: str | Path, result: dict) -> None:
    """The probe result, written atomically (the only result channel of `python -m harness probe`)."""
    write_json_atomic(path, result)


def default_timeout(job: Job, timeout_case_s: float, sanitizer_timeout_s: float) -> float:
    """A backstop for one module's whole probe: build, every case (each maybe restarting a runner), memcheck."""
    return 600.0 + (len(job.cases) + 2) * (timeout_case_s + 10.0) + sanitizer_timeout_s + STARTUP_S

