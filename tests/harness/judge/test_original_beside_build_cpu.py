"""What a trial computed beside the build keeps stays within `trial_bytes`, the bound the budget is checked with
(harness.judge.original_beside_build): the drawn inputs, the original's clone after its call, and the float64
outputs of a reference, here on the CPU with the judge's own pieces."""

from __future__ import annotations

import pytest
import torch

from harness.job import ArgSpec, Case
from harness.judge.correctness import reference_args, run_side, trial_inputs
from harness.judge.original_beside_build import _nbytes, trial_bytes


def _case(dtype: str, tokens: int = 64, hidden: int = 256) -> Case:
    return Case(id=f"t/{dtype}", band="decode", label="t", dtype=dtype, dims={"tokens": tokens, "hidden": hidden},
                variant=dtype, bytes=0,
                args=[ArgSpec("y", "tensor", "out", [tokens, hidden], dtype),
                      ArgSpec("acc", "tensor", "inout", [tokens, hidden], dtype),
                      ArgSpec("x", "tensor", "in", [tokens, hidden], dtype),
                      ArgSpec("b", "tensor", "in", [hidden], dtype)])


def _reference(args, dims):  # every output in float64, as a spec's reference.py returns them
    y = args["x"] * 0.75 + args["b"]
    return {"y": y, "acc": args["acc"] + y}


@pytest.mark.parametrize("dtype", ["bfloat16", "float16", "float32"])
def test_a_kept_trial_fits_the_bound_it_is_budgeted_with(dtype):
    case = _case(dtype)
    device = torch.device("cpu")
    inputs = trial_inputs(case, ("seed", 0), device)

    def launch(args):  # stands in for the original: writes both outputs
        args[0].copy_(args[2] * 0.75 + args[3])
        args[1].add_(args[0])

    orig, error = run_side(launch, inputs, case, device, "t")
    assert error is None
    ref_out = _reference(reference_args(inputs), case.dims)
    kept = _nbytes(inputs, orig, ref_out)
    drawn = sum(t.numel() * t.element_size() for t in inputs.values() if isinstance(t, torch.Tensor))
    if dtype != "float32":  # a 2-byte output's float64 reference is 4 x its size: more than 4 x the storages
        assert kept > 4 * drawn
    assert kept <= trial_bytes(case)

