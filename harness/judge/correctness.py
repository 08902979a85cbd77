"""Correctness of one case: the candidate against the original (and a float64 reference when given).

Split in two so the sides can live in different processes: `run_side` runs ONE side on one trial
(fresh inputs from `trial_inputs`, `out` tensors poisoned, one stream-ordered call); `judge_trial`
compares both sides' post-call tensors for one trial. The judge (harness.judge.evaluate) runs the original
itself and reads the candidate's outputs from the candidate process; `harness.judge.both_sides.check_case` runs both sides in
one process (CPU tests, trusted code only).

Trials (`trials_for`): every seed of the job, plus, on fresh seeds, a `large`, a `small` and an
`extreme` trial where the case has random float tensors (harness.judge.inputs). Per trial:

- every `out`/`inout` tensor is compared (compare.compare_outputs with the output's tolerance), an
  `unordered` one after its rows are sorted (`canonical`); one that holds exactly the original's bytes gets
  the check that comparison would give without it being computed (compare.same_bytes_check), and its error
  against a reference is the original's, computed once;
  `scratch` tensors (workspaces) are never compared, and an absent optional tensor (None) is skipped;
- every `in` tensor must still hold its exact bytes on the candidate's side (where the original also
  writes it, the spec's role is wrong: it is noted and compared as an output instead);
- a strided view (`row_stride`) must leave the storage between its rows unchanged (compare.gaps_unchanged);
- with a reference, float outputs are judged by the reference rule (plus the NaN/Inf-position rule);
  the tolerance check against the original is still recorded; integer outputs are always exact.

Determinism (two runs of each side on identical inputs, bitwise) is recorded; a candidate that is not
deterministic where the original is fails the case (`judge_determinism`): bits it may vary by are bits a
timed launch could hide skipped work in, and they would move its timed checks from bits to values.
Two launches back to back, the second depending on the first, are checked too (harness.back_to_back).
A candidate launch that raises fails the case. Fail closed: the original raising raises
`OriginalFailed`, a reference.py that raises raises `ReferenceFailed` (the judge turns them into the
"original_failed" and "reference_error" verdicts). If the CUDA context is no longer usable after a
launch, `ContextLost` propagates so the worker reports the job as crashed.
Works on the CPU with Python callables as launches, which is how the CPU tests drive it.
"""

from __future__ import annotations

import importlib.util
import logging
from contextlib import contextmanager
from typing import Any, Callable, Iterator, Sequence

import torch

from harness.job import Case, Job
from harness.judge.compare import (
    OutputCheck,
    compare_outputs,
    error_vs_reference,
    gaps_unchanged,
    reference_error,
    reference_stats,
    reference_verdict,
    same_bytes_checks,
    sort_rows_together,
    tolerance_for,
    unchanged_all,
)
from harness.judge.digest import digest
from harness.judge.inputs import (
    clone_inputs,
    has_extreme_trial,
    has_large_trial,
    has_small_trial,
    make_inputs,
    poison_outputs,
    to_call_args,
)
from harness.judge.verdict import CaseResult

log = logging.getLogger(__name__)
Launch = Callable[[Sequence[Any]], Any]
Reference = Callable[[dict, dict], dict]
Trial = tuple[str, int]  # (kind: harness.judge.inputs.TRIALS, seed)
LARGE_SEED_OFFSET = 1000  # the large trial's seed: max(seeds) + this
SMALL_SEED_OFFSET = 2000
EXTREME_SEED_OFFSET = 3000


class ContextLost(RuntimeError):
    """A launch left the CUDA context unusable (sticky error): evaluation cannot go on in-process."""


class OriginalFailed(RuntimeError):
    """The ORIGINAL raised on a case: there is nothing to compare the candidate with."""


class ReferenceFailed(RuntimeError):
    """The spec's reference.py raised (or does not load): the spec is broken, not the candidate."""


