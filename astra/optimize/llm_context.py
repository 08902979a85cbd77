"""What the LLM agent's roles read, as text: tables of a verdict, failures, history, plans and profiles.

Pure functions of the loop's `Context` and of model replies, so each is testable without a model:

    shape_table(verdict)             per shape and view: original and best time, both floors, x practical
    band_table(verdict)              per band and view: speedup, x practical, microseconds above the floor
    failures_text(ctx.failures)      the last candidates not accepted, each with its reason and details
    history_text(history, ideas)     what was tried, by idea (never by `llm:rN`), with its measured outcome
    parse_plan(text, verdict)        the planner's JSON plan, its band checked against the verdict's bands
    parse_profile(text)              the profiling role's JSON, or its raw text with a note

"x practical" is time / practical floor (harness.timing.roofline): 1.0 is as fast as the measured bandwidth
allows; the physical floor is the time no kernel beats.
"""

from __future__ import annotations

import json
import math
import re
from dataclasses import asdict, dataclass, field

from astra.text import one_line
from harness import BANDS, Verdict, geomean

BAND_CHOICES = (*BANDS, "all")
_FENCED = re.compile(r"```(?:json)?\s*(.*?)```", re.S)


def json_block(text: str):
    """The first JSON value in a reply (fenced or bare); None when there is none."""
    for candidate in [m.group(1) for m in _FENCED.finditer(text)] + [text]:
        try:
            return json.loads(candidate.strip())
        except (json.JSONDecodeError, ValueError, RecursionError):
            continue
    return None


def _num(value: float | None, digits: int = 2) -> str:
    return "-" if value is None or not math.isfinite(value) else f"{value:.{digits}f}"


def x_practical(case, view: str, side: str = "cand") -> float | None:
    """Time / practical floor of one side in one view: the floors' record, else the older roofline's."""
    value = (case.floors.get(view) or {}).get(f"{side}_x_practical")
    if isinstance(value, (int, float)) and value > 0:
        return float(value)
    fraction = (case.roofline.get(view) or {}).get(f"{side}_fraction")  # practical / time
    return 1.0 / fraction if isinstance(fraction, (int, float)) and fraction > 0 else None


def _timed(verdict: Verdict | None, band: str | None = None) -> list:
    cases = verdict.timed_cases() if verdict else []
    return [c for c in cases if c.timings and (band in (None, "all") or c.band == band)]


def shape_table(verdict: Verdict | None, band: str | None = None, limit: int = 40) -> str:
    """One row per timed shape and view: the original's and the best's medians, the speedup, the
    physical and practical floors, and both sides' time over the practical floor."""
    cases = _timed(verdict, band)
    if not cases:
        return "no timed shapes (a build-only run, or no verdict yet)"
    lines = ["shape | band | view | original us | best us | speedup | physical floor us | practical floor us | "
             "original x practical | best x practical"]
    for case in cases[:limit]:
        for view in (v for v in ("graph", "cold") if v in case.timings):
            floor = case.floors.get(view) or {}
            lines.append(" | ".join([
                case.id, case.band, view, _num(case.median_us(view, "orig")), _num(case.median_us(view, "cand")),
                _num(case.speedup(view), 3), _num(floor.get("physical_us")), _num(floor.get("practical_us")),
                _num(x_practical(case, view, "orig")), _num(x_practical(case, view, "cand"))]))
    if len(cases) > limit:
        lines.append(f"... and {len(cases) - limit} more shapes")
    return "\n".join(lines)


def band_headroom(verdict: Verdict | None, view: str = "graph") -> dict[str, float]:
    """Per band, the geomean of the best's time over its practical floor in `view`."""
    out = {}
    for band in BANDS:
        values = [x for c in _timed(verdict, band) if (x := x_practical(c, view)) is not None]
        if values:
            out[band] = geomean(values)
    return out


def bands_present(verdict: Verdict | None) -> list[str]:
    """The bands a plan may target: those with timed shapes, then "all"."""
    found = {c.band for c in _timed(verdict)}
    return [b for b in BANDS if b in found] + ["all"]


