"""`evaluate(job) -> Verdict`: the JUDGE. It decides a candidate's verdict without ever running its code.

Runs in the process `harness.worker.judge_process.run_job` starts (`python -m harness run`). Steps:

1. static scan of the candidate's source against the original file (harness.scan): "rejected_source";
2. build the original and the candidate (nvcc only: building is not executing) through the build cache
   (started before torch loads, by harness.judge.early_build, in the same process);
   a full disk is "environment_error", an original that fails to build is "original_failed";
3. load the ORIGINAL modules only (never the candidate's) and the reference ("reference_error" if it does not
   load); the environment (the GPU's performance model, cached per GPU beside the builds;
   harness.environment.measured, harness.timing.perf_model) and the idle GPU's latency were measured before
   step 2 ended and before any candidate process started, and compute-sanitizer's runs may start from then on
   (harness.judge.timing_gate);
4. the candidate process of phase `outputs` (harness.candidate.run; started before step 2 ends, so its start
   overlaps the build, it loads the candidate's modules only once they are built and scanned): compare its reported export
   signatures with the original's ("missing_export", "signature_mismatch"), then per case compute the
   original's outputs on identical inputs here, read the candidate's raw outputs (harness.candidate.exchange:
   validated against the job, deleted once judged) and judge every trial (harness.judge.correctness), the two launches
   back to back (harness.judge.back_to_back) and the candidate's determinism (not deterministic where the
   original is: incorrect);
5. when every case is correct, the paired timing (harness.judge.timings.time_cases): the ORIGINAL is timed
   here, the candidate in a new candidate process that loads only the candidate's modules, sample by
   sample over pipes, the candidate's process group stopped and the GPU checked quiet before each of the
   original's turns (harness.timing.quiet_gpu: "interferes" when it is not); every timed launch runs on a checked
   input set and is verified (harness.judge.timed_outputs); speedups, floors and suspect flags are computed here.

Before all of it, the OS sandbox every candidate process closes itself in (harness.sandbox): when it is
wanted and this kernel cannot provide it, the verdict is "sandbox_unavailable" and nothing is built or
run; every verdict records `sandbox`: "enforced", or "off (--no-sandbox)" / "off (ASTRA_SANDBOX=off)".

Fail closed: the original raising is "original_failed", reference.py raising "reference_error", a timing
mode that could not be measured "incomplete", a candidate process that dies "crashed", one that stalls
"timeout". A sticky CUDA error in this process raises `correctness.ContextLost` ("crashed" by the worker).
"""

from __future__ import annotations

import errno
import logging
import secrets
import shutil
import tempfile
import time
from contextlib import ExitStack
from dataclasses import asdict
from pathlib import Path
from typing import Any

import torch

from harness import sandbox
from harness.building.job_requests import build_requests, variants_used
from harness.building.module_loading import kept_signatures, load_module
from harness.building.nvcc_build import BuildResult, build_many, disk_full
from harness.candidate import cuda_ipc
from harness.candidate.exchange import (
    SIGNATURES,
    Malformed,
    case_dir,
    read_manifest,
    read_signatures,
    read_trial,
    trial_error,
)
from harness.candidate.run import CandidateRun, exchange_base, judge_deadline, progress_timeout, watched_kernels
from harness.environment.measured import measured_environment
from harness.job import Job
from harness.judge import early_build, timing_gate
from harness.judge.back_to_back import chained_call, judge_chain
from harness.judge.correctness import (
    OriginalFailed,
    ReferenceFailed,
    deterministic,
    judge_determinism,
    judge_trial,
    load_reference,
    new_result,
    original_outputs,
    output_digest,
    same_outputs,
    trial_inputs,
    trials_for,
)
from harness.judge.early_build import default_cache_dir, scan
from harness.judge.original_beside_build import Prepared, budget_bytes, prepare
from harness.judge.phase_clock import PhaseClock
from harness.judge.timed_outputs import Checked
from harness.judge.timings import apply_timings, copy_references, time_cases
from harness.judge.verdict import CaseResult, Verdict, decide
from harness.timing.quiet_gpu import Interference, ProcessGone, QuietGpu
from harness.timing.timing_link import LinkBroken
from harness.worker.judge_channel import current
from harness.worker.sanitizer import WATCHED_KERNELS

