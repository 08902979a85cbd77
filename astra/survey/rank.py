"""The ranking: how much time each kernel leaves above its practical floor, weighted by a serving mix.

For a kernel K, in one view v (graph by default, or cold), over the timed cases of its bench verdict:

    excess(c)    = max(0, time(c) - practical(c))          time = floors[v].orig_us (else the median of
                                                           timings[v].orig), practical = floors[v].practical_us
    E(t)         = mean of excess(c) over the suite's families at token count t
    recoverable  = sum over t of w_K(t) * E(t)             microseconds per weighted step
    score        = recoverable * REACH_FACTORS[reach]      (warm 1, gated 0.5, cold 0.1, unknown 1)

A family is one (model entry, dtype) of the spec's suite: the dims other than the token dim plus the
dtype. Families are averaged with equal weight (arithmetic mean of microseconds): every model shape and
every dtype the suite lists counts as one equally likely deployment, and the number reads as the
recoverable time of an average call. w_K is the mix's weights moved to the kernel's token counts
(astra.survey.mixes): normalised to sum to 1, except for observed counts with `steps`.

Also per kernel: the geomean x above the practical floor (time / practical, geometric mean over the
families at each token count, then weighted by w_K across token counts), and the worst case (the
largest time / practical among the cases that carry weight). A case without a practical floor (a
verdict from before floors were recorded) is skipped, with a note; a kernel with none left is listed
unranked, after the ranked ones; a kernel whose bench gave no verdict, or a failed one, comes last.
Ranked kernels are ordered by score, largest first.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field

from astra.survey import reach as reach_mod
from astra.survey.mixes import Mix, suite_weights
from harness.timing import roofline

VIEWS = ("graph", "cold")
FORMULA = ("recoverable_us = sum_t w(t) * mean_families max(0, time - practical_floor); "
           "score = recoverable_us * reach factor")
_OK_STATUSES = ("correct", "timed", "incomplete", "suspect")


@dataclass
class Point:
    """One timed case in the chosen view."""

    id: str
    tokens: int
    family: str  # "<label> <other dims>/<dtype>"
    time_us: float
    practical_us: float
    physical_us: float | None
    x: float  # time / practical
    excess_us: float
    weight: float = 0.0  # w(t) of its token count
    under_floor: bool = False  # under the physical floor by the bench's own margins (harness.timing.roofline.suspect)


@dataclass
class KernelRank:
    name: str
    kind: str
    status: str  # "ranked" | "unranked" | "failed"
    reach: dict
    gates: str
    factor: float
    recoverable_us: float | None = None
    score: float | None = None
    geomean_x: float | None = None
    worst: dict | None = None
    curve: list[dict] = field(default_factory=list)  # per token count: tokens, weight, time/practical/physical us
    notes: list[str] = field(default_factory=list)
    gpu: str | None = None
    sglang_version: str | None = None
    cases: int = 0

    def to_dict(self) -> dict:
        return asdict(self)


@dataclass
class Ranking:
    view: str
    mix: Mix
    kernels: list[KernelRank]
    problems: list[str] = field(default_factory=list)  # store files that could not be read

    def ranked(self) -> list[KernelRank]:
        return [k for k in self.kernels if k.status == "ranked"]

    def to_dict(self) -> dict:
        return {"format": "astra-survey/1", "view": self.view, "mix": self.mix.to_dict(), "formula": FORMULA,
                "reach_factors": dict(reach_mod.REACH_FACTORS), "problems": self.problems,
                "kernels": [k.to_dict() for k in self.kernels]}


def token_dim(record: dict) -> str:
    return str(record.get("token_dim") or "tokens")


def points(record: dict, view: str) -> tuple[list[Point], list[str]]:
    """The timed cases of the record's verdict in `view` that have a practical floor; notes on the rest."""
    verdict = record.get("verdict") or {}
    dim = token_dim(record)
    out: list[Point] = []
    no_floor = untimed = no_tokens = 0
    for case in verdict.get("cases") or []:
        if not case.get("timed", True) or case.get("label") == "edge":
            continue
        dims = case.get("dims") or {}
        if dim not in dims:
            no_tokens += 1
            continue
        floors = (case.get("floors") or {}).get(view) or {}
        timing = (case.get("timings") or {}).get(view) or {}
        time_us = floors.get("orig_us") or (timing.get("orig") or {}).get("median_us")
        practical = floors.get("practical_us")
        if not time_us or time_us <= 0:
            untimed += 1
            continue
        if not practical or practical <= 0:
            no_floor += 1
            continue
        x = floors.get("orig_x_practical") or time_us / practical
        others = ",".join(f"{k}={v}" for k, v in dims.items() if k != dim)
        out.append(Point(str(case.get("id")), int(dims[dim]), f"{case.get('label')} {others}/{case.get('dtype')}",
                         float(time_us), float(practical), floors.get("physical_us"), float(x),
                         max(0.0, float(time_us) - float(practical)), under_floor=_under_floor(time_us, floors)))
    notes = []
    if no_floor:
        notes.append(f"{no_floor} case(s) without a practical floor in the {view} view (a verdict from before "
                     "floors were recorded): not ranked")
    if untimed:
        notes.append(f"{untimed} case(s) not timed in the {view} view")
    if no_tokens:
        notes.append(f"{no_tokens} case(s) without the token dim {dim!r}: not ranked")
    return out, notes


