"""harness.timing.stats: median, percentiles, geomean, relative standard error, Stats round trip."""

from __future__ import annotations

import math
import random

import pytest

from harness.timing.stats import Stats, geomean, mad, median, percentile, rel_stderr, speedup


def test_median_odd_and_even():
    assert median([3.0, 1.0, 2.0]) == 2.0
    assert median([4.0, 1.0, 3.0, 2.0]) == 2.5
    assert median([7.0]) == 7.0


def test_percentile_linear_interpolation_matches_numpy_default():
    values = [10.0, 20.0, 30.0, 40.0, 50.0]
    assert percentile(values, 0) == 10.0
    assert percentile(values, 100) == 50.0
    assert percentile(values, 10) == pytest.approx(14.0)  # position 0.4
    assert percentile(values, 90) == pytest.approx(46.0)  # position 3.6
    assert percentile(list(range(1, 11)), 10) == pytest.approx(1.9)


def test_percentile_rejects_bad_input():
    with pytest.raises(ValueError):
        percentile([], 50)
    with pytest.raises(ValueError):
        percentile([1.0], 101)


def test_geomean():
    assert geomean([1.0, 4.0]) == pytest.approx(2.0)
    assert geomean([2.0, 2.0, 2.0]) == pytest.approx(2.0)
    assert geomean([0.5, 2.0]) == pytest.approx(1.0)
    with pytest.raises(ValueError):
        geomean([])
    with pytest.raises(ValueError):
        geomean([1.0, 0.0])


def test_mad_and_rel_stderr_on_known_data():
    values = [1.0, 2.0, 3.0, 4.0, 100.0]  # an outlier does not move the MAD
    assert mad(values) == 1.0
    expected = math.sqrt(math.pi / 2) * 1.4826 * 1.0 / (math.sqrt(5) * 3.0)
    assert rel_stderr(values) == pytest.approx(expected)
    assert rel_stderr([5.0]) == math.inf
    assert rel_stderr([5.0] * 10) == 0.0


def test_rel_stderr_shrinks_like_one_over_sqrt_n():
    rng = random.Random(0)
    small = [10.0 + rng.gauss(0, 0.5) for _ in range(100)]
    large = [10.0 + rng.gauss(0, 0.5) for _ in range(10000)]
    ratio = rel_stderr(small) / rel_stderr(large)
    assert 7.0 < ratio < 13.0  # sqrt(100) = 10
    # for normal data the estimate approaches the true standard error of the median
    assert rel_stderr(large) == pytest.approx(1.2533 * 0.5 / (100 * 10.0), rel=0.1)


def test_stats_from_samples_and_round_trip():
    stats = Stats.from_samples([float(v) for v in range(1, 11)])
    assert stats.median_us == 5.5
    assert stats.p10_us == pytest.approx(1.9)
    assert stats.p90_us == pytest.approx(9.1)
    assert stats.n == 10
    assert Stats.from_dict(stats.to_dict()) == stats
    single = Stats.from_samples([3.0])
    assert single.to_dict()["rel_stderr"] is None
    assert Stats.from_dict(single.to_dict()).rel_stderr == math.inf
    with pytest.raises(ValueError):
        Stats.from_samples([])


def test_speedup_is_ratio_of_medians():
    orig = Stats(10.0, 9.0, 11.0, 20, 0.01)
    cand = Stats(5.0, 4.0, 6.0, 20, 0.01)
    assert speedup(orig, cand) == 2.0
    assert speedup(cand, orig) == 0.5