__all__ = ["evaluate", "default_cache_dir"]
log = logging.getLogger(__name__)
STARTUP_S = 180.0  # torch import and module load in the candidate process, before its signatures
FIRST_CASE_EXTRA_S = 30.0  # the first case also pays for the candidate's CUDA context
UNCHECKED_NOTE = "outputs not compared: the original timed against itself"


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


def build_all(job: Job, cache_dir: Path) -> tuple[dict[tuple[str, str], str], list[dict], Verdict | None]:
    """Build every module (never loading one): {(side, variant): .so path}, summaries, or a failure."""
    requests = build_requests(job)
    try:
        wanted = [r for _, _, r in requests]
        results = early_build.take(wanted, cache_dir) or build_many(wanted, cache_dir)
    except OSError as error:
        why = "the disk is full" if error.errno == errno.ENOSPC else "the build infrastructure failed"
        return {}, [], _failure(job, "environment_error", f"{why}: {error}")
    builds = [_build_summary(side, key, res) for (side, key, _), res in zip(requests, results)]
    order = sorted(zip(requests, results), key=lambda item: item[0][0] != "orig")  # the original's failures first
    for (side, key, _), res in order:
        if res.ok:
            continue
        if disk_full(res.error):
            return {}, builds, _failure(job, "environment_error", f"building {key} failed because the disk is full: "
                                        f"{_one_line(res.error)}", builds=builds)
        status = "build_failed" if side == "cand" else "original_failed"
        who = "candidate" if side == "cand" else "original"
        return {}, builds, _failure(job, status, f"{who} failed to build ({key}): {_one_line(res.error)}",
                                    builds=builds)
    paths = {(side, key): str(res.so_path) for (side, key, _), res in zip(requests, results)}
    if job.candidate_source is None:  # a self-check: the "candidate" process runs the original's module
        paths.update({("cand", key): paths[("orig", key)] for key in variants_used(job)})
    return paths, builds, None


def candidate_kernels(job: Job, builds: list[dict]) -> list[str] | None:
    """The mangled names of every kernel the candidate process's modules hold, from ptxas's report of their
    builds (the original's modules for a self-check); None when a build reported none (nothing to go by)."""
    side = "cand" if job.candidate_source is not None else "orig"
    return kernel_names([[resource["mangled"] for resource in build["resources"]]
                         for build in builds if build["side"] == side])


def kernel_names(per_module: list[list[str]]) -> list[str] | None:
    """The sorted set of mangled kernel names of some modules (one list per module, from ptxas's report of its
    build); None when there is no module or one reported none (nothing to go by)."""
    if not per_module or any(not names for names in per_module):
        return None
    return sorted({name for names in per_module for name in names})


def _load_all(job: Job, cache_dir: Path) -> tuple[dict, list[dict], Verdict | None]:
    """Build everything and load the ORIGINAL modules only: {("orig", variant): module}."""
    paths, builds, failure = build_all(job, cache_dir)
    modules: dict[tuple[str, str], Any] = {}
    if failure is not None:
        return modules, builds, failure
    for key in variants_used(job):
        try:
            modules[("orig", key)] = load_module(paths[("orig", key)])
        except Exception as error:  # an unloadable original: nothing to compare with
            return modules, builds, _failure(job, "original_failed", f"original module failed to load ({key}): "
                                             f"{_one_line(str(error))}", builds=builds)
    return modules, builds, None


def _launch(module: Any, entry: str):
    function = module.get_function(entry)
    return lambda args: function(*args)


