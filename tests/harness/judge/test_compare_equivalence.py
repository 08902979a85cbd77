"""harness.judge.compare computes its statistics with one synchronisation, and correctness.judge_outputs skips the
comparison of an output holding the original's bytes: every result is the one the plain implementation gives
(kept below as the oracle), bit for bit, over random outputs of every dtype with NaN, +-Inf and zeros."""

from __future__ import annotations

import math
import random
from types import SimpleNamespace

import pytest
import torch

import harness.judge.correctness as correctness
from harness.judge.compare import (
    DEFAULT_TOLERANCE,
    EXACT,
    OutputCheck,
    compare_outputs,
    error_vs_reference,
    same_bytes_check,
    same_bytes_checks,
    unchanged,
    unchanged_all,
)
from harness.judge.verdict import CaseResult

NAN, INF = float("nan"), float("inf")
FLOATS = [torch.float64, torch.float32, torch.float16, torch.bfloat16] + [
    getattr(torch, name) for name in sorted(dir(torch)) if name.startswith("float8_")
    and isinstance(getattr(torch, name), torch.dtype)]
INTEGERS = [torch.int64, torch.int32, torch.int16, torch.int8, torch.uint8, torch.bool]
SHAPES = [(), (0,), (0, 3), (1,), (7,), (5, 9), (3, 4, 5), (64, 33)]


# The plain implementations (one synchronisation per statistic, boolean-mask indexing): the oracle.
def _classes_oracle(x: torch.Tensor) -> torch.Tensor:
    cls = torch.zeros(x.shape, dtype=torch.int8, device=x.device)
    cls[torch.isnan(x)] = 1
    cls[x == math.inf] = 2
    cls[x == -math.inf] = 3
    return cls


def compare_outputs_oracle(orig: torch.Tensor, cand: torch.Tensor, tol: dict[str, float]) -> OutputCheck:
    if orig.shape != cand.shape or orig.dtype != cand.dtype:
        return OutputCheck(False, reason=f"shape/dtype {tuple(cand.shape)}/{cand.dtype} != "
                                         f"{tuple(orig.shape)}/{orig.dtype}")
    numel = orig.numel()
    if not orig.dtype.is_floating_point:
        diff = orig != cand
        mismatches = int(diff.sum().item())
        max_abs = 0.0
        if mismatches:
            max_abs = float((orig.to(torch.float64) - cand.to(torch.float64)).abs().max().item())
        reason = f"{mismatches} of {numel} integer elements differ" if mismatches else ""
        return OutputCheck(mismatches == 0, max_abs, 0.0, mismatches, 0, numel, reason)
    o, c = orig.to(torch.float64), cand.to(torch.float64)
    nonfinite = int((_classes_oracle(o) != _classes_oracle(c)).sum().item())
    finite = torch.isfinite(o) & torch.isfinite(c)
    diff = torch.where(finite, (o - c).abs(), torch.zeros((), dtype=torch.float64, device=o.device))
    max_abs = float(diff.max().item()) if numel else 0.0
    nonzero = finite & (o != 0)
    max_rel = float((diff[nonzero] / o[nonzero].abs()).max().item()) if bool(nonzero.any()) else 0.0
    bound = float(tol.get("atol", 0.0)) + float(tol.get("rtol", 0.0)) * o.abs()
    mismatches = int((finite & (diff > bound)).sum().item())
    reasons = []
    if nonfinite:
        reasons.append(f"{nonfinite} NaN/Inf positions differ from the original's")
    if mismatches:
        reasons.append(f"{mismatches} of {numel} elements outside atol={tol.get('atol')} rtol={tol.get('rtol')} "
                       f"(max abs {max_abs:.3g}, max rel {max_rel:.3g})")
    if reasons:
        bad = (_classes_oracle(o) != _classes_oracle(c)) | (finite & (diff > bound))
        reasons.append("first at " + ", ".join(str(list(map(int, index))) for index in torch.nonzero(bad)[:3].tolist()))
    return OutputCheck(not reasons, max_abs, max_rel, mismatches, nonfinite, numel, "; ".join(reasons))


