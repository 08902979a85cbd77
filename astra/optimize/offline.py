"""The offline search agent: no LLM, deterministic.

Each round profiles its base and plans from the symptoms (astra.optimize.planning: the profile's facts to
rewrite passes, astra.optimize.passes: packed loads, coarsening, hoisted loads, warp reductions, fast math
where the spec's tolerance allows, ...; each proposal `pass:NAME`). The planned passes that apply come first,
in the plan's order, in a round of their own.

With an evaluator that screens (a GPU run: astra.optimize.evaluator), a base is then searched once: the
parameter space read from its source (launch and tile constants, vector widths, launch bounds, unroll factors:
astra.optimize.param_space) explored by successive halving on representative shapes
(astra.optimize.param_search) within part of the wall time left; the survivors are proposed for full
verification, followed by the catalog transformations of families the space does not cover (restrict, unroll
pragmas) and the passes the plan did not name. The search comes after the plan because it takes most of the
time it is given: over twelve kernels of SGLang 0.5.23 on 4 x H100 (docs/results.md, 2026-11-27), with 168 s
per kernel, it ran first on every base it could screen and took 48 to 92 s of each, and one of its points
survived screening (rejected by the full verification), while the plan named passes for eleven of them.
Without a GPU (a dry run), the catalog and the passes, ordered by the profile (which band is far from its
floor). Every proposal is made once per base."""

from __future__ import annotations

import difflib
import tempfile
import time
from pathlib import Path
from typing import Callable

from astra.optimize import entry_reach, param_search, planning
from astra.optimize.evaluator import Evaluator
from astra.optimize.loop import Agent, Context, Proposal, source_id
from astra.optimize.profiling import ProfilingAgent
from astra.optimize.rundir import RunDir
from astra.optimize.transforms import catalog
from harness import Verdict

# Which transformation families to try first, by where the gap is.
# An early PDL trigger comes last: on an H100 (2026-11-24) it gained 0.8% on qsa_indexer's decode cases and lost
# 8% on its middle ones (graph view); inkling_rel_proj's decode lost 2%.
# A per-thread copy of read-only memory comes first everywhere: on an H100 (2026-11-24) dropping
# lplb_dispatch_probability's 288-column copy (255 registers, spills) measured x2.44 over its suite.
_ORDER_LATENCY = ["remat", "launch", "coarsen", "bounds", "unroll", "reuse", "restrict", "fastmath", "vectorize",
                  "warp_reduce", "pdl"]  # small shapes: launch first
_ORDER_BANDWIDTH = ["remat", "vectorize", "restrict", "reuse", "unroll", "launch", "bounds", "coarsen", "fastmath",
                    "warp_reduce", "pdl"]  # large: memory path first


def band_gaps(verdict: Verdict | None, mode: str = "graph") -> dict[str, float]:
    """Mean roofline fraction per band of the base (1.0 where unknown)."""
    sums: dict[str, list[float]] = {}
    for case in verdict.cases if verdict else []:
        frac = (case.roofline.get(mode) or {}).get("cand_fraction")
        if case.timed and frac is not None:
            sums.setdefault(case.band, []).append(frac)
    return {band: sum(v) / len(v) for band, v in sums.items()}


def plan(verdict: Verdict | None) -> tuple[list[str], str]:
    """Family order and a one-line rationale from the profile."""
    gaps = band_gaps(verdict)
    if not gaps:
        return _ORDER_LATENCY, "no profile yet: launch-shape changes first"
    worst = min(gaps, key=gaps.get)
    text = ", ".join(f"{b} {100 * f:.0f}%" for b, f in sorted(gaps.items()))
    if gaps[worst] >= 0.9:
        return _ORDER_BANDWIDTH, f"every band at >= 90% of roofline ({text}): little left to gain"
    order = _ORDER_LATENCY if worst in ("decode", "middle") else _ORDER_BANDWIDTH
    return order, f"largest gap in {worst} ({text}): trying {order[1]} first after any staged copy"