def drop_in(job: Job, orig: dict[str, dict], cand: dict[str, dict]) -> tuple[dict, str | None, str]:
    """Signatures per variant and export, and (status, reason) of the first drop-in failure."""
    signatures: dict[str, dict] = {}
    for key in variants_used(job):
        names = _exports(job, key)
        theirs = cand.get(key) or {}
        signatures[key] = {name: {"orig": orig[key][name], "cand": theirs.get(name)} for name in names}
        for name in names:
            if orig[key][name] is None:
                return signatures, "original_failed", f"the original module of {key} lacks export {name}"
            if theirs.get(name) is None:
                return signatures, "missing_export", f"candidate does not export {name} (variant {key})"
            if theirs[name] != orig[key][name]:
                return signatures, "signature_mismatch", f"{name}: candidate {theirs[name]} != original {orig[key][name]}"
    return signatures, None, ""


def judge_case(index: int, run: CandidateRun, job: Job, trials: list, launch, device: torch.device,
               reference, checked: dict[str, Checked], clock: PhaseClock | None = None,
               prepared: Prepared | None = None) -> CaseResult | None:
    """The verdict on one case from the candidate's streamed results (None: they never came). What the timed
    launches are verified against goes into `checked` (harness.judge.timed_outputs): the digest of the candidate's
    checked outputs on the first seed, computed here from its raw outputs, whether they matched the
    original's bit for bit on every trial, and both sides' determinism. `prepared`: trials whose inputs, original's
    and reference's outputs were computed beside the build (harness.judge.original_beside_build)."""
    case = job.cases[index]
    clock = clock or PhaseClock()
    directory = case_dir(run.work, index)
    with clock("wait_candidate"):
        came = run.wait_for(directory, progress_timeout(job.options.case_timeout_s + (FIRST_CASE_EXTRA_S if index == 0 else 0.0)))
    if not came:
        return None
    result = new_result(case)
    seed = job.options.seeds[0] if job.options.seeds else 0
    record = Checked()
    imports = cuda_ipc.Imports()
    first = None
    try:
        manifest = read_manifest(directory, case, trials)
        exact = True
        for t, trial in enumerate(trials):
            entry = manifest["trials"][t]
            error = trial_error(entry)
            ready = prepared.take(index, t) if prepared is not None else None
            with clock("original"):
                inputs, orig = ready[:2] if ready is not None else original_outputs(launch, case, trial, device)
            with clock("read_candidate"):
                cand = None if error else read_trial(directory, t, entry, case, device, imports=imports)
            with clock("compare"):
                if judge_trial(result, case, job, trial, inputs, orig, cand, error, reference,
                               ready[2] if ready is not None else None):
                    record.orig_writes_inputs = True
                exact = exact and cand is not None and same_outputs(case, orig, cand)
            if tuple(trial) == ("seed", seed):
                first = (inputs, orig)  # the back-to-back launches and the determinism runs start from these
                if cand is not None:
                    record.digest = output_digest(case, cand, job.options.digest_key)
            del inputs, orig, cand, ready
        record.bit_exact = exact
        with clock("back_to_back"):
            _judge_chain(directory, manifest, case, job, launch, device, result, reference, imports, first)
        digests = manifest["determinism"]
        result.deterministic_cand = None if digests is None else digests[0] == digests[1]
        read = True
    except Malformed as error:
        result.fail(f"the candidate process's results are malformed: {error}")
        read = False
    finally:
        imports.close()  # before the directory goes: then the candidate process may free what was mapped
        clock.count("tensors_over_cuda_ipc", imports.copies)
        shutil.rmtree(directory, ignore_errors=True)
    with clock("determinism"):
        result.deterministic_orig = deterministic(launch, case, seed, device, first)
    del first
    if prepared is not None:
        prepared.release_when_taken()
    if read:
        judge_determinism(result)
    record.deterministic_orig, record.deterministic_cand = result.deterministic_orig, result.deterministic_cand
    checked[case.id] = record
    return result