def error_vs_reference_oracle(out: torch.Tensor, ref: torch.Tensor) -> dict[str, float]:
    o = out.to(torch.float64)
    r = ref.to(device=o.device, dtype=torch.float64)
    if o.shape != r.shape:
        raise ValueError(f"reference shape {tuple(r.shape)} != output shape {tuple(o.shape)}")
    finite = torch.isfinite(o) & torch.isfinite(r)
    zero = torch.zeros((), dtype=torch.float64, device=o.device)
    diff = torch.where(finite, o - r, zero)
    ref_f = torch.where(finite, r, zero)
    err_norm = float(torch.linalg.vector_norm(diff).item())
    ref_norm = float(torch.linalg.vector_norm(ref_f).item())
    return {
        "max_abs": float(diff.abs().max().item()) if diff.numel() else 0.0,
        "rel_l2": err_norm / ref_norm if ref_norm > 0.0 else err_norm,
        "nonfinite": int((~torch.isfinite(o) & torch.isfinite(r)).sum().item()),
    }


def bits(value):
    """A value as its exact type and bits (floats by float.hex: -0.0, NaN and Inf included), recursively."""
    if isinstance(value, OutputCheck):
        value = value.to_dict()
    if isinstance(value, dict):
        return {key: bits(v) for key, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [bits(v) for v in value]
    if isinstance(value, float):
        return ("float", value.hex())
    return (type(value).__name__, value)


def _inject(values: torch.Tensor, rng: random.Random, count: int) -> torch.Tensor:
    """`values` (float32, flattened) with NaN, +Inf or -Inf at `count` random positions."""
    values = values.clone().reshape(-1)
    for _ in range(min(count, values.numel())):
        values[rng.randrange(values.numel())] = rng.choice([NAN, INF, -INF])
    return values


def _pairs(dtype: torch.dtype, shape: tuple, seed: int):
    """(label, orig, cand) pairs of one dtype and shape: identical, close, a few far, NaN/Inf on either side
    or both, zeros and an all-zero original."""
    rng = random.Random(seed)
    gen = torch.Generator().manual_seed(seed)
    scale = rng.choice([1e-3, 1.0, 30.0])
    base = torch.randn(shape, generator=gen) * scale
    zeros = base.clone().reshape(-1)
    if zeros.numel():
        zeros[torch.randint(0, zeros.numel(), (max(1, zeros.numel() // 4),), generator=gen)] = 0.0
    zeros = zeros.reshape(shape)
    noise = torch.randn(shape, generator=gen) * scale * rng.choice([1e-4, 1e-2, 0.3])
    far = base.clone().reshape(-1)
    for _ in range(min(3, far.numel())):
        far[rng.randrange(far.numel())] += rng.choice([-1, 1]) * scale * 10
    far = far.reshape(shape)
    nonfinite = _inject(base.reshape(-1), rng, 3).reshape(shape)
    both = _inject(zeros.reshape(-1), rng, 4).reshape(shape)
    cases = [
        ("identical", base, base),
        ("close", base, base + noise),
        ("zeros in orig", zeros, zeros + noise),
        ("all-zero orig", torch.zeros(shape), noise),
        ("all-zero both", torch.zeros(shape), torch.zeros(shape)),
        ("a few far", base, far),
        ("NaN/Inf in cand", base, _inject(base.reshape(-1), rng, 3).reshape(shape)),
        ("NaN/Inf in orig", nonfinite, base),
        ("NaN/Inf at the same places", nonfinite, nonfinite + noise),
        ("NaN/Inf on both sides, anywhere", both, _inject((zeros + noise).reshape(-1), rng, 4).reshape(shape)),
        ("NaN/Inf identical", both, both),
    ]
    return [(label, o.to(dtype), c.to(dtype)) for label, o, c in cases]


def _tolerances(dtype: torch.dtype) -> list[dict[str, float]]:
    name = str(dtype).removeprefix("torch.")
    return [DEFAULT_TOLERANCE.get(name, DEFAULT_TOLERANCE["float32"]), dict(EXACT), {"atol": 0.5, "rtol": 0.0}]


@pytest.mark.parametrize("dtype", FLOATS, ids=str)
def test_float_comparisons_are_the_oracles_bit_for_bit(dtype):
    compared = 0
    for shape_index, shape in enumerate(SHAPES):
        for label, orig, cand in _pairs(dtype, shape, seed=shape_index * 131 + FLOATS.index(dtype)):
            for tol in _tolerances(dtype):
                assert bits(compare_outputs(orig, cand, tol)) == bits(compare_outputs_oracle(orig, cand, tol)), \
                    (label, shape, tol)
                compared += 1
            ref = orig.to(torch.float64) + torch.randn(shape, dtype=torch.float64) * 1e-3
            for r in (ref, torch.zeros(shape, dtype=torch.float64), _inject(ref.reshape(-1), random.Random(7), 2)
                      .reshape(shape)):
                for out in (orig, cand):
                    assert bits(error_vs_reference(out, r)) == bits(error_vs_reference_oracle(out, r)), (label, shape)
    assert compared == len(SHAPES) * 11 * 3


def test_random_float_outputs_match_the_oracle():
    rng = random.Random(1234)
    for trial in range(300):
        dtype = rng.choice(FLOATS)
        shape = tuple(rng.randint(0, 9) for _ in range(rng.randint(0, 3)))
        label, orig, cand = rng.choice(_pairs(dtype, shape, seed=trial))
        tol = {"atol": rng.choice([0.0, 1e-3, 0.1]), "rtol": rng.choice([0.0, 1e-2, 0.5])}
        assert bits(compare_outputs(orig, cand, tol)) == bits(compare_outputs_oracle(orig, cand, tol)), (label, trial)
        ref = torch.randn(shape, dtype=torch.float64) if rng.random() < 0.8 else torch.zeros(shape, dtype=torch.float64)
        assert bits(error_vs_reference(cand, ref)) == bits(error_vs_reference_oracle(cand, ref)), (label, trial)


def test_extremes_of_float64_match_the_oracle():
    big = torch.tensor([1e308, -1e308, 5e-324, -0.0, 0.0, 1.0], dtype=torch.float64)
    cand = torch.tensor([-1e308, 1e308, -5e-324, 0.0, -0.0, 1.0 + 2**-52], dtype=torch.float64)  # overflowing diffs
    for tol in ({"atol": 0.0, "rtol": 0.0}, DEFAULT_TOLERANCE["float64"]):
        assert bits(compare_outputs(big, cand, tol)) == bits(compare_outputs_oracle(big, cand, tol))
        assert bits(compare_outputs(cand, big, tol)) == bits(compare_outputs_oracle(cand, big, tol))
    assert bits(error_vs_reference(cand, big)) == bits(error_vs_reference_oracle(cand, big))
    assert compare_outputs(big, cand, {"atol": 0.0, "rtol": 0.0}).max_abs == INF


@pytest.mark.parametrize("dtype", INTEGERS, ids=str)
def test_integer_and_bool_outputs_match_the_oracle(dtype):
    gen = torch.Generator().manual_seed(5)
    for shape in SHAPES:
        high = 2 if dtype == torch.bool else 100
        orig = torch.randint(0, high, shape, generator=gen).to(dtype)
        changed = orig.clone().reshape(-1)
        if changed.numel():
            changed[0] = (changed[0].to(torch.int64) + 1) % high
        for cand in (orig.clone(), changed.reshape(shape), torch.randint(0, high, shape, generator=gen).to(dtype)):
            assert bits(compare_outputs(orig, cand, EXACT)) == bits(compare_outputs_oracle(orig, cand, EXACT))
    assert bits(compare_outputs(torch.zeros(3, dtype=dtype), torch.zeros(4, dtype=dtype), EXACT)) == bits(
        compare_outputs_oracle(torch.zeros(3, dtype=dtype), torch.zeros(4, dtype=dtype), EXACT))


def test_strided_outputs_match_the_oracle():
    orig = torch.randn(8, 12, dtype=torch.bfloat16)[:, ::3]
    cand = (torch.randn(8, 12) * 0.01).to(torch.bfloat16)[:, ::3] + orig
    cand[0, 0] = NAN
    tol = DEFAULT_TOLERANCE["bfloat16"]
    assert bits(compare_outputs(orig, cand, tol)) == bits(compare_outputs_oracle(orig, cand, tol))
    ref = orig.to(torch.float64).t()
    assert bits(error_vs_reference(cand.t(), ref)) == bits(error_vs_reference_oracle(cand.t(), ref))


@pytest.mark.parametrize("dtype", FLOATS + INTEGERS, ids=str)
def test_same_bytes_check_is_what_the_comparison_gives(dtype):
    for shape_index, shape in enumerate(SHAPES):
        for label, orig, _ in _pairs(dtype, shape, seed=shape_index):
            cand = orig.clone()
            for tol in _tolerances(dtype) if dtype.is_floating_point else [EXACT]:
                check = same_bytes_check(orig, cand, tol)
                assert check is not None, (label, shape)
                assert bits(check) == bits(compare_outputs_oracle(orig, cand, tol)), (label, shape, tol)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16, torch.float64])
def test_other_nan_payloads_or_signed_zeros_are_compared(dtype):
    width = {8: torch.int64, 4: torch.int32, 2: torch.int16}[torch.empty((), dtype=dtype).element_size()]
    orig = torch.tensor([1.0, NAN, -0.0, 2.0], dtype=dtype)
    cand = orig.clone()
    cand.view(width)[1] += 1  # another NaN payload: equal as values, not as bytes
    assert torch.isnan(cand[1])
    tol = DEFAULT_TOLERANCE[str(dtype).removeprefix("torch.")]
    assert same_bytes_check(orig, cand, tol) is None
    assert bits(compare_outputs(orig, cand, tol)) == bits(compare_outputs_oracle(orig, cand, tol))
    assert compare_outputs(orig, cand, tol).ok
    zeros = torch.tensor([0.0, 1.0], dtype=dtype), torch.tensor([-0.0, 1.0], dtype=dtype)
    assert same_bytes_check(*zeros, tol) is None
    assert bits(compare_outputs(*zeros, tol)) == bits(compare_outputs_oracle(*zeros, tol))


def test_same_bytes_check_refuses_what_it_cannot_vouch_for():
    x = torch.randn(6, 4)
    assert same_bytes_check(x, x.clone(), {"atol": -1.0, "rtol": 0.0}) is None  # identical outputs fail there
    assert not compare_outputs(x, x.clone(), {"atol": -1.0, "rtol": 0.0}).ok
    assert same_bytes_check(x, x.clone(), {"atol": 0.0, "rtol": NAN}) is None
    assert same_bytes_check(x, x.t().contiguous().t(), EXACT) is None  # laid out otherwise
    assert same_bytes_check(x, x.to(torch.float64), EXACT) is None
    assert same_bytes_check(x, x[:5], EXACT) is None
    assert same_bytes_check(x, x.clone(), EXACT) == OutputCheck(True, 0.0, 0.0, 0, 0, 24, "")


def _unchanged_oracle(before: torch.Tensor, after: torch.Tensor) -> bool:
    """One torch.equal of the bytes per pair (one synchronisation each)."""
    if before.shape != after.shape or before.dtype != after.dtype:
        return False
    return bool(torch.equal(before.contiguous().reshape(-1).view(torch.uint8),
                            after.to(before.device).contiguous().reshape(-1).view(torch.uint8)))


def test_every_pairs_bytes_read_at_once_are_what_one_comparison_each_gives():
    pairs, outputs = [], []
    for dtype in FLOATS + INTEGERS:
        for shape_index, shape in enumerate(SHAPES):
            for _, orig, cand in _pairs(dtype, shape, seed=shape_index):
                pairs += [(orig, cand), (orig, orig.clone())]
                outputs += [(orig, cand, EXACT), (orig, orig.clone(), EXACT)]
    x = torch.randn(6, 4)
    nan_payload = torch.tensor([1.0, NAN])
    other_payload = nan_payload.clone()
    other_payload.view(torch.int32)[1] += 1
    pairs += [(x, x.t().contiguous().t()), (x, x.to(torch.float64)), (x, x[:5]), (x, x.clone().t()),
              (torch.tensor([0.0]), torch.tensor([-0.0])), (nan_payload, other_payload), (nan_payload, nan_payload.clone())]
    outputs += [(x, x.clone(), {"atol": -1.0, "rtol": 0.0}), (x, x.clone(), {"atol": 0.0, "rtol": NAN}),
                (x, x.t().contiguous().t(), EXACT), (x, x.to(torch.float64), EXACT), (x, x[:5], EXACT)]
    expected = [_unchanged_oracle(a, b) for a, b in pairs]
    assert unchanged_all(pairs) == expected and True in expected and False in expected
    assert [unchanged(a, b) for a, b in pairs] == expected
    assert unchanged_all([]) == []
    together = same_bytes_checks(outputs)
    assert together == [same_bytes_check(*output) for output in outputs]
    assert any(check is None for check in together) and any(check is not None for check in together)


def _judged(monkeypatch, shortcut: bool, orig: dict, cand: dict, refs: dict, tolerance: dict) -> CaseResult:
    if not shortcut:
        monkeypatch.setattr(correctness, "same_bytes_checks", lambda outputs: [None] * len(outputs))
    args = [SimpleNamespace(name=name, dtype=str(t.dtype).removeprefix("torch.")) for name, t in orig.items()]
    case = SimpleNamespace(dtype="bfloat16")
    result = CaseResult(id="c", band="b", label="l", dtype="bfloat16", dims={}, timed=True, bytes=0)
    correctness.judge_outputs(result, case, SimpleNamespace(tolerance=tolerance), args, orig, cand, refs, set(),
                              "seed 0")
    monkeypatch.undo()
    return result


def test_judge_outputs_gives_the_same_verdict_with_and_without_the_shortcut(monkeypatch):
    gen = torch.Generator().manual_seed(3)
    out = torch.randn(32, 16, generator=gen, dtype=torch.float64).to(torch.bfloat16)
    out[0, :3] = torch.tensor([NAN, INF, -INF])
    res = torch.randn(32, 16, generator=gen).to(torch.float16)
    idx = torch.randint(0, 9, (32,), generator=gen)
    orig = {"out": out, "residual": res, "idx": idx}
    refs = {"out": out.to(torch.float64) + 1e-3, "residual": torch.zeros(32, 16, dtype=torch.float64)}
    worse = out.clone()
    worse[5, 5] += 1.0
    nan_payload = res.clone()
    nan_payload.view(torch.int16)[0, 0] = 0x7E01
    orig["residual"][0, 0] = NAN
    for cand in ({k: v.clone() for k, v in orig.items()},
                 {"out": worse, "residual": res.clone(), "idx": idx.clone()},
                 {"out": out.clone(), "residual": nan_payload, "idx": idx + 1}):
        for tolerance in ({}, {"bfloat16": {"atol": 0.0, "rtol": 0.0, "floor": 0.0}}):
            fast = _judged(monkeypatch, True, orig, cand, refs, tolerance)
            full = _judged(monkeypatch, False, orig, cand, refs, tolerance)
            assert bits(fast.checks) == bits(full.checks)
            assert bits(fast.reference) == bits(full.reference)
            assert (fast.correct, fast.reasons) == (full.correct, full.reasons)
            assert set(fast.checks) == {"out", "residual", "idx"}


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32, torch.float8_e4m3fn, torch.int32], ids=str)
def test_an_output_compared_in_pieces_gives_the_oracles_check(monkeypatch, dtype):
    """A large output is compared CHUNK elements at a time (the judge's memory stays bounded): the check is the
    oracle's (maxima and counts exact, the first differing positions the same), strided views included."""
    import harness.judge.compare as compare

    monkeypatch.setattr(compare, "CHUNK", 7)
    compared = 0
    for shape_index, shape in enumerate([(5, 9), (3, 4, 6), (64,)]):
        if dtype.is_floating_point:
            pairs = _pairs(dtype, shape, seed=900 + shape_index)
        else:
            orig = torch.randint(0, 50, shape, generator=torch.Generator().manual_seed(shape_index)).to(dtype)
            changed = orig.clone().reshape(-1)
            changed[[3, 20, 40 % changed.numel()]] += 1
            pairs = [("same", orig, orig.clone()), ("changed", orig, changed.reshape(shape))]
        for label, orig, cand in pairs:
            tols = _tolerances(dtype) if dtype.is_floating_point else [EXACT]
            for tol in tols:
                assert bits(compare_outputs(orig, cand, tol)) == bits(compare_outputs_oracle(orig, cand, tol)), \
                    (label, shape, tol)
                compared += 1
    assert compared >= 6
    orig = torch.randn(8, 12, dtype=torch.float32)[:, ::3]
    cand = orig + 1e-3
    cand[5, 2] = NAN
    assert bits(compare_outputs(orig, cand, DEFAULT_TOLERANCE["float32"])) == bits(
        compare_outputs_oracle(orig, cand, DEFAULT_TOLERANCE["float32"]))


def test_an_error_against_the_reference_in_pieces_is_the_whole_ones(monkeypatch):
    import harness.judge.compare as compare

    gen = torch.Generator().manual_seed(3)
    ref = torch.randn(11, 13, dtype=torch.float64, generator=gen)
    out = (ref + torch.randn(11, 13, dtype=torch.float64, generator=gen) * 1e-2).to(torch.bfloat16)
    out[4, 4] = INF
    whole = error_vs_reference(out, ref)
    monkeypatch.setattr(compare, "CHUNK", 10)
    pieces = error_vs_reference(out, ref)
    assert pieces["max_abs"] == whole["max_abs"] and pieces["nonfinite"] == whole["nonfinite"] == 1
    assert pieces["rel_l2"] == pytest.approx(whole["rel_l2"], rel=1e-12)
    with pytest.raises(ValueError, match="reference shape"):
        error_vs_reference(out, ref[:, :5])
