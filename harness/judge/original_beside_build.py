"""The original's side of the outputs phase, computed while nvcc builds the candidate.

Phase `outputs` judges every trial of every case from three things the judge makes itself: the trial's
inputs, the ORIGINAL's outputs on them, and the spec's float64 reference on them (harness.judge.correctness).
None of these depends on the candidate. Where the original's modules are already built (every check of an
optimisation run after its first), the judge loads them from the build cache while the candidate still
builds, when the GPU would stand idle, and computes these trial by trial, in the order phase `outputs` reads
them, for as long as the build runs and the kept tensors fit in `budget_bytes`. Phase `outputs` then takes
each trial's triple instead of computing it (`take`), and computes whatever was not reached, as before.

Nothing is decided here: a trial on which the original or the reference raises is not kept, so phase
`outputs` runs it again and fails the verdict as it always did ("original_failed", "reference_error"); any
other error (running out of memory among them) ends the work and the phase computes the rest, except one that
leaves the CUDA context unusable, which is the original's ("original_failed") or the reference's
("reference_error"), naming what it broke (`run_reference` waits for the reference's kernels, so that a
fault of theirs is laid at its door).

The kept tensors are counted by their storages: a trial is computed only where one more of its case's bound
(`trial_bytes`) still fits the budget, and kept only where what it holds does (a reference may return more
than the outputs). Their memory goes back to the device once every kept trial was taken. The modules and the
reference loaded here are the ones the judge goes on with (`modules`, `reference`), so nothing is loaded
twice. Only the ORIGINAL's cached build is ever loaded: the candidate's modules are not built yet, and the
judge never loads them anyway.
"""

from __future__ import annotations

import logging
from typing import Any, Callable

import torch

from harness.building.module_loading import load_module
from harness.job import Job
from harness.judge.correctness import (
    ContextLost,
    OriginalFailed,
    ReferenceFailed,
    describe,
    ensure_usable,
    first_line,
    load_reference,
    original_outputs,
    reference_args,
    run_reference,
)
from harness.judge.early_build import cached_originals
from harness.judge.inputs import storage_numel
from harness.timing.timed_sets import tensor_bytes

log = logging.getLogger(__name__)
BUDGET_MAX_BYTES = 8 << 30  # at most this much kept on the device, whatever is free
BUDGET_FREE_SHARE = 0.25  # and at most this share of the memory free when the work starts

Triple = tuple[dict[str, Any], dict[str, Any], dict[str, Any] | None]  # inputs, original's outputs, reference's


def _nbytes(*groups: dict[str, Any] | None) -> int:
    """Bytes of the storages behind the tensors of `groups` (a strided view's gaps included, each storage once)."""
    storages = {}
    for values in groups:
        for v in (values or {}).values():
            if isinstance(v, torch.Tensor):
                storage = v.untyped_storage()
                storages[storage.data_ptr()] = storage.nbytes()
    return sum(storages.values())


def trial_bytes(case) -> int:
    """What one trial of `case` keeps, at most: its tensors' storages as drawn, the original's copy of them and
    the reference's float64 outputs (8 bytes for every element of every storage: a bf16 output's is 4 x its size)."""
    elements = sum(storage_numel(a) for a in case.tensors() if a.role != "alias")
    return 2 * tensor_bytes(case) + 8 * elements


class Prepared:
    """The original's modules, the reference and the trials computed beside the build (see the module docstring)."""

    def __init__(self, modules: dict[str, Any], reference: Any = None) -> None:
        self.modules, self.reference = modules, reference
        self.trials: dict[tuple[int, int], Triple] = {}
        self.kept_bytes = 0

    def take(self, case_index: int, trial_index: int) -> Triple | None:
        """The triple of that trial, once (it is dropped here, so its memory goes when the phase is done with it)."""
        return self.trials.pop((case_index, trial_index), None)

    def __len__(self) -> int:
        return len(self.trials)

    def release_when_taken(self) -> None:
        """Once every kept trial was taken, give their memory back to the device (the candidate's process shares
        it), once."""
        if not self.trials and self.kept_bytes:
            self.kept_bytes = 0
            if torch.cuda.is_available():
                torch.cuda.empty_cache()


def budget_bytes(device: torch.device) -> int:
    free, _ = torch.cuda.mem_get_info(device)
    return int(min(BUDGET_MAX_BYTES, BUDGET_FREE_SHARE * free))


def original_modules(job: Job) -> dict[str, Any] | None:
    """The original's module of every variant the job uses, loaded from the build cache; None where one is not
    built yet (or does not load: the judge's own load after the build reports that)."""
    builds = cached_originals(job)
    if builds is None or any(result.so_path is None for result in builds.values()):
        return None
    try:
        return {key: load_module(str(result.so_path)) for key, result in builds.items()}
    except Exception:  # reported by the judge's own load, after the build
        return None


def prepare(job: Job, device: torch.device, busy: Callable[[], bool], trials: list[list[tuple[str, int]]],
            launch_of: Callable[[Any, str], Callable], budget: int) -> Prepared | None:
    """The original's outputs and the reference's of the job's trials, case by case, while `busy()` holds and
    the kept tensors stay within `budget` bytes; None where the original is not built yet. `launch_of(module,
    entry)`: how phase `outputs` calls an export."""
    if not busy():
        return None
    try:
        modules = original_modules(job)
        if modules is None:
            return None
        launches = {key: launch_of(module, job.entry) for key, module in modules.items()}
    except Exception:  # an export the original lacks: the judge's own load and signatures report it
        return None
    reference = None
    if job.reference:
        try:
            reference = load_reference(job.reference)
        except Exception:  # reported by the judge's own load ("reference_error")
            return Prepared(modules)
    prepared = Prepared(modules, reference)
    for index, case in enumerate(job.cases):
        for t, trial in enumerate(trials[index]):
            if not busy() or prepared.kept_bytes + trial_bytes(case) > budget:
                return prepared
            where = f"{case.id}: {describe(trial)}"
            try:
                inputs, orig = original_outputs(launches[case.variant], case, trial, device)
            except Exception as error:  # phase `outputs` meets it again, and fails the verdict as it always did
                _usable(device, error, where, OriginalFailed)
                return prepared
            try:  # run_reference waits for its kernels: a fault of theirs is the reference's
                ref_out = (run_reference(reference, case, reference_args(inputs), describe(trial))
                           if reference is not None else None)
            except Exception as error:
                _usable(device, error, where, ReferenceFailed)
                return prepared
            size = _nbytes(inputs, orig, ref_out)
            if prepared.kept_bytes + size > budget:  # a reference's extra outputs can pass the bound
                return prepared
            prepared.trials[(index, t)] = (inputs, orig, ref_out)
            prepared.kept_bytes += size
    return prepared


def _usable(device: torch.device, error: BaseException, where: str, blame: type[RuntimeError]) -> None:
    """Raise `blame` (OriginalFailed, or ReferenceFailed for the reference) where `error` left the CUDA context
    unusable: only the original and the reference ran here, and phase `outputs` could not even start."""
    if isinstance(error, torch.cuda.OutOfMemoryError):  # no room beside the build: phase `outputs` computes the rest
        log.info("the original's outputs beside the build stopped at %s: out of memory", where)
        return
    try:
        ensure_usable(device, error, where)
    except ContextLost as lost:
        who = "the reference" if blame is ReferenceFailed else "the original"
        raise blame(f"{where}: {who}, run beside the build, left the GPU unusable: {first_line(lost)}") from error
    log.info("the original's outputs beside the build stopped at %s: %s", where, first_line(error))
