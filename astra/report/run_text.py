"""Terminal text of optimize runs: one run's trajectory and best (`astra show`), the list (`astra runs`)."""

from __future__ import annotations

from pathlib import Path

from astra import input_files, paths
from astra.errors import AstraError, RunStateError
from astra.optimize.baseline_store import origin_text
from astra.optimize.loop import band_summary, band_wins_line
from astra.optimize.rundir import HistoryEntry, RoundPlan, RunDir, RunState, list_runs, per_hour
from astra.report import table
from astra.text import one_line, printable


def _reason(err: AstraError) -> str:
    return one_line(getattr(err, "reason", None) or str(err), 80)


def summary(run: RunDir) -> str:
    state = run.state()
    best = run.candidate(state.best)[2] if state.best else None
    rows = [[h.n, h.round, one_line(h.name, 60), h.status, h.score or None, "yes" if h.accepted else "",
             one_line(h.why, 60)] for h in state.history]
    out = [table.render(["#", "round", "change", "verdict", "x (graph, all)", "kept", "why"], rows)]
    if best:
        bands = band_summary(best)
        out.append("best: #%03d %s; speedup per band (graph): %s" % (
            state.best, one_line(run.candidate(state.best)[1].get("description", ""), 120),
            ", ".join(f"{b} x{v:.3f}" for b, v in bands.items())))
    else:
        out.append("best: the original (no candidate was verified faster)")
    out.append(printable(band_wins_line(run)))
    planned = plans_text(state)
    if planned:
        out.append(planned)
    origin = origin_text(state.baseline_origin)
    if origin:
        out.append(printable(origin))
    out.append(throughput_line(state))
    out.append(f"stopped: {one_line(state.stopped)}; tokens {state.tokens}, cost ${state.cost_usd:.4f}; run directory {run.root}")
    return "\n".join(out)


def round_plans(state: RunState) -> list[tuple[RoundPlan, list[HistoryEntry]]]:
    """Each recorded round plan with the candidates that carried it out: the round's rewrite passes
    (`pass:<name>`) where the plan names steps, else (an LLM planner's idea) every candidate of the round."""
    out = []
    for record in sorted(state.plans, key=lambda r: r.round):
        steps = {p.get("step") for p in record.plans if p.get("step")}
        entries = [h for h in state.history if h.round == record.round
                   and (h.name.startswith("pass:") if steps else True)]
        out.append((record, entries))
    return out


def symptom_line(symptom: dict) -> str:
    return one_line(f"{symptom.get('band')}: {symptom.get('id')}: {symptom.get('evidence')} ({symptom.get('source')})", 300)


def step_line(plan: dict, number: int | None = None) -> str:
    """One plan step: the pass (or the idea), the band, the expected speedup, why, and what became of it."""
    expected = plan.get("expected_speedup")
    head = (f"{number}. " if number is not None else "") + f"{plan.get('step') or 'idea'} [{plan.get('band')}] {plan.get('idea')}"
    parts = [head + (f" (expected x{expected:.2f})" if isinstance(expected, (int, float)) else "")]
    if plan.get("rationale"):
        parts.append(f"because {plan['rationale']}")
    parts += list(plan.get("notes") or [])
    return one_line("; ".join(parts), 400)


def plans_text(state: RunState) -> str:
    """Per round: the profile's symptoms, the plan in order, the passes applied with their verdicts."""
    out = []
    for record, entries in round_plans(state):
        out.append(f"round {record.round} ({printable(record.agent)}, profiled: {printable(record.base)}):")
        out += [f"  symptom {symptom_line(s)}" for s in record.symptoms] or ["  symptoms: none found"]
        out += [f"  original's symptom {symptom_line(s)}" for s in record.original_symptoms]
        out += [f"  plan {step_line(p, i)}" for i, p in enumerate(record.plans, 1)] or ["  plan: no step"]
        out += [f"  note {one_line(n, 300)}" for n in record.notes]
        out += [f"  applied #{h.n:03d} {one_line(h.name, 60)}: {h.status}, x{h.score:.3f}"
                + (", kept" if h.accepted else "") for h in entries] or ["  applied: none"]
    return "\n".join(out)


def throughput_line(state: RunState) -> str:
    """'judged 12 candidate(s) in 30.5 min of run time: 23.6 per hour' (a run made before runs recorded
    their time says so)."""
    judged = state.judged()
    rate = per_hour(judged, state.wall_s)
    if rate is None:
        return f"judged {judged} candidate(s); run time not recorded"
    return f"judged {judged} candidate(s) in {state.wall_s / 60:.1f} min of run time: {rate:.1f} per hour"


def readable_run(root: Path) -> RunDir:
    """The run at `root` once its state.json is a regular file of bounded size (astra.input_files): a FIFO
    would block the command, a link to /dev/zero read until memory runs out. Else a RunStateError (exit 14)."""
    try:
        input_files.check_file(root / "state.json", input_files.RECORD_BYTES, what="a run's state")
    except input_files.Refused as err:
        problem = RunStateError(f"run {root.name}: {root / 'state.json'} is unreadable ({err.why}); the run cannot "
                                "be shown or resumed; start a new one")
        problem.reason = err.why
        raise problem from None
    return RunDir(root)


def runs_table() -> str | None:
    """A table of every run under $ASTRA_HOME/runs, or None when there is none."""
    names = list_runs()
    if not names:
        return None
    rows = []
    for name in names:
        try:
            s = readable_run(paths.sub("runs") / name).state()
        except AstraError as err:
            rows.append([name, "-", "-", "-", "-", "-", f"unreadable: {_reason(err)}"])
            continue
        rows.append([name, printable(s.kernel), printable(s.agent), len(s.history), s.best or "-",
                     round(s.best_score, 3) if isinstance(s.best_score, (int, float)) else "-",
                     one_line(s.stopped, 80) if s.stopped else "running"])
    return table.render(["run", "kernel", "agent", "candidates", "best", "x", "state"], rows)
