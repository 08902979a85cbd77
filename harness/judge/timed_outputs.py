"""Timed launches must compute what checked calls compute: the judge's verification of every timed launch.

Correctness is judged in phase `outputs`; times come from the paired timing (harness.paired_timing), where a
kernel could behave differently: count its calls, notice a graph capture, recognise its own results, skip
work once it has been checked (tests/adversarial: u, v, w, x, z). So every timed launch runs on a set drawn
like a checked call's inputs and restored before every sample (harness.timed_sets), and at two points of the
sampling (a round drawn at random, and the last sample) `LaunchCheck.verify` compares, for every set (every
launch of a graph replay, the one launch of a cold sample), the candidate's digests with the original's on
the same inputs:

- read-only inputs: the same bytes as the original's (a timed launch may not write them);
- outputs, bit for bit, where the candidate matched the original bit for bit on every checked trial and
  both are deterministic (`Checked.bitwise`);
- else by value: the candidate writes the set's outputs to its work directory (harness.exchange, validated
  against the case) and they are judged as the checked calls' are (harness.check.judge_outputs: the
  reference rule where the spec has a reference, else the job's tolerance; the NaN/Inf positions too, so
  skipped rows, which keep the poison, fail); a pair of digests already compared by value is not fetched
  again;
- for a deterministic candidate, also: the first set (the case's first checked seed) gives the digest the
  judge computed from the checked call's outputs on the same inputs, and every set gives the same digest at
  both points (so a candidate that is deterministic when checked stays deterministic when timed).

A difference fails the case with a reason that names the view, the launch and the point. Non-determinism
switches no check off: it only moves a comparison from bits to values (and a candidate that is not
deterministic where the original is fails the case already, harness.check.judge_determinism).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

import torch

from harness.candidate.exchange import Malformed
from harness.job import Case, Job
from harness.judge.correctness import (
    Reference,
    canonical,
    judge_outputs,
    new_result,
    output_names,
    reference_args,
    run_reference,
)
from harness.judge.inputs import make_inputs

DUMP_DIR = "timed-outputs"


@dataclass
class Checked:
    """What phase `outputs` established about a case, as the judge computed it from the raw outputs."""

    digest: str | None = None  # the candidate's checked outputs on the case's first seed (check.output_digest)
    bit_exact: bool = False  # the candidate's outputs were the original's, bit for bit, on every trial
    deterministic_orig: bool | None = None
    deterministic_cand: bool | None = None
    orig_writes_inputs: bool = False  # the original wrote a read-only argument (timed sets do not restore those)

    @property
    def reusable_orig_digests(self) -> bool:
        """The original's timed digests may be taken once per view and seed: it is deterministic, and it writes
        nothing that the timed sets leave unrestored between launches."""
        return self.deterministic_orig is True and not self.orig_writes_inputs

    @property
    def bitwise(self) -> bool:
        """Timed outputs must equal the original's bit for bit."""
        return bool(self.bit_exact and self.deterministic_orig and self.deterministic_cand)


def value_difference(case: Case, job: Job, orig: dict[str, Any], cand: dict[str, Any],
                     inputs: dict[str, Any] | None = None, reference: Reference | None = None) -> str | None:
    """Why the outputs of `cand` are refused against `orig` (a set's tensors by name) by the rules of the checked
    calls (harness.check.judge_outputs: the reference rule on `inputs` where a reference is given, else the
    job's tolerance), or None."""
    scratch = new_result(case)
    sorted_orig = canonical(case, orig)
    unordered = {name for name in sorted_orig if sorted_orig[name] is not orig[name]}
    ref_out = {}
    if reference is not None and inputs is not None:
        ref_out = run_reference(reference, case, reference_args(inputs), "timed launch")
    compared = [a for a in case.tensors() if a.name in output_names(case)]
    judge_outputs(scratch, case, job, compared, sorted_orig, canonical(case, cand), ref_out, unordered, "by value")
    return scratch.reasons[0] if scratch.reasons else None


class LaunchCheck:
    """Verification of one view's timed launches of one case (see the module docstring).

    `seeds`: the sets' seeds, in launch order; `orig_set(i)`: the original's set i as its last sample left
    it (tensors by name); `fetch(indices)`: the candidate's outputs of those sets, {index: tensors by name}
    (raises Malformed); `checked`: None when phase `outputs` did not run (the original timed against itself);
    `reference`: the spec's reference, for values (the sets' inputs are drawn again here)."""

    def __init__(self, case: Case, job: Job, view: str, seeds: list[int], checked: Checked | None,
                 orig_set: Callable[[int], dict[str, Any]], fetch: Callable[[list[int]], dict[int, dict[str, Any]]],
                 reference: Reference | None = None):
        self.case, self.job, self.view, self.seeds, self.checked = case, job, view, list(seeds), checked
        self.orig_set, self.fetch, self.reference = orig_set, fetch, reference
        self.by_value: dict[int, tuple[str, str]] = {}
        self.previous: tuple[str, list[dict[str, str]]] | None = None

    def where(self, index: int, point: str) -> str:
        return (f"{self.view} view, timed launch {index + 1} of {len(self.seeds)} (inputs of seed "
                f"{self.seeds[index]}), at {point}")

    def verify(self, point: str, orig: list[dict[str, str]], cand: list[dict[str, str]]) -> list[str]:
        """Failures (one line each) of the sets' digests at `point`, `orig` and `cand` in launch order."""
        checked = self.checked
        deterministic = checked is not None and checked.deterministic_cand is True
        failures: list[str] = []
        by_value: list[int] = []
        for i, (o, c) in enumerate(zip(orig, cand)):
            where = self.where(i, point)
            if c["in"] != o["in"]:
                failures.append(f"{where}: the launch changed a read-only input (the original's leave them as drawn)")
            if i == 0 and deterministic and checked.digest and c["out"] != checked.digest:
                failures.append(f"{where}: outputs differ from the checked call's on the same inputs: the candidate "
                                "behaves differently when timed")
            if deterministic and self.previous is not None and c["out"] != self.previous[1][i]["out"]:
                failures.append(f"{where}: outputs differ from the same launch's at {self.previous[0]} on the same "
                                "inputs, although the candidate is deterministic")
            if c["out"] == o["out"] or self.by_value.get(i) == (o["out"], c["out"]):
                continue
            if checked is not None and checked.bitwise:
                failures.append(f"{where}: outputs differ bit for bit from the original's, which every checked call "
                                "matched bit for bit")
                continue
            by_value.append(i)
        if by_value:
            failures += self._compare_values(point, by_value, orig, cand)
        self.previous = (point, cand)
        return failures

    def _compare_values(self, point: str, indices: list[int], orig: list[dict[str, str]],
                        cand: list[dict[str, str]]) -> list[str]:
        try:
            values = self.fetch(indices)
        except Malformed as error:
            return [f"{self.where(indices[0], point)}: the candidate's outputs could not be read: {error}"]
        failures = []
        for i in indices:
            orig_set = self.orig_set(i)
            inputs = None
            if self.reference is not None:
                device = next(v.device for v in orig_set.values() if isinstance(v, torch.Tensor))
                inputs = make_inputs(self.case, self.seeds[i], device)
            why = value_difference(self.case, self.job, orig_set, values[i], inputs, self.reference)
            if why:
                failures.append(f"{self.where(i, point)}: {why}")
            else:
                self.by_value[i] = (orig[i]["out"], cand[i]["out"])
        return failures


def dump_dir(work: Path) -> Path:
    """Where the candidate process writes the outputs of the sets the judge asks for."""
    return Path(work) / DUMP_DIR
