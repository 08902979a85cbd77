"""harness.back_to_back on the CPU: the chain a case allows, two launches run back to back, and a candidate
whose second launch does not see what the first wrote (the effect of a PDL trigger without a wait) fails."""

from __future__ import annotations

import torch

from harness.candidate.exchange import CaseWriter, read_manifest, read_trial
from harness.job import ArgSpec, Case
from harness.judge.back_to_back import chain_args, chain_plan, chained_call, describe_plan, judge_chain
from harness.judge.both_sides import check_case
from harness.judge.correctness import new_result
from harness.judge.inputs import make_inputs
from tests.harness.judge.test_paired_timing_cpu import _case, _job, rowscale

CPU = torch.device("cpu")


class ReadsStaleInput:
    """out = x * w, but a launch that follows another without a synchronisation reads the x the earlier
    launch saw: what a kernel that triggers its dependents and never waits can read on a GPU."""

    def __init__(self) -> None:
        self.previous_x: torch.Tensor | None = None

    def __call__(self, args) -> None:
        x, w, out = args
        source = self.previous_x if self.previous_x is not None else x
        out.copy_(source * w)
        self.previous_x = x.clone()


def test_the_second_launch_reads_the_first_ones_output():
    case = _case()
    assert chain_plan(case) == {"x": "out"}
    first, second = chain_args(case, make_inputs(case, 0, CPU))
    assert second["x"] is first["out"] and second["w"] is first["w"] and second["out"] is not first["out"]
    assert "reads the first's out as x" in describe_plan(case)
    in_place = _case(in_place=True)
    assert chain_plan(in_place) == {} and "updates x in place" in describe_plan(in_place)
    first, second = chain_args(in_place, make_inputs(in_place, 0, CPU))
    assert second["x"] is first["x"]


def test_no_chain_across_dtypes_or_into_integers():
    case = Case(id="q", band="decode", label="t", dtype="float32", dims={}, variant="v", bytes=1,
                args=[ArgSpec("x", "tensor", "in", [4, 8], "float32"), ArgSpec("i", "tensor", "in", [4, 8], "int32",
                                                                                 {"dist": "randint", "high": 4}),
                      ArgSpec("q", "tensor", "out", [4, 8], "float16"), ArgSpec("j", "tensor", "out", [4, 8], "int32")])
    assert chain_plan(case) == {}


def test_both_launches_are_checked():
    case = _case()
    inputs = make_inputs(case, 0, CPU)
    launches, error = chained_call(rowscale, inputs, case, CPU, "orig")
    assert error is None
    first, second = launches
    assert torch.allclose(second["out"], inputs["x"] * inputs["w"] * inputs["w"])
    result = new_result(case)
    judge_chain(result, case, _job(case), inputs, launches, chained_call(rowscale, inputs, case, CPU, "cand")[0], None)
    assert result.correct
    stale = chained_call(ReadsStaleInput(), inputs, case, CPU, "cand")[0]
    judge_chain(result, case, _job(case), inputs, launches, stale, None)
    assert not result.correct and result.reasons[0].startswith("two launches back to back (the second reads the ")
    assert "launch 2: out" in result.reasons[0]


def test_check_case_runs_the_chain_and_the_exchange_carries_it(tmp_path):
    case = _case()
    result = check_case(case, {"orig": rowscale, "cand": ReadsStaleInput()}, _job(case), CPU)
    assert not result.correct and any("two launches back to back" in r for r in result.reasons)
    launches, _ = chained_call(rowscale, make_inputs(case, 0, CPU), case, CPU, "cand")
    writer = CaseWriter(tmp_path, 0, case)
    writer.add_trial("seed", 0, None, launches[0])
    writer.add_chain(None, launches)
    writer.finish(None)
    manifest = read_manifest(tmp_path / "case-00000", case, [("seed", 0)])
    back = [read_trial(tmp_path / "case-00000", i, e, case, CPU, prefix="c")
            for i, e in enumerate(manifest["chain"]["launches"])]
    assert torch.equal(back[1]["out"], launches[1]["out"]) and torch.equal(back[1]["x"], launches[0]["out"])
