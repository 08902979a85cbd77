"""The planning agent of the offline optimizer: the profile's symptoms to an ordered plan of rewrite passes.

    rules = load_rules()                                   # astra/data/planning_rules.yaml: data, not code
    plans, notes = make_plan(profile, rules)               # [Plan(band, idea, step="pass:vectorize", ...)]
    proposals = planned_proposals(profile, plans, base_source, spec)   # each planned pass applied to the base
    proposals, record = plan_round(profiler, ctx, spec)    # all of it for one round; `record` goes to the history

A rule maps a symptom (astra.optimize.profiling.Symptom), in some bands and with some facts, to passes to try
in order, passes to hold back, and the effect expected. Every matching rule contributes its passes; the plan
orders them by the rule's priority, then by the band's time above its practical floor (bands already near
the floor last), and keeps each pass once (the other symptoms that ask for it become notes). A held-back pass
(`avoid`: reuse while the kernel spills) leaves the plan. Each step is a `Plan` (astra.optimize.llm_context),
the structure the LLM planner fills: band, idea (the pass and its expected effect), expected speedup, risk,
rationale (the symptom's evidence) and `step`, the proposal id `pass:<name>`.

The passes come from `astra.optimize.passes` (`all_passes()`: name -> RewritePass with `name`, `family` and
`apply(source, spec) -> PassResult(applies, source, reason)`); where that package is absent the catalog is
empty and the plan is kept as advice. The offline agent tries the planned passes first, in order, then its
parameter search and its catalog (`ordered`).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import yaml

from astra import paths
from astra.errors import AstraError
from astra.optimize.llm_context import Plan
from astra.optimize.loop import Context, Proposal
from astra.optimize.profiling import Profile, ProfilingAgent, Symptom
from astra.optimize.rundir import RoundPlan
from astra.text import one_line

RULES = paths.DATA_DIR / "planning_rules.yaml"
PASS_PREFIX = "pass:"
_KEYS = {"symptom", "bands", "when", "passes", "avoid", "priority", "expect", "speedup", "risk"}


@dataclass(frozen=True)
class Rule:
    """One line of the rules file (see its header)."""

    symptom: str
    expect: str
    passes: tuple[str, ...] = ()
    avoid: tuple[str, ...] = ()
    bands: tuple[str, ...] = ()  # empty: every band
    when: dict = field(default_factory=dict)
    priority: int = 50
    speedup: float | None = None
    risk: str = ""

    def matches(self, symptom: Symptom) -> bool:
        if symptom.id != self.symptom:
            return False
        if self.bands and symptom.band not in self.bands and "all" not in self.bands:
            return False
        for fact, wanted in self.when.items():
            allowed = wanted if isinstance(wanted, list) else [wanted]
            if symptom.facts.get(fact) not in allowed:
                return False
        return True


def load_rules(path: Path = RULES) -> list[Rule]:
    """The rules in `path`; an AstraError names the file and the rule that is wrong."""
    try:
        data = yaml.safe_load(Path(path).read_text())
    except (OSError, yaml.YAMLError) as err:
        raise AstraError(f"planning rules {path}: unreadable ({one_line(err, 200)})") from None
    items = data.get("rules") if isinstance(data, dict) else None
    if not isinstance(items, list):
        raise AstraError(f"planning rules {path}: no `rules:` list")
    rules = []
    for i, item in enumerate(items, 1):
        where = f"planning rules {path}, rule {i}"
        if not isinstance(item, dict) or not {"symptom", "expect"} <= set(item):
            raise AstraError(f"{where}: needs `symptom` and `expect`")
        unknown = set(item) - _KEYS
        if unknown:
            raise AstraError(f"{where}: unknown key(s) {', '.join(sorted(unknown))}")
        lists = {k: item.get(k) or [] for k in ("passes", "avoid", "bands")}
        if not all(isinstance(v, list) and all(isinstance(x, str) for x in v) for v in lists.values()):
            raise AstraError(f"{where}: `passes`, `avoid` and `bands` are lists of names")
        if not isinstance(item.get("when") or {}, dict) or not isinstance(item.get("priority", 50), int):
            raise AstraError(f"{where}: `when` is a mapping and `priority` an integer")
        speedup = item.get("speedup")
        if speedup is not None and (isinstance(speedup, bool) or not isinstance(speedup, (int, float)) or speedup <= 0):
            raise AstraError(f"{where}: `speedup` is a positive number")
        rules.append(Rule(str(item["symptom"]), str(item["expect"]), tuple(lists["passes"]), tuple(lists["avoid"]),
                          tuple(lists["bands"]), dict(item.get("when") or {}), item.get("priority", 50),
                          float(speedup) if speedup is not None else None, str(item.get("risk") or "")))
    return rules


def make_plan(profile: Profile, rules: list[Rule]) -> tuple[list[Plan], list[str]]:
    """The passes the symptoms call for, in the order to try, each a `Plan` step; and notes: advice of rules
    that name no pass, and the passes held back."""
    matches = [(i, s, r) for i, s in enumerate(profile.symptoms) for r in rules if r.matches(s)]
    matches.sort(key=lambda m: (profile.near_floor(m[1].band), m[2].priority, -profile.headroom(m[1].band), m[0]))
    held: dict[str, Symptom] = {}
    for _, s, r in matches:
        for name in r.avoid:
            held.setdefault(name, s)
    plans: dict[str, Plan] = {}
    notes: list[str] = []
    for _, s, r in matches:
        evidence = f"{s.band}: {s.id}: {s.evidence} ({s.source})"
        if not r.passes:
            notes.append(f"{s.band}: {s.id}: {r.expect}")
        for name in r.passes:
            if name in held:
                continue
            if name in plans:
                plans[name].notes.append(f"also: {evidence}")
                continue
            plans[name] = Plan(band=s.band, idea=f"{name}: {r.expect}", expected_speedup=r.speedup, risk=r.risk,
                               rationale=evidence, step=PASS_PREFIX + name)
    for name, s in held.items():
        notes.append(f"{PASS_PREFIX}{name} held back: {s.band}: {s.id} ({s.evidence})")
    return list(plans.values()), list(dict.fromkeys(notes))


def pass_catalog() -> dict:
    """The rewrite passes by name (astra.optimize.passes.all_passes()); empty where that package is absent."""
    try:
        import astra.optimize.passes as passes
    except ModuleNotFoundError as err:
        if err.name != "astra.optimize.passes":  # the package is there and something it imports is not
            raise
        return {}
    return passes.all_passes()


def planned_proposals(profile: Profile, plan: list[Plan], base_source: str, spec: dict | None,
                      passes: dict | None = None) -> list[Proposal]:
    """Each planned pass applied to the base, in the plan's order: a `Proposal("pass:<name>", ...)` where it
    applies and changes the source. A step whose pass is missing, refuses or fails says why in its notes."""
    catalog = pass_catalog() if passes is None else passes
    out: list[Proposal] = []
    for step in plan:
        if not step.step.startswith(PASS_PREFIX):
            continue
        name = step.step.removeprefix(PASS_PREFIX)
        rewrite = catalog.get(name)
        if rewrite is None:
            step.notes.append(f"no pass {name!r} in the catalog")
            continue
        try:
            result = rewrite.apply(base_source, spec)
        except Exception as err:  # another component's bug: the step says so, the round goes on without it
            step.notes.append(f"the pass failed: {type(err).__name__}: {one_line(err, 200)}")
            continue
        if not result.applies or not result.source or result.source == base_source:
            step.notes.append(f"does not apply: {one_line(result.reason, 200)}")
            continue
        out.append(Proposal(step.step, rewrite.family, one_line(f"{result.reason} (planned for {step.band}: "
                                                                f"{step.rationale})", 400), result.source))
    return out


def ordered(planned: list[Proposal], rest: list[Proposal]) -> list[Proposal]:
    """The planned proposals first, in the plan's order, then the others (those the plan already holds left out)."""
    names = {p.name for p in planned}
    return planned + [p for p in rest if p.name not in names]