def _judge_chain(directory: Path, manifest: dict, case, job: Job, launch, device: torch.device,
                 result: CaseResult, reference, imports: cuda_ipc.Imports | None = None,
                 first: tuple[dict, dict] | None = None) -> None:
    """Two launches back to back (harness.back_to_back): the original's here, the candidate's from its results.
    `first`: the first seed's inputs, when the trials already drew them."""
    chain = manifest.get("chain")
    if chain is None:
        raise Malformed("no back-to-back launches")
    seed = job.options.seeds[0] if job.options.seeds else 0
    inputs = first[0] if first is not None else trial_inputs(case, ("seed", seed), device)
    orig, orig_error = chained_call(launch, inputs, case, device, f"{case.id}: orig back to back")
    if orig is None:
        result.notes.append(f"two launches back to back not checked: the original raised {orig_error}")
        return
    if "error" in chain:
        judge_chain(result, case, job, inputs, orig, None, str(chain["error"])[:300])
        return
    cand = [read_trial(directory, i, entry, case, device, prefix="c", imports=imports)
            for i, entry in enumerate(chain["launches"])]
    judge_chain(result, case, job, inputs, orig, cand, None, reference)


def _device(device: torch.device | str | None) -> torch.device:
    device = torch.device(device or "cuda")
    if device.type == "cuda":
        if device.index is None:
            device = torch.device("cuda", torch.cuda.current_device())
        torch.cuda.set_device(device)
    return device


def evaluate(job: Job, device: torch.device | str | None = None) -> Verdict:
    """The verdict on `job.candidate_source` against the original (see the module docstring)."""
    label, refusal = sandbox.decide(job.options.sandbox)
    verdict = _failure(job, "sandbox_unavailable", refusal) if refusal else _judged(job, device)
    verdict.sandbox = label
    return verdict


def _judged(job: Job, device: torch.device | str | None) -> Verdict:
    start = time.monotonic()
    try:
        return _evaluate(job, _device(device), start)
    except OriginalFailed as error:
        return _failure(job, "original_failed", str(error))
    except ReferenceFailed as error:
        return _failure(job, "reference_error", str(error))
    except OSError as error:  # the judge's own infrastructure (disk, process table, ...), not the candidate
        why = "the disk is full" if error.errno == errno.ENOSPC else "the judge's infrastructure failed"
        return _failure(job, "environment_error", f"{why}: {error}")


def _evaluate(job: Job, device: torch.device, start: float) -> Verdict:
    deadline = judge_deadline(start, job)
    if not job.options.outputs_checked and job.candidate_source is not None:
        raise ValueError("a candidate is never timed without its outputs checked (outputs_checked: false is for "
                         "the original against itself: `astra survey`, `astra bench --time-only`)")
    why = scan(job)
    if why:
        return _failure(job, "rejected_source", why)
    job.options.digest_key = secrets.randbits(62)  # fresh for every evaluation (harness.judge.digest)
    # the idle GPU's latency first, before any candidate process starts (harness.timing.quiet_gpu)
    timed = job.options.modes and device.type == "cuda" and any(case.timed for case in job.cases)
    quiet = QuietGpu(device) if timed else None
    mark = time.monotonic()
    env = measured_environment(device, default_cache_dir(job)) if device.type == "cuda" else {}  # model cached per GPU
    env_s = time.monotonic() - mark
    timing_gate.mark_measured(job.options.timing_gate)  # compute-sanitizer may start now, its own judges building
    outputs_run = _outputs_run_beside_the_build(job, device, deadline)
    try:
        # the copy references of the timed cases while nvcc still builds: the GPU is idle until the modules are built
        copies = copy_references(job, device, early_build.running) if quiet is not None else {}
        # then, where the original is built already, its outputs and the reference's on the trials
        prepared = None
        if quiet is not None and job.options.outputs_checked:
            prepared = prepare(job, device, early_build.running, _trials(job), _launch, budget_bytes(device))
        return _built_and_judged(job, device, start, deadline, outputs_run, quiet, env, env_s, copies, prepared)
    finally:
        if outputs_run is not None:
            outputs_run.close()


