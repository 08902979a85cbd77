"""Summary statistics for timing samples (pure Python, no torch).

Every timing in a verdict is a `Stats`: the median with the 10th and 90th percentiles, the number of
samples, and the relative standard error of the median, which drives the stop rule in `timing`.

Relative standard error of the median
-------------------------------------
For n samples from a distribution with density f at its median m, the median's standard error is
1 / (2 f(m) sqrt(n)). For a normal distribution that is sqrt(pi/2) * sigma / sqrt(n) ~= 1.2533 sigma /
sqrt(n). Timing samples have heavy right tails (a preempted launch, a clock change), which inflate the
sample standard deviation, so sigma is estimated robustly as 1.4826 * MAD (median absolute deviation,
scaled to equal sigma for normal data):

    rel_stderr = 1.2533 * 1.4826 * MAD / (sqrt(n) * median)

No bootstrap: it is cheap enough to evaluate after every batch of samples. When more than half of the
samples are identical (MAD = 0, e.g. quantised event times) it reads 0 and the minimum sample count
decides; `timing` never stops below that minimum.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Iterable, Sequence

_SQRT_PI_OVER_2 = math.sqrt(math.pi / 2.0)  # 1.2533: efficiency factor of the median (normal data)
_MAD_TO_SIGMA = 1.4826  # 1 / Phi^-1(3/4)


def median(values: Sequence[float]) -> float:
    """The median (mean of the two middle values for an even count)."""
    return percentile(values, 50.0)


def percentile(values: Sequence[float], q: float) -> float:
    """The q-th percentile (0..100) with linear interpolation between closest ranks (numpy's default)."""
    if not values:
        raise ValueError("percentile of no values")
    if not 0.0 <= q <= 100.0:
        raise ValueError(f"percentile {q} outside 0..100")
    ordered = sorted(values)
    position = (len(ordered) - 1) * q / 100.0
    low = math.floor(position)
    high = min(low + 1, len(ordered) - 1)
    fraction = position - low
    return ordered[low] + (ordered[high] - ordered[low]) * fraction


def mad(values: Sequence[float]) -> float:
    """Median absolute deviation from the median (unscaled)."""
    center = median(values)
    return median([abs(v - center) for v in values])


def rel_stderr(values: Sequence[float]) -> float:
    """Relative standard error of the sample median (see the module docstring); inf below 2 samples."""
    n = len(values)
    if n < 2:
        return math.inf
    center = median(values)
    if center <= 0.0:
        return math.inf
    sigma = _MAD_TO_SIGMA * mad(values)
    return _SQRT_PI_OVER_2 * sigma / (math.sqrt(n) * center)


def geomean(values: Iterable[float]) -> float:
    """Geometric mean of positive values; ValueError on an empty input or a non-positive value."""
    items = list(values)
    if not items:
        raise ValueError("geometric mean of no values")
    if any(not v > 0.0 for v in items):
        raise ValueError(f"geometric mean needs positive values, got {min(items)}")
    return math.exp(sum(math.log(v) for v in items) / len(items))


@dataclass
class Stats:
    """One side's timing in one mode, in microseconds."""

    median_us: float
    p10_us: float
    p90_us: float
    n: int
    rel_stderr: float

    @classmethod
    def from_samples(cls, samples_us: Sequence[float]) -> "Stats":
        """Summarise raw samples (microseconds)."""
        if not samples_us:
            raise ValueError("no timing samples")
        return cls(
            median_us=median(samples_us),
            p10_us=percentile(samples_us, 10.0),
            p90_us=percentile(samples_us, 90.0),
            n=len(samples_us),
            rel_stderr=rel_stderr(samples_us),
        )

    def to_dict(self) -> dict:
        """JSON-ready dict; an infinite rel_stderr is written as None."""
        data = asdict(self)
        if not math.isfinite(data["rel_stderr"]):
            data["rel_stderr"] = None
        return data

    @classmethod
    def from_dict(cls, data: dict) -> "Stats":
        """Inverse of `to_dict`."""
        data = dict(data)
        if data.get("rel_stderr") is None:
            data["rel_stderr"] = math.inf
        return cls(**data)


def speedup(orig: Stats, cand: Stats) -> float:
    """Ratio of medians: > 1 means the candidate is faster."""
    if cand.median_us <= 0.0:
        raise ValueError("candidate median is not positive")
    return orig.median_us / cand.median_us