def furthest_band(verdict: Verdict | None) -> tuple[str, float | None]:
    """The band furthest above its practical floor (graph view, else cold), with that geomean; ("all", None)
    when no band has a floor."""
    for view in ("graph", "cold"):
        headroom = band_headroom(verdict, view)
        if headroom:
            band = max(headroom, key=headroom.get)
            return band, headroom[band]
    return "all", None


def band_table(verdict: Verdict | None) -> str:
    """Per band and view: shapes, the best's geomean speedup over the original, its time over the
    practical floor (geomean and worst) and the microseconds above that floor, summed."""
    lines = ["band | view | shapes | best speedup vs original | best x practical (geomean) | worst | "
             "us above practical (sum)"]
    for band in BANDS:
        cases = _timed(verdict, band)
        for view in ("graph", "cold"):
            rows = [c for c in cases if view in c.timings]
            if not rows:
                continue
            xs = [x for c in rows if (x := x_practical(c, view)) is not None]
            above = [c.median_us(view, "cand") - c.floors[view]["practical_us"] for c in rows
                     if (c.floors.get(view) or {}).get("practical_us") is not None]
            speedup = (verdict.band_speedups.get(view) or {}).get(band)
            lines.append(" | ".join([band, view, str(len(rows)), _num(speedup, 3), _num(geomean(xs) if xs else None),
                                     _num(max(xs) if xs else None), _num(sum(above) if above else None)]))
    return "\n".join(lines) if len(lines) > 1 else "no timed shapes"


def band_shapes(verdict: Verdict | None, band: str) -> str:
    """The shapes of the target band, one line each: the best's graph (else cold) time and x practical."""
    lines = []
    for case in _timed(verdict, band):
        view = "graph" if "graph" in case.timings else "cold"
        lines.append(f"- {case.id} ({view}: {_num(case.median_us(view, 'cand'))} us, "
                     f"x{_num(x_practical(case, view))} practical)")
    return "\n".join(lines) or "no timed shapes in this band"


def speedups_text(verdict: Verdict | None) -> str:
    parts = []
    for view, bands in (verdict.band_speedups if verdict else {}).items():
        parts.append(f"{view}: " + ", ".join(f"{b} x{v:.3f}" for b, v in bands.items()
                                             if isinstance(v, (int, float)) and math.isfinite(v)))
    return "; ".join(parts) or "no speedups measured"


def resources_text(verdict: Verdict | None, limit: int = 8) -> str:
    """ptxas per compiled kernel of the measured side (the candidate's, or the original's in a self-check)."""
    builds = verdict.builds if verdict else []
    side = "cand" if any(b.get("side") == "cand" and b.get("resources") for b in builds) else "orig"
    lines = []
    for build in (b for b in builds if b.get("side") == side):
        for r in build.get("resources") or []:
            lines.append(f"{build.get('variant', '')} {one_line(r.get('name'), 120)}: {r.get('registers')} registers, "
                         f"spills {r.get('spill_stores')} B stored / {r.get('spill_loads')} B loaded, stack "
                         f"{r.get('stack_frame')} B, static smem {r.get('smem')} B, {r.get('barriers')} barriers")
    return "\n".join(lines[:limit]) or "no ptxas report in the verdict"


def failures_text(failures: list[dict]) -> str:
    """The last candidates not accepted, newest last: idea, status, why, the verdict's reason, details."""
    if not failures:
        return "none: no candidate has been rejected yet"
    out = []
    for item in failures:
        said = f"{item.get('status')}; {item.get('why')}"
        out.append(f"- candidate #{item.get('n')} (round {item.get('round', 0) + 1}) \"{item.get('idea')}\": {said}")
        if item.get("reason") and item["reason"] not in said:
            out.append(f"  reason: {item['reason']}")
            said += item["reason"]
        if item.get("bands"):
            out.append("  graph speedup per band: " + ", ".join(f"{b} x{v:.3f}" for b, v in item["bands"].items()))
        out.extend(f"    {line}" for line in item.get("details") or [] if line not in said)
    return "\n".join(out)