def _outputs_run_beside_the_build(job: Job, device: torch.device, deadline: float) -> CandidateRun | None:
    """The outputs phase's candidate process, started before the build ends, so that its start (torch, CUDA,
    the sandbox's warm-up) overlaps the build; it loads nothing until `go`. None where the outputs are not
    checked, or where the candidate's writable directories would lie inside the build cache (the sandbox
    would refuse to let it read there). Where compute-sanitizer's tool must be told the candidate's kernels
    when the process starts (`JudgeConfig.watch_own_kernels`), it is told the original's, from the original's
    cached build (`_outputs_phase` starts another process if the candidate's turn out different); with no
    cached original, the process starts once the modules are built."""
    if not job.options.outputs_checked:
        return None
    kernels = None
    if current().watch_own_kernels:
        kernels = watched_kernels(original_kernels(job))
        if kernels is None:
            return None
    cache = default_cache_dir(job)
    cache.mkdir(parents=True, exist_ok=True)
    base = Path(exchange_base() or tempfile.gettempdir()).resolve()
    if base.is_relative_to(cache.resolve()):
        return None
    return CandidateRun(job, "outputs", device=str(device), cand_so=None, modules_dir=str(cache), deadline=deadline,
                        exports={key: _exports(job, key) for key in variants_used(job)}, trials=_trials(job),
                        kernels=kernels)


def original_kernels(job: Job) -> list[str] | None:
    """The mangled names of every kernel of the original's modules, from their cached builds' ptxas reports,
    without building (None: an original module not built yet, or one whose build reported no kernel)."""
    builds = early_build.cached_originals(job)
    if builds is None:
        return None
    return kernel_names([[resource.mangled for resource in result.resources] for result in builds.values()])


def _trials(job: Job) -> list[list[tuple[str, int]]]:
    return [trials_for(case, job.options.seeds, job.options.extra_trials) for case in job.cases]


def _built_and_judged(job: Job, device: torch.device, start: float, deadline: float,
                      outputs_run: CandidateRun | None, quiet: QuietGpu | None, env: dict, env_s: float,
                      copies: dict[str, float | None], prepared: Prepared | None = None) -> Verdict:
    phases: dict[str, float] = {"copies_beside_build": float(len(copies)),
                                "trials_beside_build": float(len(prepared or ()))}
    log.info("building %d module(s) (original and candidate)", len(build_requests(job)))
    paths, builds, failure = build_all(job, default_cache_dir(job))
    phases["build_s"] = time.monotonic() - start
    phases["outputs_process_beside_build"] = float(outputs_run is not None)
    log.info("built in %.1f s", phases["build_s"])

    def done(verdict: Verdict) -> Verdict:
        verdict.builds, verdict.phases = verdict.builds or builds, {**phases, "total_s": time.monotonic() - start}
        return verdict

    if failure is not None:
        return done(failure)
    keys = variants_used(job)
    if job.candidate_source is not None:  # the backstop: what the built .so imports and runs at load time
        from harness.scan.elf_scan import scan_shared_object

        for key in keys:
            why = scan_shared_object(paths[("orig", key)], paths[("cand", key)])
            if why:
                return done(_failure(job, "rejected_source", f"{key}: {why}"))
    try:
        modules = {key: (prepared.modules[key] if prepared is not None and key in prepared.modules
                         else load_module(paths[("orig", key)])) for key in keys}
    except Exception as error:  # an unloadable original: nothing to compare with
        return done(_failure(job, "original_failed", f"original module failed to load: {_one_line(str(error))}"))
    orig_signatures = {key: kept_signatures(modules[key], paths[("orig", key)], _exports(job, key)) for key in keys}
    reference = prepared.reference if prepared is not None else None
    if job.reference and reference is None:
        try:
            reference = load_reference(job.reference)
        except Exception as error:  # fail closed: a broken spec is not a pass with looser checks
            return done(_failure(job, "reference_error", f"reference.py does not load: {_one_line(str(error))}"))
    phases["env_s"] = env_s
    mark = time.monotonic()
    cand_so = {key: paths[("cand", key)] for key in keys}
    with ExitStack() as stack:
        timing = None
        if quiet is not None:
            # the idle latency once more, now that nvcc no longer loads the host (the outputs phase's process,
            # started beside the build, runs no candidate code before `go`; its warm-up is a few tiny kernels): the
            # lower of the two measurements counts
            quiet.refine()
            # the timing phase's candidate process now, so its start (torch, CUDA, the modules) overlaps the
            # outputs phase
            run = stack.enter_context(CandidateRun(job, "timing", device=str(device), cand_so=cand_so,
                                                   timed=[case.id for case in job.cases if case.timed],
                                                   deadline=deadline, link=True))
            timing = (run, quiet)
        kernels = watched_kernels(candidate_kernels(job, builds))  # under a tool that watches them alone
        if kernels:
            phases[WATCHED_KERNELS] = len(kernels)
        if not job.options.outputs_checked:
            results, checked, signatures = _unchecked(job), {}, {}
        else:
            clock = PhaseClock("check_")
            outcome = _outputs_phase(job, device, deadline, keys, cand_so, modules, orig_signatures, reference, env,
                                     clock, outputs_run, kernels, prepared)
            phases.update(clock.rounded())
            if prepared is not None:  # what the phase did not take (it stopped early) goes, and the cache with it
                prepared.trials.clear()
                torch.cuda.empty_cache()
            if isinstance(outcome, Verdict):
                return done(outcome)
            results, checked, signatures = outcome
        phases["check_s"] = time.monotonic() - mark
        if timing is not None and all(result.correct for result in results):
            mark = time.monotonic()
            held = timing_gate.wait_sanitized(job.options.timing_gate, deadline)
            phases["wait_sanitizer_s"] = round(time.monotonic() - mark, 3)
            if held is not None:  # the sanitizer found something, or could not conclude: nothing to time
                verdict = _timing_phase(job, device, keys, modules, None, results, checked, signatures, env, phases,
                                        reference, copies)
                status, _, reason = held.partition(": ")
                verdict.status, verdict.correct, verdict.faster, verdict.reason = status, False, False, reason
                verdict.notes.append("timing skipped: compute-sanitizer did not come out clean")
                return done(verdict)
        return done(_timing_phase(job, device, keys, modules, timing, results, checked, signatures, env, phases,
                                  reference, copies))


