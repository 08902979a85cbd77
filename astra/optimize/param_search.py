"""The offline search over the parameter space (astra.optimize.param_space), spending little on losers.

Successive halving on shapes: every point is first screened on one representative shape per band
(the timed dtype only, no sanitizer: `screen(source, label, case_ids)`, a real verdict from the
harness on those cases); the best third that is correct and faster there goes on to three shapes per
band; what survives is handed to the loop, which verifies it on the full suite with the sanitizer like
any candidate. Between the two rungs, the winning single moves are combined (coordinate search:
pairs and the triple of moves on different parameters) and screened on the first rung too.

Screening a point costs a build and a short worker run; `prebuild(sources, case_ids, base)` (every CPU
core, the harness's content-hashed cache, the variants of the rung's shapes) builds a rung's points at
once so the workers find them built, and names the points not worth a worker run: those whose modules are the
base's machine code (an edit of a constant the entry never reaches) and those that failed to build (a
static assertion on the block size, ...), each with nvcc's first error line. Neither is screened: a worker
would only say the same, in 3 to 7 s (hc_combine's search on 4 x H100, 2026-11-28: five build failures in its
67 s). The search stops screening at its deadline and ranks what it has.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field
from typing import Callable

from astra.optimize import param_space
from harness import Verdict, score

WIN = 1.01  # a screened point must beat the original by 1% on its shapes (the rest is noise on few shapes)
Screen = Callable[[str, str, list[str]], Verdict]  # (source, label, case ids) -> verdict on those cases
SAME_CODE = "builds to the base's machine code"  # a prebuild's reason: it can only measure x1.000
BUILD_FAILED = "build_failed"  # a prebuild's reason starts so when the source failed to build
# (sources, the case ids they will be screened on, the search's base) -> {source: why it is not screened}:
# SAME_CODE, or BUILD_FAILED and nvcc's first error line (None: every source is screened)
Prebuild = Callable[[list[str], list[str], str], "dict[str, str] | None"]


@dataclass
class Point:
    assignment: dict[str, int]
    source: str
    scores: list[float] = field(default_factory=list)  # one per rung screened
    status: str = ""
    reason: str = ""

    @property
    def score(self) -> float:
        return self.scores[-1] if self.scores else 0.0


def representative_cases(verdict: Verdict | None, dtype: str | None, per_band: int) -> list[str]:
    """Timed cases of `dtype` (all dtypes when None): per band, the median by bytes (per_band 1) or the
    smallest, median and largest (per_band 3)."""
    bands: dict[str, list] = {}
    for case in verdict.cases if verdict else []:
        if case.timed and (dtype is None or case.dtype == dtype):
            bands.setdefault(case.band, []).append(case)
    chosen: list[str] = []
    for cases in bands.values():
        cases.sort(key=lambda c: c.bytes)
        picks = [cases[len(cases) // 2]] if per_band == 1 else [cases[0], cases[len(cases) // 2], cases[-1]]
        chosen.extend(c.id for c in picks if c.id not in chosen)
    return chosen


@dataclass
class Search:
    base_source: str
    screen: Screen
    rungs: list[list[str]]  # case ids per rung, smallest first
    deadline: float  # time.time() after which nothing more is screened
    prebuild: Prebuild | None = None
    keep: float = 1 / 3
    log: list[str] = field(default_factory=list)  # one line per screened point, for the run's rationale
    foreign_lines: set[int] = field(default_factory=set)  # code the entry does not reach (astra.optimize.entry_reach)
    on_line: Callable[[str], None] | None = None  # each log line as it is written (the run's search.log)
    screened: int = 0  # points screened so far (each a worker run)
    entries: list[str] = field(default_factory=list)  # the spec's wrapper entries: their literal template arguments

    def note(self, line: str) -> None:
        self.log.append(line)
        if self.on_line is not None:
            self.on_line(line)

    def run(self, survivors: int = 3) -> list[Point]:
        params = param_space.find_params(self.base_source, self.entries)
        elsewhere = [p for p in params if param_space.line_of(self.base_source, p) in self.foreign_lines]
        if elsewhere:
            self.note(f"{len(elsewhere)} parameter(s) in code this entry does not reach, not screened: "
                      + ", ".join(p.name for p in elsewhere))
            params = [p for p in params if p not in elsewhere]
        if not params or not self.rungs:
            self.note("no tunable parameter in the source" if not params else "no timed shape to screen on")
            return []
        self.note(f"{len(params)} parameter(s): " + ", ".join(f"{p.name}={p.value} ({p.kind})" for p in params))
        singles = self._rung(0, [self._point(params, a) for a in param_space.single_moves(params)])
        winners = [p.assignment for p in singles if p.score > WIN]
        combos = self._rung(0, [self._point(params, a) for a in param_space.combine(winners)])
        ranked = sorted([p for p in singles + combos if p.score > WIN], key=lambda p: -p.score)
        alive = ranked[: max(1, math.ceil(len(ranked) * self.keep))] if ranked else []
        for rung in range(1, len(self.rungs)):
            screened = self._rung(rung, alive)
            # a point the deadline left unscreened on this rung keeps its earlier rung's ranking: a winner on
            # few shapes is still worth the loop's full verification, which judges it on every shape
            done = {id(p) for p in screened}
            kept = [p for p in alive if id(p) not in done and len(p.scores) == rung]
            # points judged on this rung's shapes rank before those only judged on fewer
            alive = sorted([p for p in screened if p.score > WIN] + kept, key=lambda p: (-len(p.scores), -p.score))
        return alive[:survivors]

    def _point(self, params: list[param_space.Param], assignment: dict[str, int]) -> Point:
        point = Point(assignment, param_space.render(self.base_source, params, assignment))
        point.reason = param_space.describe(params, assignment)
        return point

    def _rung(self, rung: int, points: list[Point]) -> list[Point]:
        points = [p for p in points if p.source != self.base_source]
        skipped: dict[str, str] = {}
        if self.prebuild and points and time.time() < self.deadline:
            skipped = self.prebuild([p.source for p in points], self.rungs[rung], self.base_source) or {}
        screened = []
        for point in points:
            why = skipped.get(point.source)
            if why is None:
                continue
            if why.startswith(BUILD_FAILED):  # what a worker would answer, known from the rung's build
                point.status = BUILD_FAILED
                point.scores.append(0.0)
                said = _first_line(why.removeprefix(BUILD_FAILED).lstrip(": "))
                self.note(f"rung {rung} ({len(self.rungs[rung])} shapes): {point.reason}: {BUILD_FAILED} ({said}) "
                          "[the rung's build, not screened]")
                screened.append(point)
            else:  # dead code for this entry: it can only measure x1.000
                self.note(f"rung {rung}: {point.reason}: {why}, not screened")
        points = [p for p in points if p.source not in skipped]
        for done, point in enumerate(points):
            if time.time() >= self.deadline:
                self.note(f"rung {rung}: deadline reached, {len(points) - done} point(s) not screened")
                break
            start = time.time()
            verdict = self.screen(point.source, param_space.slug(point.assignment), self.rungs[rung])
            self.screened += 1
            point.status = verdict.status
            point.scores.append(score(verdict) if verdict.status == "correct" else 0.0)
            why = "" if verdict.status == "correct" else f" ({_first_line(verdict.reason)})"
            self.note(f"rung {rung} ({len(self.rungs[rung])} shapes): {point.reason}: {verdict.status}"
                      + (f" x{point.score:.3f}" if point.score else "") + why + f" [{_took(time.time() - start, verdict)}]")
            screened.append(point)
        return screened


def _first_line(text: str | None, limit: int = 160) -> str:
    line = (text or "").strip().splitlines()[0] if (text or "").strip() else "no reason given"
    return line if len(line) <= limit else line[: limit - 3] + "..."


def _took(seconds: float, verdict: Verdict) -> str:
    """`29 s: build 0.2, env 1.0, check 3.1, time 24.0` (the worker's phases, where the verdict has them)."""
    phases = getattr(verdict, "phases", None) or {}
    parts = [f"{name[:-2]} {phases[name]:.1f}" for name in ("build_s", "env_s", "check_s", "time_s") if name in phases]
    return f"{seconds:.0f} s" + (": " + ", ".join(parts) if parts else "")
