"""harness.timing.timing_side on a GPU: a cold side restores and flushes through one CUDA graph per set, and
what it leaves is what the eager restore and flush leave."""

from __future__ import annotations

import pytest
import torch

from harness.timing.timing_side import TimingSide
from tests.harness.judge.test_paired_timing_cpu import _case, half_after, rowscale

pytestmark = pytest.mark.gpu


@pytest.fixture(autouse=True)
def _needs_cuda():
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU")


def _cold(launch, befores: bool):
    side = TimingSide("orig", launch, _case(), "cuda", key=5)
    info = side.prepare("cold", [0, 10001, 10002], 0)
    if not befores:
        side._befores, side.restore_mode = [], "eager"
    times = side.sample(7)
    return side, info, times


def test_cold_sets_restore_through_graphs_as_eagerly():
    graphed, info, times = _cold(rowscale, befores=True)
    eager, _, _ = _cold(rowscale, befores=False)
    assert info["restore"] == "graph" and len(graphed._befores) == 3
    assert len(times) == 7 and all(t > 0 for t in times)
    assert graphed.digests() == eager.digests()


def test_a_launch_that_skips_work_still_finds_the_poison():
    """The graphed restore poisons the outputs again before every sample: a launch that writes half its rows
    from the fifth call on leaves poison in the sets it launched, as with the eager restore."""
    honest, _, _ = _cold(rowscale, befores=True)
    skipping, _, _ = _cold(half_after(4), befores=True)
    assert skipping.digests() != honest.digests()
    assert not torch.equal(skipping.set_args(0)["out"], honest.set_args(0)["out"])