def _unchecked(job: Job) -> list[CaseResult]:
    """Results with no outputs compared: the original timed against itself (Options.outputs_checked)."""
    results = []
    for case in job.cases:
        result = new_result(case)
        result.notes.append(UNCHECKED_NOTE)
        results.append(result)
    return results


def _outputs_phase(job: Job, device: torch.device, deadline: float, keys: list[str], cand_so: dict,
                   modules: dict, orig_signatures: dict, reference, env: dict, clock: PhaseClock,
                   started: CandidateRun | None = None, kernels: list[str] | None = None,
                   prepared: Prepared | None = None):
    """The candidate's outputs judged case by case: (results, what the timed launches are verified against,
    signatures), or a failure. `started`: the phase's candidate process, started beside the build, sent on to
    the built and scanned modules here; else, or when the kernels its tool watches are not `kernels` (it was
    told the original's, and the candidate's differ: it is closed), one is started now (`kernels`: the
    candidate's, for a tool that watches them alone: harness.candidate.run.candidate_prefix). `clock` counts
    `outputs_process_replaced` when that happens. `prepared`: the trials the judge computed beside the build
    (harness.judge.original_beside_build)."""
    trials = _trials(job)
    launches = {key: _launch(modules[key], job.entry) for key in keys}
    results: list[CaseResult] = []
    checked: dict[str, Checked] = {}
    if started is not None and started.watched != kernels:  # its tool watches other kernels than the candidate's
        started.close()
        started = None
        clock.count("outputs_process_replaced", 1)
    if started is not None:
        started.go(cand_so)
    run = started or CandidateRun(job, "outputs", device=str(device), cand_so=cand_so, deadline=deadline,
                                  exports={key: _exports(job, key) for key in keys}, trials=trials, kernels=kernels)
    with run:
        with clock("candidate_start"):
            started = run.wait_for(run.work / SIGNATURES, progress_timeout(STARTUP_S))
        if not started:
            status, reason = run.failure("export signatures")
            if status == "crashed" and run.outcome is not None and run.outcome.returncode == 1:
                status, reason = "build_failed", f"candidate module failed to load: {reason}"
            return _failure(job, status, reason)
        try:
            cand_signatures = read_signatures(run.work)
        except Malformed as error:
            return _failure(job, "crashed", f"candidate process: {error}")
        signatures, status, reason = drop_in(job, orig_signatures, cand_signatures)
        if status:
            return _failure(job, status, reason, signatures=signatures)
        for index, case in enumerate(job.cases):
            log.info("judging case %d/%d %s", index + 1, len(job.cases), case.id)
            result = judge_case(index, run, job, trials[index], launches[case.variant], device, reference, checked,
                                clock, prepared)
            if result is None:
                status, reason = run.failure(f"results for {case.id}")
                return _failure(job, status, reason, signatures=signatures, env=env)
            results.append(result)
        if not run.clean_exit():
            status, reason = run.failure("a clean exit")
            return _failure(job, status, f"{reason} (after its results)", signatures=signatures, env=env)
    return results, checked, signatures


