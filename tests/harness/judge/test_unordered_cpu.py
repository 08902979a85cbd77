"""Unordered outputs (a top-k's indices and values) judged on the CPU: rows compared as sets of tuples,
pairs kept, the original (not a reference) as the judge."""

from __future__ import annotations

import torch

from harness.job import ArgSpec, Case
from harness.judge.both_sides import check_case
from tests.harness.judge.test_evaluate_cpu import _job


def _topk_case(unordered: bool) -> Case:
    return Case(id="topk/float32/tokens=6", band="decode", label="toy", dtype="float32", dims={"tokens": 6},
                variant="v", bytes=6 * 32 * 4, timed=False,
                args=[ArgSpec("values", "tensor", "out", [6, 4], "float32", unordered=unordered),
                      ArgSpec("indices", "tensor", "out", [6, 4], "int64", unordered=unordered),
                      ArgSpec("x", "tensor", "in", [6, 32], "float32")])


def _topk(order: str):
    def launch(args):
        values, indices, x = args
        top = torch.topk(x, 4, dim=-1)
        perm = {"sorted": torch.arange(4).expand(6, 4), "reversed": torch.arange(3, -1, -1).expand(6, 4),
                "shuffled": torch.argsort(torch.rand(6, 4), dim=-1)}[order]
        indices.copy_(torch.gather(top.indices, -1, perm))
        values.copy_(torch.gather(top.values, -1, torch.roll(perm, 1, -1) if order == "reversed" else perm))
    return launch


def test_unordered_outputs_compare_as_sets_of_pairs():
    """The same top-k in another order passes where the spec says the order is not the result, and only
    there; a candidate that keeps each set but pairs an index with another index's value fails."""
    in_order = check_case(_topk_case(True), {"orig": _topk("sorted"), "cand": _topk("shuffled")}, _job(), "cpu")
    assert in_order.correct, in_order.reasons
    assert in_order.deterministic_cand is True  # two shuffled runs digest alike once sorted
    strict = check_case(_topk_case(False), {"orig": _topk("sorted"), "cand": _topk("shuffled")}, _job(), "cpu")
    assert not strict.correct
    unpaired = check_case(_topk_case(True), {"orig": _topk("sorted"), "cand": _topk("reversed")}, _job(), "cpu")
    assert not unpaired.correct and any("values" in r for r in unpaired.reasons)


def test_pairs_hold_when_only_one_output_is_marked_unordered():
    case = _topk_case(False)
    case.args[1].unordered = True  # indices marked, values not: values still travel with their indices
    fine = check_case(case, {"orig": _topk("sorted"), "cand": _topk("shuffled")}, _job(), "cpu")
    assert fine.correct, fine.reasons
    unpaired = check_case(case, {"orig": _topk("sorted"), "cand": _topk("reversed")}, _job(), "cpu")
    assert not unpaired.correct


def test_an_unordered_output_is_judged_against_the_original_not_the_reference():
    """A reference gives rows in its own order: the reference rule (error vs reference) would compare sorted
    rows with unsorted ones and let a wrong candidate through; unordered outputs use the original."""
    def reference(args, dims):
        top = torch.topk(args["x"].double(), 4, dim=-1)
        return {"values": top.values.flip(-1), "indices": top.indices.flip(-1)}

    def wrong_values(args):
        _topk("shuffled")(args)
        args[0].mul_(1.3)

    result = check_case(_topk_case(True), {"orig": _topk("sorted"), "cand": wrong_values}, _job(), "cpu",
                        reference=reference)
    assert not result.correct and any("values" in r for r in result.reasons)
