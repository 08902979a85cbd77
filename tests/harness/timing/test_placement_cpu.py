"""harness.timing.placement and harness.judge.timings.placement_noise: every block gets a placement of its own,
and the spread of the blocks' ratios widens a case's noise band (per view and band, pooled over cases)."""

from __future__ import annotations

import math
import random

from harness.judge.timings import placement_noise
from harness.timing.placement import BLOCKS, layout_seeds
from tests.harness.timing.test_timed_sets_cpu import rowscale_case


def test_every_block_gets_its_own_nonzero_layout():
    seeds = layout_seeds(random.Random(7))
    assert len(seeds) == BLOCKS >= 2 and len(set(seeds)) == BLOCKS and all(s > 0 for s in seeds)
    assert seeds == layout_seeds(random.Random(7))


def _cases(bands):
    cases = []
    for i, band in enumerate(bands):
        case = rowscale_case(False, 8, 16)
        case.id, case.band = f"c{i}", band
        cases.append(case)
    return cases


def test_block_spread_is_pooled_per_view_and_band():
    cases = _cases(["decode", "decode", "prefill"])
    timings = {
        "c0": {"cold": {"info": {"block_ratios": [1.00, 1.04, 0.98]}}, "graph": {"info": {"block_ratios": [1.0, 1.0, 1.0]}}},
        "c1": {"cold": {"info": {"block_ratios": [1.02, 0.99, 1.01]}}},
        "c2": {"cold": {"info": {"block_ratios": [1.001, 0.999, 1.0]}}},
    }
    placement_noise(cases, timings)
    logs = [[math.log(r) for r in timings[c]["cold"]["info"]["block_ratios"]] for c in ("c0", "c1")]
    squares = sum((v - sum(ls) / 3) ** 2 for ls in logs for v in ls)
    expected = math.sqrt(squares / 4 / 3)  # 2 cases x (3 - 1) degrees of freedom, the mean of 3 blocks
    decode = timings["c0"]["cold"]["info"]["placement_rel_stderr"]
    assert math.isclose(decode, expected, rel_tol=1e-4) and decode > 0.005
    assert timings["c1"]["cold"]["info"]["placement_rel_stderr"] == decode
    assert timings["c2"]["cold"]["info"]["placement_rel_stderr"] < decode / 10  # prefill pooled apart
    assert timings["c0"]["graph"]["info"]["placement_rel_stderr"] == 0.0


def test_errors_and_missing_ratios_get_no_placement_term():
    cases = _cases(["decode"])
    timings = {"c0": {"cold": {"error": "oom", "kind": "oom", "side": None}, "graph": {"info": {}}}}
    placement_noise(cases, timings)
    assert "info" not in timings["c0"]["cold"] and "placement_rel_stderr" not in timings["c0"]["graph"]["info"]