def history_text(history: list, ideas: dict[int, str], limit: int = 12) -> str:
    """What was tried, newest last, by idea: status, score (graph geomean; 0 = not verified), outcome."""
    if not history:
        return "nothing tried yet"
    out = []
    for h in history[-limit:]:
        bands = ", ".join(f"{b} x{v:.3f}" for b, v in (h.bands or {}).items()) if h.status == "correct" else ""
        out.append(f"- #{h.n} round {h.round + 1}: \"{ideas.get(h.n, h.name)}\" -> {h.status}, score "
                   f"{h.score:.3f}, {'accepted' if h.accepted else 'rejected'}: {one_line(h.why, 300)}"
                   + (f" (graph per band: {bands})" if bands else ""))
    return "\n".join(out)


@dataclass
class Plan:
    """A planner's answer, checked: the band the round targets and the idea the coder implements. The LLM
    planner fills one per round; the offline planner (astra.optimize.planning) one per rewrite pass it
    orders, naming the pass in `step` and the symptom's evidence in `rationale`. The run keeps both kinds
    in its history (rundir.RoundPlan)."""

    band: str = "all"
    idea: str = ""
    expected_speedup: float | None = None
    risk: str = ""
    stop: bool = False
    rationale: str = ""  # why it stopped; for a planned pass, the evidence it rests on
    notes: list[str] = field(default_factory=list)  # what was wrong with the reply and what was done instead
    step: str = ""  # the proposal that carries the idea out, where a rule chose one ("pass:vectorize")

    def to_dict(self) -> dict:
        return asdict(self)


def parse_plan(text: str, verdict: Verdict | None) -> Plan:
    """The plan in a reply; a band not among the verdict's falls back to the band furthest above its
    practical floor, and every repair is named in `notes`."""
    data = json_block(text)
    plan = Plan()
    if not isinstance(data, dict):
        plan.notes.append("the plan was not the JSON object asked for; its text is the idea")
        data = {}
    if data.get("stop") is True:
        return Plan(stop=True, rationale=str(data.get("rationale") or data.get("idea") or ""))
    idea = data.get("idea")
    if not isinstance(idea, str) or not idea.strip():
        if data:
            plan.notes.append("the plan named no idea; its text is the idea")
        idea = text
    plan.idea = idea.strip()
    choices = bands_present(verdict)
    band = data.get("band")
    if isinstance(band, str) and band.strip().lower() in choices:
        plan.band = band.strip().lower()
    else:
        plan.band, headroom = furthest_band(verdict)
        where = (f"the band furthest above its practical floor (x{headroom:.2f} geomean)" if headroom
                 else "every shape (no band has a measured floor)")
        asked = f"band {band!r}" if band is not None else "no band"
        plan.notes.append(f"the plan gave {asked}, not one of {', '.join(choices)}; targeting {plan.band}, {where}")
    speedup = data.get("expected_speedup")
    if isinstance(speedup, (int, float)) and not isinstance(speedup, bool) and 0 < speedup < 100:
        plan.expected_speedup = float(speedup)
    elif speedup is not None:
        plan.notes.append(f"expected_speedup {one_line(speedup, 40)!r} is not a positive number; ignored")
    plan.risk = one_line(data.get("risk") or "", 600)
    return plan


def plan_text(plan: Plan) -> str:
    """The plan as the coder reads it."""
    lines = [f"Target band: {plan.band}", f"Idea: {plan.idea}"]
    if plan.expected_speedup is not None:
        lines.append(f"Expected speedup on the target band: x{plan.expected_speedup:.3f}")
    if plan.risk:
        lines.append(f"Risk to watch: {plan.risk}")
    lines.extend(f"Note: {note}" for note in plan.notes)
    return "\n".join(lines)


def parse_profile(text: str) -> dict:
    """The profiling role's JSON object ({band: {bottleneck, evidence, ...}, ...}), or the raw text with a note."""
    data = json_block(text)
    if isinstance(data, dict) and data:
        return {"parsed": data}
    return {"raw": text.strip()[:4000], "note": "the profiling reply was not the JSON object asked for"}


def profile_text(profile: dict) -> str:
    if "parsed" in profile:
        return json.dumps(profile["parsed"], indent=2, ensure_ascii=False)
    return f"({profile['note']}; its text as written follows)\n{profile['raw']}"


def slug(text: str, limit: int = 48) -> str:
    """A name-safe short form of an idea: lower case words joined by dashes."""
    words = re.sub(r"[^a-z0-9]+", "-", text.lower()).strip("-")
    return words[:limit].rstrip("-") or "change"
