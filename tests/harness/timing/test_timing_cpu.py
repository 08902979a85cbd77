"""Pure parts of harness.timing.modes (the GPU parts run in test_evaluate_gpu.py)."""

from harness.timing.modes import batch_position_medians, sets_needed


def test_batch_position_medians_separates_first_samples():
    samples = {"orig": [9.0, 1.0, 1.1, 8.0, 1.2, 0.9], "cand": [1.0, 1.0]}
    flags = {"orig": [True, False, False, True, False, False], "cand": [True, True]}
    out = batch_position_medians(samples, flags)
    assert out == {"orig": {"first_after_sync_us": 8.5, "others_us": 1.05, "slow_samples": 2, "slow_first": 2}}


def test_keep_busy_does_nothing_when_off(monkeypatch):
    import torch

    from harness.timing import modes as timing

    calls = []
    monkeypatch.setattr(torch.cuda, "_sleep", calls.append, raising=False)
    timing.keep_busy(0)
    timing.keep_busy(200.0)
    assert calls == [200 * timing._SPIN_CYCLES_PER_US]


def test_sets_needed_reaches_three_l2():
    assert sets_needed(10 * 2**20, 50 * 2**20) == 15
    assert sets_needed(10**12, 50 * 2**20) == 1
    assert sets_needed(1, 50 * 2**20, cap=16384) == 16384