def _under_floor(time_us: float, floors: dict) -> bool:
    """The bench's own test for a time it cannot believe (harness.timing.roofline.suspect, margins included); a
    record from before floors kept their DRAM and launch parts: under its physical floor."""
    if floors.get("dram_us") is None and floors.get("launch_us") is None:
        return bool(floors.get("physical_us")) and time_us < floors["physical_us"]
    return roofline.suspect(1.0, time_us, {"physical_us": 0.0, "dram_bytes": 0, "peak_Bps": 0.0, **floors}, 0) \
        is not None


def _mean(values: list[float]) -> float | None:
    return sum(values) / len(values) if values else None


def spec_label(record: dict) -> str:
    """The spec column: "reviewed", or "draft (N guesses)" when the record counted its TODO(review) markers."""
    kind = str(record.get("kind") or "?")
    guesses = record.get("guesses")
    if kind == "draft" and isinstance(guesses, int) and guesses > 0:
        return f"draft ({guesses} guess{'es' if guesses != 1 else ''})"
    return kind


def rank_kernel(record: dict, view: str, mix: Mix) -> KernelRank:
    """One kernel's row (see the module docstring)."""
    name = str(record["name"])
    reach = record.get("reach") or reach_mod.unknown("no reach recorded")
    row = KernelRank(name=name, kind=spec_label(record), status="failed", reach=reach,
                     gates=reach_mod.label(reach), factor=reach_mod.factor(reach), gpu=record.get("gpu"),
                     sglang_version=record.get("sglang_version"))
    verdict = record.get("verdict")
    if verdict is None:
        row.notes.append(f"no verdict: {record.get('error') or 'no reason recorded'}")
        return row
    pts, row.notes = points(record, view)
    row.cases = len(pts)
    status = verdict.get("status")
    if status not in _OK_STATUSES:
        row.notes.insert(0, f"bench {status}: {verdict.get('reason') or ''}".strip())
        if not pts:
            return row
    if not pts:
        row.status = "unranked"
        if not row.notes and not verdict.get("cases"):
            row.notes.append("the bench timed no case: only cases of a model configuration are timed, and this "
                             "spec's suite has `edge` cases only (give it `shapes.models` whose dims it can use)")
        elif not row.notes:
            row.notes.append(f"no timed case in the {view} view")
        return row
    raw, normalise, note = mix.for_kernel(name)
    if note:
        row.notes.append(note)
    weights = suite_weights(raw, [p.tokens for p in pts], normalise=normalise)
    by_tokens: dict[int, list[Point]] = {}
    for p in pts:
        p.weight = weights[p.tokens]
        by_tokens.setdefault(p.tokens, []).append(p)
    recoverable, log_x, total_w = 0.0, 0.0, 0.0
    for tokens, group in sorted(by_tokens.items()):
        w = weights[tokens]
        excess = _mean([p.excess_us for p in group])
        mean_log_x = _mean([math.log(p.x) for p in group])
        recoverable += w * excess
        log_x += w * mean_log_x
        total_w += w
        physical = [p.physical_us for p in group if p.physical_us is not None]
        row.curve.append({"tokens": tokens, "weight": w, "families": len(group),
                          "time_us": _mean([p.time_us for p in group]),
                          "practical_us": _mean([p.practical_us for p in group]),
                          "physical_us": _mean(physical), "excess_us": excess})
    if total_w > 0:
        row.geomean_x = math.exp(log_x / total_w)
    else:
        row.geomean_x = math.exp(_mean([math.log(p.x) for p in pts]))
        row.notes.append("no weight of the mix lands on this kernel: geomean x over all its cases")
    weighted = [p for p in pts if p.weight > 0] or pts
    worst = max(weighted, key=lambda p: p.x)
    row.worst = {"id": worst.id, "tokens": worst.tokens, "x": worst.x, "time_us": worst.time_us,
                 "practical_us": worst.practical_us, "excess_us": worst.excess_us}
    below = [p.id for p in pts if p.under_floor]
    if below:
        row.notes.append(f"{len(below)} case(s) timed below the physical floor, e.g. {below[0]}: the original "
                         "cannot beat a true floor, so the spec's `bytes` likely overcounts (a cache or table "
                         "counted whole?); fix its bytes and survey it again before trusting its rank")
    row.recoverable_us = recoverable
    row.score = recoverable * row.factor
    row.status = "ranked"
    return row


def rank(records: dict[str, dict], view: str, mix: Mix, problems: list[str] | None = None) -> Ranking:
    """Every record's row: ranked ones by score (largest first), then unranked, then failed (by name)."""
    if view not in VIEWS:
        raise ValueError(f"view {view!r}: use one of {VIEWS}")
    rows = [rank_kernel(record, view, mix) for record in records.values()]
    order = {"ranked": 0, "unranked": 1, "failed": 2}
    rows.sort(key=lambda r: (order[r.status], -(r.score or 0.0), r.name))
    return Ranking(view, mix, rows, list(problems or []))