def plan_round(profiler: ProfilingAgent, ctx: Context, spec: dict | None, *, rules: list[Rule] | None = None,
               passes: dict | None = None) -> tuple[list[Proposal], RoundPlan]:
    """One round of the offline agent's profiling and planning: the base profiled (and the original, once a
    candidate is the base), the plan made, its passes applied. The record is what the run's history keeps."""
    base = "original" if ctx.best_n is None else f"best #{ctx.best_n}"
    profile = profiler.profile(ctx.base_source, ctx.base_verdict, "cand", base, original=ctx.best_n is None)
    original = None
    if ctx.best_n is not None and ctx.original_source:
        original = profiler.profile(ctx.original_source, ctx.base_verdict, "orig", "original", original=True)
    plans, notes = make_plan(profile, load_rules() if rules is None else rules)
    proposals = planned_proposals(profile, plans, ctx.base_source, spec, passes)
    record = RoundPlan(ctx.round, "offline", base, symptoms=[s.to_dict() for s in profile.symptoms],
                       original_symptoms=[s.to_dict() for s in original.symptoms] if original else [],
                       plans=[p.to_dict() for p in plans], notes=notes + profile.notes)
    return proposals, record


def summary(record: RoundPlan | None) -> str:
    """One line: the planned passes in order, or why there are none."""
    if record is None:
        return ""
    steps = [p.get("step") for p in record.plans if p.get("step")]
    if steps:
        return "plan: " + ", ".join(steps)
    return "plan: no rewrite pass called for" + (f" ({len(record.symptoms)} symptom(s))" if record.symptoms else "")
