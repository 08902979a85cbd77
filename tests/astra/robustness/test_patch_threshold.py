"""`astra patch --threshold` is the slowdown a shape may have before the patch is refused: a finite number
from 0 to 0.1 (patches.emit.MAX_SLOWDOWN_THRESHOLD). NaN compared false and let a candidate 20% slower on a
shape through; a negative or large value gutted the rule. Refused before any file is read (exit 12)."""

import pytest

from astra.errors import BadInput
from astra.patches import emit
from tests.astra.robustness.run_astra import astra, refused


@pytest.mark.parametrize("value", ["nan", "-5", "5", "inf", "0.5", "-0.01"])
def test_a_threshold_out_of_range_is_refused_at_once(tmp_path, value):
    answer = astra("patch", "rmsnorm", "--candidate", "/nonexistent.cuh", "--verdict", "/nonexistent.json",
                   "--out", str(tmp_path / "p"), "--threshold", value)
    refused(answer, 12, f"--threshold {float(value)}: give the slowdown a shape may have, from 0 to 0.1")
    assert not (tmp_path / "p").exists()


def test_the_library_refuses_it_too():
    for value in (float("nan"), -5.0, 5.0, True):
        with pytest.raises(BadInput, match="--threshold"):
            emit.refusal(object(), slowdown_threshold=value)  # before the verdict is even looked at
    assert [emit.check_threshold(v) for v in (0, 0.02, 0.1)] == [0.0, 0.02, 0.1]
