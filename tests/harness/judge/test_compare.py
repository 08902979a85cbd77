"""harness.judge.compare: tolerances, the NaN/Inf-position rule, bitwise checks, the reference rule."""

from __future__ import annotations

import math

import pytest
import torch

from harness.judge.compare import (
    DEFAULT_TOLERANCE,
    compare_outputs,
    error_vs_reference,
    reference_verdict,
    tolerance_for,
    unchanged,
)

TOL = {"atol": 1e-3, "rtol": 1e-2}
NAN, INF = float("nan"), float("inf")


def test_equal_outputs_pass():
    x = torch.randn(64)
    check = compare_outputs(x, x.clone(), TOL)
    assert check.ok and check.mismatches == 0 and check.max_abs == 0.0 and check.numel == 64


def test_tolerance_atol_plus_rtol_times_orig():
    orig = torch.tensor([1.0, 100.0, 0.0])
    within = orig + torch.tensor([0.0105, 1.0, 0.0009])  # bounds: 0.011, 1.001, 0.001
    assert compare_outputs(orig, within, TOL).ok
    outside = orig + torch.tensor([0.0, 1.01, 0.0])
    check = compare_outputs(orig, outside, TOL)
    assert not check.ok and check.mismatches == 1
    assert check.max_abs == pytest.approx(1.01, rel=1e-5)
    assert check.max_rel == pytest.approx(0.0101, rel=1e-4)
    assert "outside" in check.reason


def test_nan_only_where_the_original_has_it():
    orig = torch.tensor([1.0, NAN, INF, -INF])
    assert compare_outputs(orig, orig.clone(), TOL).ok
    cand_new_nan = torch.tensor([NAN, NAN, INF, -INF])  # NaN where the original is finite
    check = compare_outputs(orig, cand_new_nan, TOL)
    assert not check.ok and check.nonfinite_mismatches == 1
    cand_fixed = torch.tensor([1.0, 2.0, INF, -INF])  # finite where the original has NaN
    assert not compare_outputs(orig, cand_fixed, TOL).ok
    cand_sign = torch.tensor([1.0, NAN, -INF, -INF])  # Inf of the other sign
    assert compare_outputs(orig, cand_sign, TOL).nonfinite_mismatches == 1


def test_unwritten_poisoned_output_fails():
    orig = torch.randn(16)
    cand = orig.clone()
    cand[5:] = NAN
    assert not compare_outputs(orig, cand, TOL).ok


def test_low_precision_compared_in_float64():
    orig = torch.randn(256).to(torch.bfloat16)
    cand = orig.clone()
    assert compare_outputs(orig, cand, DEFAULT_TOLERANCE["bfloat16"]).ok
    f8 = torch.randn(256).to(torch.float8_e4m3fn)
    bumped = (f8.to(torch.float32) * 1.5).to(torch.float8_e4m3fn)
    assert compare_outputs(f8, f8.clone(), DEFAULT_TOLERANCE["float8_e4m3fn"]).ok
    assert not compare_outputs(f8, bumped, DEFAULT_TOLERANCE["float8_e4m3fn"]).ok


def test_integer_outputs_are_exact():
    orig = torch.arange(10, dtype=torch.int32)
    assert compare_outputs(orig, orig.clone(), {"atol": 5, "rtol": 5}).ok
    cand = orig.clone()
    cand[3] = 4
    check = compare_outputs(orig, cand, {"atol": 0, "rtol": 0})
    assert not check.ok and check.mismatches == 1 and check.max_abs == 1.0


def test_shape_or_dtype_mismatch_fails():
    assert not compare_outputs(torch.zeros(3), torch.zeros(4), TOL).ok
    assert not compare_outputs(torch.zeros(3), torch.zeros(3, dtype=torch.float64), TOL).ok