class OfflineAgent(Agent):
    """`evaluator`: the run's judge; the parameter search runs where it screens (none: the catalog alone).
    `on_search_line`: each line of the search's log as it is written (`search_logger`: the run's search.log).
    `profiler`: the profiling agent whose symptoms the planner maps to rewrite passes (astra.optimize.planning),
    tried first in the planned order; `spec`: the spec's raw dict, for the passes."""

    name = "offline"

    def __init__(self, kernel_file: str, source_root: Path, include_dirs: list[str], *,
                 evaluator: Evaluator | None = None, entries: list[str] | None = None,
                 on_search_line: Callable[[str], None] | None = None, per_round: int = 12, search_share: float = 0.6,
                 profiler: ProfilingAgent | None = None, spec: dict | None = None):
        self.kernel_file = kernel_file
        self.source_root = Path(source_root)
        self.include_dirs = include_dirs
        self.per_round = per_round
        self.tried: set[tuple[str, str]] = set()
        self.rationale = ""
        self.evaluator = evaluator
        self.search_share = search_share  # of the wall time left, for screening one base
        self.searched: set[str] = set()
        self.on_search_line = on_search_line
        self.entries = list(entries or [])  # the spec's host entries: the search stays in the code they reach
        self._parses: dict[str, object] = {}  # source id -> libclang's view: the search and the catalog share it
        self.profiler = profiler if profiler is not None else ProfilingAgent()  # planning: no ncu unless given
        self.spec = spec  # the spec's raw form: the planner and the passes read its tolerance

    def propose(self, ctx: Context) -> list[Proposal]:
        base = source_id(ctx.base_source)
        for entry in ctx.history:  # a resumed run does not retry what it already tried on this base
            if entry.base == base:
                self.tried.add((base, entry.name))
        order, self.rationale = plan(ctx.base_verdict)
        planned, self.plan = planning.plan_round(self.profiler, ctx, self.spec)  # symptoms -> planned rewrite passes
        first = [p for p in planned if (base, p.name) not in self.tried][: self.per_round]
        if first and self._searches() and base not in self.searched:
            # the plan's passes before the parameter search, which would take most of the time left (module docstring)
            self.rationale = f"the profile's plan before the parameter search; {self.rationale}"
            self.tried.update((base, p.name) for p in first)
            return first
        searched = self._search(ctx, base)
        proposals = self._reached(ctx.base_source, catalog(ctx.base_source, self._kernels(ctx.base_source))
                                  + self._rewrites(ctx.base_source))
        if self._searches():  # the space covers launch constants and unroll factors: the catalog the rest
            proposals = [p for p in proposals if p.family not in ("launch", "bounds")]
        proposals.sort(key=lambda p: order.index(p.family) if p.family in order else len(order))
        fresh = [p for p in planning.ordered(planned, searched + proposals)
                 if (base, p.name) not in self.tried][: self.per_round]
        self.tried.update((base, p.name) for p in fresh)
        return fresh

    def _search(self, ctx: Context, base: str) -> list[Proposal]:
        """The survivors of a parameter search of this base (once per base; none without a GPU)."""
        judge = self.evaluator
        if not self._searches() or base in self.searched:
            return []
        self.searched.add(base)
        budget = (ctx.wall_left_s if ctx.wall_left_s is not None else 600.0) * self.search_share
        rungs = [param_search.representative_cases(ctx.base_verdict, judge.timed_dtype, n) for n in (1, 3)]
        foreign = (entry_reach.foreign_lines(self._parsed(ctx.base_source), self.entries, ctx.base_source)
                   if self.entries else set())
        if self.on_search_line is not None:  # a resumed run appends a second search: say where each starts
            self.on_search_line(f"search of base {base[:12]}, {budget:.0f} s at most")
        search = param_search.Search(ctx.base_source, judge.screen, [r for r in rungs if r],
                                     deadline=time.time() + budget, prebuild=judge.prebuild, foreign_lines=foreign,
                                     on_line=self.on_search_line, entries=self.entries)
        survivors = search.run()
        self.rationale = (f"parameter search: {search.screened} screening(s) in {budget:.0f}s at most, "
                          f"{len(survivors)} survivor(s); " + self.rationale)
        return [Proposal(param_search.param_space.slug(p.assignment), "param",
                         f"{p.reason} (screened x{p.score:.3f} on {len(search.rungs[len(p.scores) - 1])} shapes)", p.source)
                for p in survivors]

    def _rewrites(self, source: str) -> list[Proposal]:
        """The default rewrite passes' outputs for this source, one proposal per pass that applies."""
        from astra.optimize import passes
        from astra.optimize.passes.syntax import Headers

        headers = Headers((*self.include_dirs, str(self.source_root)), (), str(self.source_root / self.kernel_file))
        out = []
        for name, rewrite in passes.catalog(headers, passes.DEFAULT).items():
            result = rewrite.apply(source, self.spec)
            if result.applies and result.source is not None:
                out.append(Proposal(f"pass:{name}", rewrite.family, result.reason, result.source))
        return out

    def _searches(self) -> bool:
        """Whether new bases are searched: only with an evaluator that screens (on a GPU)."""
        return self.evaluator is not None and self.evaluator.screens

    def _reached(self, source: str, proposals: list[Proposal]) -> list[Proposal]:
        """The proposals that change a line the spec's entries reach (an edit of a kernel they never launch
        times x1.000 and only adds noise to a patch)."""
        if not self.entries:
            return proposals
        foreign = entry_reach.foreign_lines(self._parsed(source), self.entries, source)
        return [p for p in proposals if not foreign or not _changed_lines(source, p.source) <= foreign]

    def _kernels(self, source: str) -> list:
        parsed = self._parsed(source)
        return parsed.kernels if parsed is not None else []

    def _parsed(self, source: str):
        """libclang's view of the source where it would live (relative includes resolve to the real
        tree), once per source; None when libclang is unavailable."""
        key = source_id(source)
        if key not in self._parses:
            self._parses[key] = self._parse(source)
        return self._parses[key]

    def _parse(self, source: str):
        from astra.errors import ToolMissing
        from astra.sglang import cuda_parse

        original = self.source_root / self.kernel_file
        with tempfile.TemporaryDirectory(prefix="astra-parse-") as tmp:
            path = Path(tmp) / Path(self.kernel_file).name
            path.write_text(source)
            try:
                return cuda_parse.parse_source(path, [str(original.parent), *self.include_dirs, str(self.source_root)])
            except ToolMissing:
                return None


def search_logger(run: RunDir, say: Callable[[str], None]) -> Callable[[str], None]:
    """Each line of the parameter search's log, as it is written: appended to the run's search.log (with
    the time) and printed, so a user sees what was screened and why it lost."""

    def on_line(line: str) -> None:
        try:
            with run.search_log.open("a", encoding="utf-8") as out:
                out.write(f"[{time.strftime('%Y-%m-%dT%H:%M:%S')}] {line}\n")
        except OSError as err:  # a full disk loses the log line, not the run
            say(f"warning: cannot write {run.search_log}: {err.strerror or err}")
        say(f"[{time.strftime('%H:%M:%S')}]      search: {line}")

    return on_line


def _changed_lines(before: str, after: str) -> set[int]:
    """Lines (1-based) of `before` that `after` replaces, deletes or inserts next to."""
    matcher = difflib.SequenceMatcher(None, before.splitlines(), after.splitlines(), autojunk=False)
    lines: set[int] = set()
    for op, i1, i2, _, _ in matcher.get_opcodes():
        if op != "equal":
            lines.update(range(i1 + 1, max(i2, i1 + 1) + 1))
    return lines
