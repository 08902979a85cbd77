"""Back-to-back launches: two launches on one stream with no synchronisation between them, the second
depending on what the first wrote, each launch's outputs checked. A phase of the checked calls.

Every other checked call is a single launch behind a synchronisation, so a kernel that lets the next launch
start early never shows its race there. A kernel with programmatic dependent launch (PDL) that triggers its
dependents (griddepcontrol.launch_dependents, cudaTriggerProgrammaticLaunchCompletion) and never waits
(griddepcontrol.wait, cudaGridDependencySynchronize) lets the next launch read what it has not written yet
(tests/adversarial: za_pdl_no_wait). In SGLang such launches follow each other all the time, in graphs.

The chain (`chain_plan`): the second launch's inputs are the first launch's outputs where they fit, an `out`
feeding an `in` of the same shape, dtype and layout, floating point only (values, never indices); an
in-place tensor (`inout`, an alias) is chained by being the same buffer for both; `scratch` is shared. The
second launch writes its own `out` tensors, so both launches' outputs are seen. Without a chain the two
launches simply run back to back with the same inputs.

`chained_call` runs it as `harness.check.call` runs one launch: on the checking stream, behind a delay,
outputs poisoned and in-place tensors restored on that stream, then both launches, then a snapshot of both
launches' tensors. `judge_chain` compares each launch's outputs with the original's on the same chain (under
the job's tolerance, NaN positions included) and fails the case naming the launch.
"""

from __future__ import annotations

from typing import Any, Callable, Sequence

import torch

from harness.job import Case, Job
from harness.judge.correctness import (
    canonical,
    ensure_usable,
    first_line,
    judge_outputs,
    on_check_stream,
    reference_args,
    run_reference,
    synchronize,
)
from harness.judge.inputs import clone_inputs, clone_tensor, poison_, poison_outputs, to_call_args
from harness.judge.verdict import CaseResult

Launch = Callable[[Sequence[Any]], Any]
FLOATS = ("float64", "float32", "float16", "bfloat16")


def chain_plan(case: Case) -> dict[str, str]:
    """{input name: output name}: which `in` tensor of the second launch is which `out` tensor of the first."""
    outs = [a for a in case.tensors() if a.role == "out" and a.dtype.removeprefix("torch.") in FLOATS]
    plan: dict[str, str] = {}
    for arg in (a for a in case.tensors() if a.role == "in"):
        for out in outs:
            if out.name not in plan.values() and (out.shape, out.dtype, out.row_stride) == (arg.shape, arg.dtype,
                                                                                           arg.row_stride):
                plan[arg.name] = out.name
                break
    return plan


def describe_plan(case: Case) -> str:
    """How the second launch depends on the first, for reasons."""
    links = [f"reads the first's {out} as {name}" for name, out in chain_plan(case).items()]
    links += [f"updates {a.name} in place after it" for a in case.tensors() if a.role in ("inout", "alias")]
    return "the second " + ("; ".join(links) if links else "uses the same inputs")


def chain_args(case: Case, inputs: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    """Both launches' arguments: the first's a clone of `inputs`; the second's shares the first's in-place and
    scratch tensors, reads its chained inputs from the first's outputs, and has `out` tensors of its own."""
    first = clone_inputs(inputs)
    second = dict(first)
    for arg in case.tensors():
        if arg.role == "out":
            second[arg.name] = clone_tensor(first[arg.name])  # its own buffer, the same layout
    for name, out in chain_plan(case).items():
        second[name] = first[out]
    for arg in case.tensors():
        if arg.role == "alias" and arg.alias:
            second[arg.name] = second[arg.alias]
    return first, second


def chained_call(launch: Launch, inputs: dict[str, Any], case: Case, device: torch.device,
                 where: str) -> tuple[list[dict[str, Any]] | None, str | None]:
    """Two launches back to back on `inputs` (see the module docstring): ([first, second] tensors after both,
    None) or (None, the error line)."""
    first, second = chain_args(case, inputs)
    try:
        if device.type == "cuda":
            with on_check_stream(first, case, device):
                for arg in case.tensors():
                    if arg.role == "out":
                        poison_(second[arg.name])
                launch(to_call_args(first, case.args))
                launch(to_call_args(second, case.args))
                snapshot = [clone_inputs(first), clone_inputs(second)]
        else:
            poison_outputs(first, case.args)
            poison_outputs(second, case.args)
            launch(to_call_args(first, case.args))
            launch(to_call_args(second, case.args))
            snapshot = [first, second]
        synchronize(device)
    except Exception as error:  # the kernel's own failure is a result, not a crash of the harness
        ensure_usable(device, error, where)
        return None, first_line(error)
    return snapshot, None


def reference_chain(reference, case: Case, inputs: dict[str, Any], where: str) -> list[dict[str, Any]]:
    """The reference's outputs of both launches: the first on `inputs`, the second on the chain built from the
    first's reference outputs (float64 throughout)."""
    first = reference_args(inputs)
    ref1 = run_reference(reference, case, first, where)
    second = dict(first)
    for name, out in chain_plan(case).items():
        if out in ref1:
            second[name] = ref1[out]
    for arg in case.tensors():
        if arg.role == "inout" and arg.name in ref1:
            second[arg.name] = ref1[arg.name]
    return [ref1, run_reference(reference, case, second, where)]


def judge_chain(result: CaseResult, case: Case, job: Job, inputs: dict[str, Any], orig: list[dict[str, Any]],
                cand: list[dict[str, Any]] | None, cand_error: str | None, reference=None) -> None:
    """Fail `result` where a launch of the candidate's chain is refused by the rules of the checked calls
    against the original's chain on the same `inputs` (harness.check.judge_outputs: the reference rule where
    the spec has a reference, else the tolerance), or where it raised. The first launch is judged on its `out`
    tensors (its in-place ones hold the second's result), the second on every output."""
    where = f"two launches back to back ({describe_plan(case)})"
    if cand_error is not None or cand is None:
        result.fail(f"{where}: candidate raised {cand_error or 'an error'}")
        return
    refs = reference_chain(reference, case, inputs, where) if reference is not None else [{}, {}]
    outputs = [a for a in case.tensors() if a.role in ("out", "inout")]
    for index, (o, c) in enumerate(zip(orig, cand)):
        sorted_o = canonical(case, o)
        unordered = {n for n in sorted_o if sorted_o[n] is not o[n]}
        compared = [a for a in outputs if index == 1 or a.role == "out"]
        before = len(result.reasons)
        judge_outputs(result, case, job, compared, sorted_o, canonical(case, c), refs[index], unordered,
                      f"{where}: launch {index + 1}")
        if len(result.reasons) > before:
            return