def _timing_phase(job: Job, device: torch.device, keys: list[str], modules: dict, timing: tuple | None,
                  results: list[CaseResult], checked: dict, signatures: dict, env: dict, phases: dict,
                  reference=None, copies: dict[str, float | None] | None = None) -> Verdict:
    """The original timed here, the candidate in the timing phase's candidate process (`timing`: that run and
    the QuietGpu measured before it started; None: nothing to time here), interleaved and every timed launch
    verified (harness.judge.timings.time_cases); then the verdict (see the module docstring). `copies`: the copy
    references measured while nvcc built (harness.judge.timings.copy_references), by case id."""
    mark = time.monotonic()
    notes: list[str] = []
    incomplete: list[str] = []
    timed = [case.id for case, result in zip(job.cases, results) if case.timed and result.timed]
    if not all(r.correct for r in results):
        notes.append("timing skipped: the candidate is incorrect")
    elif timed and timing is not None:
        log.info("timing %d case(s), %s, original here and candidate in its process", len(timed),
                 " and ".join(job.options.modes))
        orig_launches = {key: _launch(modules[key], job.entry) for key in keys}
        run, quiet = timing
        try:
            clock = PhaseClock("time_")
            timings = time_cases(job, results, checked, orig_launches, run, device, quiet, reference, clock)
            phases.update(clock.rounded())
            run.remote_side(job.options.case_timeout_s).exit()
        except Interference as error:
            return _failure(job, "interferes", str(error), signatures=signatures, env=env)
        except (LinkBroken, ProcessGone):
            status, reason = run.failure("timings")
            return _failure(job, status, reason, signatures=signatures, env=env)
        if not run.clean_exit():
            status, reason = run.failure("a clean exit")
            return _failure(job, status, f"{reason} (after its timings)", signatures=signatures, env=env)
        incomplete = apply_timings(timings, job, results, env, device, copies)
    phases["time_s"] = time.monotonic() - mark
    verdict = decide(results, list(job.options.modes), job.options.slowdown_threshold)
    if verdict.status == "correct" and incomplete:
        more = f" (+{len(incomplete) - 1} more)" if len(incomplete) > 1 else ""
        verdict.status, verdict.faster, verdict.reason = "incomplete", False, incomplete[0] + more
    if verdict.status == "correct" and not job.options.outputs_checked:
        verdict.status, verdict.correct, verdict.faster = "timed", False, None  # correctness not established
        verdict.reason = verdict.reason.replace("correct on", "timed on", 1) + f" ({UNCHECKED_NOTE})"
        notes.append(UNCHECKED_NOTE)
    verdict.name, verdict.candidate_label = job.name, job.candidate_label
    verdict.env, verdict.signatures, verdict.notes = env, signatures, notes + incomplete
    return verdict
