"""The probe on outputs whose order is not the result: rows that differ only in order are `unordered`,
a broken pairing or a 1-D list stays nondeterministic."""

from __future__ import annotations

import torch

from harness.job import ArgSpec, Case
from harness.probe.observation import decide, probe_case
from tests.harness.probe.test_probe import make_case, tensor


def _topk_in_any_order(args):
    """A top-k whose threads finish in any order: the same (index, value) pairs per row, shuffled together."""
    values, indices, x = args
    top = torch.topk(x, values.shape[-1], dim=-1)
    shuffle = torch.argsort(torch.rand(top.indices.shape), dim=-1)
    indices.copy_(torch.gather(top.indices, -1, shuffle))
    values.copy_(torch.gather(top.values, -1, shuffle))


def topk_case(**flags) -> Case:
    return make_case(args=[ArgSpec("values", "tensor", "out", [4, 3], "float32", **flags),
                           ArgSpec("indices", "tensor", "out", [4, 3], "int64", **flags), tensor("x")])


def test_outputs_that_differ_only_in_order_are_unordered_not_nondeterministic():
    result = probe_case(_topk_in_any_order, topk_case(), "cpu")
    assert result["deterministic"] is True and result["status"] == "kept"
    assert sorted(result["unordered"]) == ["indices", "values"]
    assert result["roles"] == {"values": "out", "indices": "out", "x": "in"}  # poisoning compared as sets too
    assert decide([result], None)[0] == "probed"
    again = probe_case(_topk_in_any_order, topk_case(unordered=True), "cpu")  # the rewritten draft says so
    assert again["deterministic"] is True and "unordered" not in again


def test_a_one_dimensional_output_is_never_taken_as_unordered():
    """A 1-D output's "row" is all of it: a list grouped by expert, shuffled inside its groups, would pass
    as a bare multiset whatever the grouping. Such a case stays nondeterministic."""
    def shuffled_list(args):
        y, x = args
        y.copy_(x[torch.randperm(x.shape[0])])

    case = make_case(args=[tensor("y", "out", (16,)), tensor("x", "in", (16,))])
    result = probe_case(shuffled_list, case, "cpu")
    assert result["deterministic"] is False and "unordered" not in result


def test_a_broken_pairing_is_still_nondeterministic():
    def unpaired(args):  # indices and values shuffled independently: the pairs change between runs
        values, indices, x = args
        top = torch.topk(x, values.shape[-1], dim=-1)
        indices.copy_(torch.gather(top.indices, -1, torch.argsort(torch.rand(top.indices.shape), dim=-1)))
        values.copy_(torch.gather(top.values, -1, torch.argsort(torch.rand(top.values.shape), dim=-1)))

    torch.manual_seed(3)
    results = [probe_case(unpaired, topk_case(), "cpu") for _ in range(3)]
    assert any(r["deterministic"] is False for r in results) and not any(r.get("unordered") for r in results)