def synchronize(device: torch.device) -> None:
    """Wait for the device (no-op on the CPU)."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def ensure_usable(device: torch.device, error: BaseException, where: str) -> None:
    """Raise ContextLost if the CUDA context no longer works after `error` happened at `where`."""
    if device.type != "cuda":
        return
    try:
        torch.cuda.synchronize(device)
        torch.ones(1, device=device).add_(1).item()
    except RuntimeError as sticky:
        raise ContextLost(f"{where}: {error} (context unusable: {sticky})") from error


def first_line(error: BaseException) -> str:
    text = str(error).strip().splitlines()
    return f"{type(error).__name__}: {text[0] if text else ''}"[:300]


# Cycles the checking stream sleeps before (re)writing the outputs and launching: ~0.5 ms on Hopper.
_DELAY_CYCLES = 1_000_000
_streams: dict[int, torch.cuda.Stream] = {}


def _check_stream(device: torch.device) -> "torch.cuda.Stream":
    index = device.index if device.index is not None else torch.cuda.current_device()
    if index not in _streams:
        _streams[index] = torch.cuda.Stream(device=device)
    return _streams[index]


def call(launch: Launch, args: dict[str, Any], case: Case, device: torch.device, where: str) -> str | None:
    """Run one launch and synchronise; the error's first line if it raised (context checked).

    On a GPU the call is stream-ordered against cheating: on a dedicated stream the harness sleeps,
    then (re)writes every `out` (poison) and `inout`/`scratch` (pristine input) tensor, launches, and
    snapshots every tensor argument on that same stream. Work that a candidate hides on a stream of its own
    runs while the checking stream sleeps, so its writes are overwritten and the snapshot shows that
    nothing was computed in stream order (what a caller on the current stream would observe).
    """
    try:
        if device.type == "cuda":
            _ordered_call(launch, args, case, device)
        else:
            launch(to_call_args(args, case.args))
        synchronize(device)
    except Exception as error:  # the kernel's own failure is a result, not a crash of the harness
        ensure_usable(device, error, where)
        return first_line(error)
    return None


@contextmanager
def on_check_stream(args: dict[str, Any], case: Case, device: torch.device) -> Iterator[None]:
    """The body runs on the checking stream behind a delay, after every `out` of `args` was poisoned and every
    `inout`/`scratch` rewritten with its pristine value on that stream; the device is synchronised after."""
    pristine = {a.name: args[a.name].clone() for a in case.tensors() if a.role in ("inout", "scratch")}
    stream = _check_stream(device)
    stream.wait_stream(torch.cuda.current_stream(device))
    with torch.cuda.stream(stream):
        torch.cuda._sleep(_DELAY_CYCLES)
        poison_outputs(args, case.args)
        for name, value in pristine.items():
            args[name].copy_(value)
        yield
    synchronize(device)


def _ordered_call(launch: Launch, args: dict[str, Any], case: Case, device: torch.device) -> None:
    with on_check_stream(args, case, device):
        launch(to_call_args(args, case.args))
        snapshot = clone_inputs({a.name: args[a.name] for a in case.tensors()})
    args.update(snapshot)


def load_reference(path: str) -> Reference:
    """`reference(args, dims)` from a reference.py, imported by path (raises if it does not load)."""
    spec = importlib.util.spec_from_file_location(f"astra_reference_{abs(hash(path))}", path)
    if spec is None or spec.loader is None:
        raise ImportError(f"cannot import {path}")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    if not callable(getattr(module, "reference", None)):
        raise ImportError(f"{path} defines no reference(args, dims)")
    return module.reference


def reference_args(inputs: dict[str, Any]) -> dict[str, Any]:
    """Float64 copies of float tensors (a copy also where the tensor is float64 already: a reference that
    writes an argument must not write the judge's inputs); integer/bool tensors cloned in their dtype (they index)."""
    return {k: (v.to(torch.float64, copy=True) if v.is_floating_point() else v.clone())
            if isinstance(v, torch.Tensor) else v for k, v in inputs.items()}


def run_reference(reference: Reference, case: Case, args: dict[str, Any], where: str) -> dict[str, Any]:
    """The reference's outputs on `args` (float64 copies), an in-place output also under the name of the
    argument that aliases it; raises ReferenceFailed when reference.py raises (fail closed). Its GPU work is
    waited for here, so that a fault of its kernels (a device-side assert) is the reference's, not that of
    whatever runs next."""
    try:
        ref_out = dict(reference(args, dict(case.dims)))
        for device in {v.device for v in ref_out.values() if isinstance(v, torch.Tensor) and v.is_cuda}:
            torch.cuda.synchronize(device)
    except Exception as error:  # fail closed: the spec's reference is broken, not the candidate
        raise ReferenceFailed(f"{case.id}: {where}: reference.py raised {first_line(error)}") from error
    for arg in case.args:
        if arg.role == "alias" and arg.alias and arg.alias not in ref_out and arg.name in ref_out:
            ref_out[arg.alias] = ref_out[arg.name]  # the reference names the in-place output
    return ref_out


def trials_for(case: Case, seeds: list[int], extra: bool = True) -> list[Trial]:
    """The judge's trial list for `case`: every seed, then (`extra`) large, small and extreme where they
    apply. Without `extra`, the seeds alone (`astra bench`: the original against itself)."""
    trials: list[Trial] = [("seed", seed) for seed in seeds]
    if not extra:
        return trials
    top = max(seeds, default=0)
    if has_large_trial(case):
        trials.append(("large", top + LARGE_SEED_OFFSET))
    if has_small_trial(case):
        trials.append(("small", top + SMALL_SEED_OFFSET))
    if has_extreme_trial(case):
        trials.append(("extreme", top + EXTREME_SEED_OFFSET))
    return trials


def describe(trial: Trial) -> str:
    """ "seed 0", "seed 1002 (large)", ...: how reasons name a trial."""
    kind, seed = trial
    return f"seed {seed}" + ("" if kind == "seed" else f" ({kind})")


def trial_inputs(case: Case, trial: Trial, device: torch.device) -> dict[str, Any]:
    """The inputs of one trial; every process that calls this gets the same data."""
    return make_inputs(case, trial[1], device, trial=trial[0])


def run_side(launch: Launch, inputs: dict[str, Any], case: Case, device: torch.device,
             where: str) -> tuple[dict[str, Any], str | None]:
    """One side on one trial: a poisoned clone of `inputs`, one stream-ordered call. Returns the clone
    (every tensor argument after the call) and the launch's error line (None if it did not raise)."""
    args = poison_outputs(clone_inputs(inputs), case.args)
    return args, call(launch, args, case, device, where)


def new_result(case: Case) -> CaseResult:
    """An empty (correct so far) CaseResult for `case`."""
    return CaseResult(id=case.id, band=case.band, label=case.label, dtype=case.dtype, dims=dict(case.dims),
                      timed=case.timed, bytes=case.bytes)


def _merge_check(result: CaseResult, name: str, check: OutputCheck) -> None:
    old = result.checks.get(name)
    merged = check if old is None else OutputCheck(**old).merge(check)
    result.checks[name] = merged.to_dict()


def judge_reference(result: CaseResult, name: str, orig: torch.Tensor, cand: torch.Tensor, ref: torch.Tensor,
                     floor: float, where: str, same_bytes: bool = False) -> None:
    """The reference rule for one output. `same_bytes`: the candidate's output holds the original's bytes (on
    the same device, laid out alike: compare.same_bytes_check), so its error is the original's, computed once;
    else both errors are read with one synchronisation."""
    if same_bytes:
        err_o = err_c = error_vs_reference(orig, ref)
    else:
        err_o, err_c = map(reference_error, torch.stack([reference_stats(orig, ref), reference_stats(cand, ref)]).tolist())
    ok, why = reference_verdict(err_c["rel_l2"], err_o["rel_l2"], floor)
    old = result.reference.get(name, {})
    result.reference[name] = {
        "orig": max(err_o["rel_l2"], old.get("orig", 0.0)), "cand": max(err_c["rel_l2"], old.get("cand", 0.0)),
        "orig_max_abs": max(err_o["max_abs"], old.get("orig_max_abs", 0.0)),
        "cand_max_abs": max(err_c["max_abs"], old.get("cand_max_abs", 0.0)), "floor": floor}
    if not ok:
        result.fail(f"{where}: {name}: {why}")


def _judge_gaps(result: CaseResult, tensors: list, inputs: dict[str, Any], orig: dict[str, Any],
                cand: dict[str, Any], where: str) -> None:
    """A strided view's gaps (storage between its rows: other tensors in the caller) stay untouched."""
    for arg in tensors:
        if arg.row_stride is None or arg.role in ("alias", "scratch"):
            continue
        if not gaps_unchanged(inputs[arg.name], orig[arg.name]):
            note = f"the original writes between the rows of strided {arg.name}; its gaps are not judged"
            if note not in result.notes:
                result.notes.append(note)
        elif not gaps_unchanged(inputs[arg.name], cand[arg.name]):
            result.fail(f"{where}: candidate wrote outside the view of {arg.name} (between its rows of "
                        f"row_stride {arg.row_stride}: memory of other tensors in the caller)")


def judge_trial(result: CaseResult, case: Case, job: Job, trial: Trial, inputs: dict[str, Any],
                orig: dict[str, Any], cand: dict[str, Any] | None, cand_error: str | None,
                reference: Reference | None, ref_out: dict[str, Any] | None = None) -> list[str]:
    """Judge one trial into `result`: `inputs` as generated, `orig`/`cand` every tensor argument after each
    side's call (`cand` None when the candidate raised `cand_error`). The original must not have raised.
    `ref_out`: the reference's outputs on these inputs, when already computed (else computed here). Returns
    the read-only arguments the original wrote on this trial (they are compared as outputs)."""
    where = describe(trial)
    result.trials += 1
    if cand_error is not None or cand is None:
        result.fail(f"{where}: candidate raised {cand_error or 'an error'}")
        return []
    tensors = case.tensors()
    compared = [a for a in tensors if a.role in ("out", "inout")]
    read_only = [a for a in tensors if a.role == "in"]
    flags = unchanged_all([(inputs[a.name], orig[a.name]) for a in read_only]
                          + [(inputs[a.name], cand[a.name]) for a in read_only])  # one synchronisation
    written = []
    for arg, orig_kept, cand_kept in zip(read_only, flags, flags[len(read_only):]):
        if not orig_kept:
            result.notes.append(f"{where}: original writes read-only {arg.name}; compared as an output")
            compared.append(arg)
            written.append(arg.name)
        elif not cand_kept:
            result.fail(f"{where}: candidate wrote read-only argument {arg.name}")
    _judge_gaps(result, tensors, inputs, orig, cand, where)
    sorted_orig = canonical(case, orig)  # unordered outputs: order is not the result
    unordered = {n for n in sorted_orig if sorted_orig[n] is not orig[n]}  # judged against the original only
    orig, cand = sorted_orig, canonical(case, cand)
    if ref_out is None:
        ref_out = run_reference(reference, case, reference_args(inputs), where) if reference is not None else {}
    if result.trials == 1:
        result.notes += [f"reference gives no {arg.name}: compared with the original's tolerances"
                         for arg in compared if ref_out and arg.name not in ref_out]
    judge_outputs(result, case, job, compared, orig, cand, ref_out, unordered, where)
    return written


def judge_outputs(result: CaseResult, case: Case, job: Job, compared: list, orig: dict[str, Any],
                  cand: dict[str, Any], ref_out: dict[str, Any], unordered: set[str], where: str) -> None:
    """Fail `result` for each of the `compared` outputs of `cand` (canonical) that the rules of the module
    docstring refuse: the reference rule for a float output the reference gives (with the NaN/Inf rule),
    else the original's tolerance."""
    tols = [tolerance_for(job.tolerance, arg.dtype, case.dtype) for arg in compared]
    # the check, where the bytes are the same: every output's bitwise comparison read at once
    sames = same_bytes_checks([(orig[arg.name], cand[arg.name], tol) for arg, tol in zip(compared, tols)])
    for arg, tol, same in zip(compared, tols, sames):
        check = same if same is not None else compare_outputs(orig[arg.name], cand[arg.name], tol)
        _merge_check(result, arg.name, check)
        ref = ref_out.get(arg.name)
        if ref is not None and orig[arg.name].is_floating_point() and arg.name not in unordered:
            if check.nonfinite_mismatches:
                result.fail(f"{where}: {arg.name}: {check.reason}")
            judge_reference(result, arg.name, orig[arg.name], cand[arg.name], ref, tol["floor"], where,
                            same_bytes=same is not None)
        elif not check.ok:
            result.fail(f"{where}: {arg.name}: {check.reason}")


def original_outputs(launch: Launch, case: Case, trial: Trial, device: torch.device) -> tuple[dict, dict]:
    """(inputs, the original's post-call tensors) of one trial; raises OriginalFailed if it raised."""
    inputs = trial_inputs(case, trial, device)
    orig, error = run_side(launch, inputs, case, device, f"{case.id}: orig {describe(trial)}")
    if error is not None:
        raise OriginalFailed(f"{case.id}: {describe(trial)}: the original raised {error}")
    return inputs, orig


def judge_determinism(result: CaseResult) -> None:
    """Fail `result` when the candidate is not deterministic where the original is (see the module docstring)."""
    if result.deterministic_orig is not True or result.deterministic_cand is True:
        return
    if result.deterministic_cand is None:
        result.fail("the candidate raised in its determinism runs (two runs on identical inputs)")
    else:
        result.fail("the candidate is not deterministic: two runs on identical inputs gave different outputs, "
                    "where the original's are bit-identical")


def same_outputs(case: Case, a: dict[str, Any], b: dict[str, Any]) -> bool:
    """Whether two calls' outputs (every `out` and `inout`, unordered ones canonical) are bit-identical."""
    a, b = canonical(case, a), canonical(case, b)
    return all(unchanged_all([(a[name], b[name]) for name in output_names(case)]))


def canonical(case: Case, tensors: dict[str, Any]) -> dict[str, Any]:
    """`tensors` with the case's unordered outputs row-sorted together with every output of their shape
    (compare.sort_rows_together); every other entry as it is. What every comparison and digest looks at."""
    outputs = [a for a in case.tensors() if a.role in ("out", "inout") and tensors.get(a.name) is not None]
    marked = {tuple(tensors[a.name].shape) for a in outputs if a.unordered}
    if not marked:
        return tensors
    groups: dict[tuple, list[str]] = {}
    for a in outputs:  # every output of a marked one's shape: pairs are kept whether or not each is marked
        if tuple(tensors[a.name].shape) in marked:
            groups.setdefault(tuple(tensors[a.name].shape), []).append(a.name)
    out = dict(tensors)
    for names in groups.values():
        for name, t in zip(names, sort_rows_together([tensors[n] for n in names])):
            out[name] = t
    return out


def output_digest(case: Case, args: dict[str, Any], key: int = 0, on_host: bool = False) -> str:
    """The keyed digest (harness.judge.digest) of the case's outputs after one call (unordered outputs
    canonical), computed where they are, or with `on_host` on copies in host memory (the same value)."""
    tensors = output_tensors(case, args)
    return digest([t.cpu() for t in tensors] if on_host else tensors, key)


def output_tensors(case: Case, args: dict[str, Any]) -> list[Any]:
    """What `output_digest` hashes: the case's outputs after one call, unordered ones canonical."""
    args = canonical(case, args)
    return [args[name] for name in output_names(case)]


def output_names(case: Case) -> list[str]:
    """The `out` and `inout` tensor arguments (present ones; never `scratch`): what determinism compares."""
    return [a.name for a in case.tensors() if a.role in ("out", "inout")]


def determinism_runs(launch: Launch, case: Case, seed: int, device: torch.device) -> list[dict[str, Any]] | None:
    """Two calls on identical inputs (the seed's), each on a poisoned clone: their arguments after the call,
    or None if a call raised."""
    inputs = make_inputs(case, seed, device)
    runs = []
    for _ in range(2):
        args = poison_outputs(clone_inputs(inputs), case.args)
        if call(launch, args, case, device, f"{case.id}: determinism") is not None:
            return None
        runs.append(args)
    return runs


def determinism_digests(launch: Launch, case: Case, seed: int, device: torch.device,
                        key: int = 0, on_host: bool = False) -> list[str] | None:
    """Keyed digests of the outputs of two runs on identical inputs (None if a run raised): what the candidate
    process reports, the judge being in another process. `on_host`: computed in host memory, so that under
    compute-sanitizer no kernel of the harness's own runs beside the candidate's (racecheck reports torch's
    int64 reduction kernel)."""
    runs = determinism_runs(launch, case, seed, device)
    return None if runs is None else [output_digest(case, args, key, on_host) for args in runs]


def deterministic(launch: Launch, case: Case, seed: int, device: torch.device,
                  first: tuple[dict[str, Any], dict[str, Any]] | None = None) -> bool | None:
    """Two runs on identical inputs give bit-identical outputs (None if a run raised), compared where they
    are (on the GPU: no copy to the host, no hashing). `first`: (the seed's inputs, a checked call's
    arguments after it ran on them), which then is the first run."""
    if first is None:
        runs = determinism_runs(launch, case, seed, device)
    else:
        args = poison_outputs(clone_inputs(first[0]), case.args)
        failed = call(launch, args, case, device, f"{case.id}: determinism") is not None
        runs = None if failed else [first[1], args]
    if runs is None:
        return None
    return same_outputs(case, runs[0], runs[1])
