"""Correctness of one case with both sides in one process: for trusted code only (the CPU tests drive the
checks this way). The judge never runs a candidate itself: it compares the original, run here, with the raw
outputs of the candidate process (harness.judge.evaluate)."""

from __future__ import annotations

import torch

from harness.job import Case, Job
from harness.judge.back_to_back import chained_call, judge_chain
from harness.judge.correctness import (
    Launch,
    Reference,
    describe,
    deterministic,
    judge_determinism,
    judge_trial,
    new_result,
    original_outputs,
    run_side,
    trials_for,
)
from harness.judge.inputs import make_inputs
from harness.judge.verdict import CaseResult


def check_case(case: Case, launches: dict[str, Launch], job: Job, device: torch.device | str,
               reference: Reference | None = None) -> CaseResult:
    """Correctness of `case` with both sides in this process (see the module docstring); `launches` has
    "orig" and "cand". Only for trusted code (CPU tests): the judge never runs a candidate itself."""
    device = torch.device(device)
    result = new_result(case)
    for trial in trials_for(case, job.options.seeds, job.options.extra_trials):
        inputs, orig = original_outputs(launches["orig"], case, trial, device)
        cand, error = run_side(launches["cand"], inputs, case, device, f"{case.id}: cand {describe(trial)}")
        judge_trial(result, case, job, trial, inputs, orig, None if error else cand, error, reference)
    seed = job.options.seeds[0] if job.options.seeds else 0
    inputs = make_inputs(case, seed, device)
    orig_chain, orig_error = chained_call(launches["orig"], inputs, case, device, f"{case.id}: orig back to back")
    if orig_chain is not None:
        cand_chain, cand_error = chained_call(launches["cand"], inputs, case, device, f"{case.id}: cand back to back")
        judge_chain(result, case, job, inputs, orig_chain, cand_chain, cand_error, reference)
    else:
        result.notes.append(f"two launches back to back not checked: the original raised {orig_error}")
    result.deterministic_orig = deterministic(launches["orig"], case, seed, device)
    result.deterministic_cand = deterministic(launches["cand"], case, seed, device)
    judge_determinism(result)
    return result
