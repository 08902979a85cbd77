"""harness.judge.phase_clock: named totals that add up over repeated steps, for the verdict's phases."""

from __future__ import annotations

import time

from harness.judge.phase_clock import PhaseClock


def test_named_steps_add_up_under_their_prefixed_names():
    clock = PhaseClock("check_")
    for _ in range(3):
        with clock("compare"):
            time.sleep(0.01)
    try:
        with clock("original"):
            raise ValueError("a failing step still counts")
    except ValueError:
        pass
    seconds = clock.rounded()
    assert set(seconds) == {"check_compare_s", "check_original_s"}
    assert 0.03 <= seconds["check_compare_s"] < 1.0 and seconds["check_original_s"] >= 0.0