def test_unchanged_is_bitwise_and_nan_safe():
    x = torch.tensor([1.0, NAN, -0.0])
    assert unchanged(x, x.clone())  # NaN == NaN bitwise
    assert not unchanged(torch.tensor([0.0]), torch.tensor([-0.0]))  # equal values, different bits
    payload = torch.tensor([NAN]).view(torch.int32)
    other = payload.clone() + 1  # another NaN payload
    assert torch.isnan(other.view(torch.float32)).all()
    assert not unchanged(payload.view(torch.float32), other.view(torch.float32))
    assert not unchanged(torch.zeros(2), torch.zeros(3))
    assert not unchanged(torch.zeros(2), torch.zeros(2, dtype=torch.float64))
    t = torch.randn(4, 6)[:, ::2]  # non-contiguous
    assert unchanged(t, t.clone())
    assert unchanged(torch.ones(3, dtype=torch.bfloat16), torch.ones(3, dtype=torch.bfloat16))


def test_error_vs_reference_in_float64():
    ref = torch.tensor([3.0, 4.0], dtype=torch.float64)
    out = torch.tensor([3.0, 4.5], dtype=torch.bfloat16)
    err = error_vs_reference(out, ref)
    assert err["max_abs"] == pytest.approx(0.5)
    assert err["rel_l2"] == pytest.approx(0.5 / 5.0)
    assert err["nonfinite"] == 0
    err = error_vs_reference(torch.tensor([3.0, NAN]), ref)
    assert err["nonfinite"] == 1 and err["rel_l2"] == pytest.approx(0.0)
    zero_ref = error_vs_reference(torch.tensor([0.1, 0.0]), torch.zeros(2, dtype=torch.float64))
    assert zero_ref["rel_l2"] == pytest.approx(0.1)
    with pytest.raises(ValueError):
        error_vs_reference(torch.zeros(2), torch.zeros(3, dtype=torch.float64))


def test_reference_rule_two_times_original_or_floor():
    assert reference_verdict(1.9e-3, 1e-3, 1e-4) == (True, "")
    ok, reason = reference_verdict(2.1e-3, 1e-3, 1e-4)
    assert not ok and "2 x original" in reason
    assert reference_verdict(5e-3, 1e-6, 1e-2)[0]  # the floor lets an accurate-enough candidate pass
    assert not reference_verdict(2e-2, 1e-6, 1e-2)[0]
    assert not reference_verdict(math.nan, 1e-3, 1e-2)[0]
    assert reference_verdict(1e-3, math.nan, 1e-2)[0]  # an unusable original error falls back to the floor


def test_tolerance_for_picks_output_dtype_then_looser_of_case_and_default():
    job_tol = {"bfloat16": {"atol": 2e-2, "rtol": 2e-2, "floor": 1e-2}}
    assert tolerance_for(job_tol, "bfloat16", "bfloat16")["atol"] == 2e-2
    fp8 = tolerance_for(job_tol, "float8_e4m3fn", "bfloat16")  # fp8 output of a bf16 case
    assert fp8["rtol"] == DEFAULT_TOLERANCE["float8_e4m3fn"]["rtol"]
    f32 = tolerance_for(job_tol, "float32", "bfloat16")
    assert f32["atol"] == 2e-2
    assert tolerance_for(job_tol, "int32", "bfloat16") == {"atol": 0.0, "rtol": 0.0, "floor": 0.0}


def test_rows_sorted_together_as_tuples():
    from harness.judge.compare import sort_rows_together

    idx = torch.tensor([[3, 1, 2], [0, 0, 5]])
    val = torch.tensor([[0.3, 0.1, 0.2], [0.9, 0.5, 0.7]], dtype=torch.bfloat16)
    s_val, s_idx = sort_rows_together([val, idx])  # integer keys lead whatever the order given
    assert s_idx.tolist() == [[1, 2, 3], [0, 0, 5]]
    expected = torch.tensor([[0.1, 0.2, 0.3], [0.5, 0.9, 0.7]], dtype=torch.bfloat16)  # index ties: by value
    assert torch.equal(s_val, expected)
    fp8 = torch.tensor([[2.0, -1.0, 0.5]]).to(torch.float8_e4m3fn)
    assert sort_rows_together([fp8])[0].float().tolist() == [[-1.0, 0.5, 2.0]]
    flags = torch.tensor([[True, False, True]])
    assert sort_rows_together([flags])[0].tolist() == [[False, True, True]]
    assert sort_rows_together([torch.tensor(3)])[0].item() == 3  # a 0-d tensor has no rows
