"""Where a judge's seconds go: named host-time totals, for the verdict's `phases`.

The judge synchronises the device wherever it compares outputs, so host time spent inside a named step is
that step's GPU time too. The names are flat (`check_original_s`, ...) so every report can print them.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager


class PhaseClock:
    """`with clock("original"):` adds the block's seconds to `seconds["original"]`; `clock.count("x", n)` adds
    n to a count (no `_s`: how many of something, such as the tensors that came over CUDA IPC)."""

    def __init__(self, prefix: str = "") -> None:
        self.prefix = prefix
        self.seconds: dict[str, float] = {}
        self.counts: dict[str, int] = {}

    def count(self, name: str, n: int) -> None:
        key = f"{self.prefix}{name}"
        self.counts[key] = self.counts.get(key, 0) + n

    @contextmanager
    def __call__(self, name: str) -> Iterator[None]:
        start = time.monotonic()
        try:
            yield
        finally:
            key = f"{self.prefix}{name}_s"
            self.seconds[key] = self.seconds.get(key, 0.0) + time.monotonic() - start

    def rounded(self) -> dict[str, float]:
        return {**{name: round(value, 3) for name, value in self.seconds.items()}, **self.counts}
