"""The optimize loop: rounds of propose (plan + code), test, profile; keep only what verified.

Every candidate is judged against the ORIGINAL kernel (never against the moving best), in its own
worker. A candidate becomes the base for later rounds only when `harness.judge.acceptance.improves_on` says
so: verified faster than the original (the one rule the patch emitter and recheck also use) and
better than the current best. A failed or
slower candidate is recorded and forgotten. The run stops on: rounds, wall time, tokens or cost,
reaching the roofline target, no progress for `patience` rounds, or an agent with nothing to try.
Roles differ by agent (offline search, LLM, a command), not by this loop.

The seams: an `Agent` (this module's protocol; built complete by astra.optimize.agent_registry) proposes
`Proposal`s from a `Context`; an `Evaluator` (astra.optimize.evaluator) judges them; the run's `RunState`
is held in memory by the `RunDir` and saved at each checkpoint (every verdict, every round's end, the stop).
With a `BaselineStore` (astra.optimize.baseline_store), the original's baseline is taken from an earlier run
when nothing that decides it changed, and stored when this run times it; the state records which.
"""

from __future__ import annotations

import hashlib
import math
import time
from dataclasses import asdict, dataclass, field, replace
from typing import Callable, Protocol

from astra.errors import AstraError, BudgetSpent
from astra.optimize.baseline_store import BaselineStore
from astra.optimize.evaluator import Evaluator
from astra.optimize.rundir import HistoryEntry, RoundPlan, RunDir, RunState
from astra.text import one_line
from harness import Verdict, improves_on, score
from harness.judge.acceptance import BAND_GAIN
from harness.worker.children import stop_reason

Events = Callable[[str, dict], None]  # (kind, data): progress display


@dataclass
class Proposal:
    """One candidate an agent proposes: the loop's unit (registered, judged, kept or forgotten)."""

    name: str  # stable id, e.g. "const:kNumThreads=512"
    family: str  # launch | bounds | unroll | restrict | fastmath | pdl | remat | param | llm | exec
    description: str
    source: str  # the whole new file


@dataclass
class Budget:
    rounds: int = 5
    wall_s: float = 3600.0
    tokens: int | None = None
    cost_usd: float | None = None
    roofline_target: float = 0.95  # stop once every timed shape reaches this fraction (graph mode)
    patience: int = 2  # rounds without an accepted candidate


@dataclass
class Context:
    """What an agent sees each round. Budgets left are real numbers (None: that budget is not set)."""

    kernel: str
    round: int
    base_source: str  # the best verified source so far (the original at first)
    base_verdict: Verdict | None  # its verdict against the original (the baseline self-check at first)
    history: list[HistoryEntry] = field(default_factory=list)
    original_source: str = ""
    best_n: int | None = None  # candidate number of base_source (None: the original)
    failures: list[dict] = field(default_factory=list)  # the last candidates not accepted (astra.optimize.feedback)
    rounds_left: int | None = None  # after this one
    wall_left_s: float | None = None
    tokens_left: int | None = None
    cost_left_usd: float | None = None
    run_dir: str = ""  # the run's directory (agents that write files put them under it)

    def budget_text(self) -> str:
        parts = [f"round {self.round + 1}, {self.rounds_left} more after this one" if self.rounds_left is not None
                 else f"round {self.round + 1}"]
        if self.wall_left_s is not None:
            parts.append(f"{self.wall_left_s / 60:.1f} min of wall time left")
        if self.tokens_left is not None:
            parts.append(f"{self.tokens_left} tokens left")
        if self.cost_left_usd is not None:
            parts.append(f"${self.cost_left_usd:.2f} left")
        return "; ".join(parts)


class Agent(Protocol):
    """Everything the loop uses of an agent. An agent is complete when its constructor returns (whatever it
    judges with, its client, its budgets: astra.optimize.agent_registry builds each); a class that
    subclasses this protocol inherits the defaults below (no rationale yet, nothing spent)."""

    name: str  # the run's agent: "offline", "llm:<model>", "exec:<command's first word>"
    rationale: str = ""  # one line: why this round's proposals (shown with each candidate)
    plan: RoundPlan | None = None  # this round's symptoms and plan, set anew by each `propose` (None: none kept)

    def propose(self, ctx: Context) -> list[Proposal]:
        """Candidates to try this round (whole files); empty when there is nothing left to try."""
        ...

    def usage(self) -> tuple[int, float]:
        """(tokens, cost in USD) this agent spent so far; the loop adds what a resumed run spent before."""
        return 0, 0.0


def source_id(source: str) -> str:
    """The identity of a source text in a run's history (which base a proposal was made on)."""
    return hashlib.sha256(source.encode()).hexdigest()


def at_roofline(verdict: Verdict | None, target: float, mode: str = "graph") -> bool:
    fractions = [c.roofline.get(mode, {}).get("cand_fraction") for c in (verdict.cases if verdict else [])
                 if c.timed]
    fractions = [f for f in fractions if f is not None]
    return bool(fractions) and min(fractions) >= target


def run_loop(run: RunDir, agent: Agent, evaluator: Evaluator, budget: Budget,
             events: Events = lambda kind, data: None, baselines: BaselineStore | None = None) -> RunState:
    """Rounds until a stop reason; whatever ends the loop (an error, Ctrl-C) is written to the state, so a
    run is never left "running". Tokens and cost add to what the run spent before a resume. The state is
    the run directory's, in memory; the loop saves it at each checkpoint. `baselines`: where the original's
    baseline is looked up and stored (None: timed by every run, as it was before the store)."""
    state = run.state()
    try:
        return _rounds(run, state, agent, evaluator, budget, events, baselines)
    except KeyboardInterrupt as stop:  # Ctrl-C, SIGTERM or SIGHUP (harness.worker.children)
        _died(run, state, stop_reason(stop), events)
        raise
    except BaseException as err:
        _died(run, state, f"failed: {type(err).__name__}: {one_line(err, 300)}", events)
        raise


def _died(run: RunDir, state: RunState, reason: str, events: Events) -> None:
    if state.stopped is None:
        state.stopped = reason
        run.save(state)
        events("stopped", {"reason": reason})


def mark_stopped(run: RunDir, reason: str) -> None:
    """Record why a run ended outside the loop (set-up failed, interrupted); a recorded reason is kept."""
    try:
        state = run.state()
    except AstraError:
        return
    if state.stopped is None:
        state.stopped = reason
        run.save(state)


def _rounds(run: RunDir, state: RunState, agent: Agent, evaluator: Evaluator, budget: Budget,
            events: Events, baselines: BaselineStore | None = None) -> RunState:
    start = time.time()
    before = (state.tokens, state.cost_usd)  # spent by earlier sessions of this run

    def spent() -> tuple[int, float]:
        tokens, cost = agent.usage()
        return before[0] + tokens, before[1] + cost

    best_verdict = run.candidate(state.best)[2] if state.best else None
    if best_verdict is None:
        best_verdict = _baseline(run, evaluator, baselines, events)
        warning = floor_warning(best_verdict)
        if warning:
            events("warning", {"message": warning})
    idle_rounds = 0
    durations: list[float] = []  # seconds each verification of this session took: none starts that cannot end in time

    def out_of_time() -> bool:
        return time.time() - start + max(durations, default=0.0) > budget.wall_s

    while state.stopped is None:
        reason = _stop_reason(state, spent(), budget, start, idle_rounds, best_verdict)
        if reason is None and durations and out_of_time():
            reason = _short_of_time(budget, start, durations)
        if reason:
            state.stopped = reason
            break
        ctx = _context(run, state, best_verdict, budget, spent(), start)
        try:
            proposals = agent.propose(ctx)
        except AstraError as err:  # an unreachable endpoint, a wrong key, a spent budget: keep what verified
            state.tokens, state.cost_usd = spent()
            state.stopped = f"stopped by the agent: {err}"
            run.save(state)
            events("stopped", {"reason": state.stopped})
            if isinstance(err, BudgetSpent):
                return state
            raise
        if agent.plan is not None:  # the plan goes into the history before its candidates are judged
            planned = replace(agent.plan, round=state.round, agent=agent.name)
            state.plans = [p for p in state.plans if p.round != state.round] + [planned]
            run.save(state)
        if not proposals:
            state.stopped = "the agent has nothing left to try"
            break
        improved = False
        base = source_id(ctx.base_source)

        def register(proposal: Proposal) -> int:
            n = run.add_candidate(proposal.source, {"name": proposal.name, "family": proposal.family,
                                                    "description": proposal.description, "round": state.round})
            events("candidate", {"n": n, "name": proposal.name, "description": proposal.description,
                                "rationale": agent.rationale})
            return n

        judged = 0
        for n, proposal, verdict in _evaluated(evaluator, proposals, register, out_of_time, durations):
            judged += 1
            run.save_verdict(n, verdict)
            decision = improves_on(verdict, best_verdict if state.best else None)
            ok = decision.ok
            state.history.append(HistoryEntry(n=n, round=state.round, name=proposal.name, base=base,
                                              status=verdict.status, score=score(verdict), accepted=ok,
                                              why=decision.reason, bands=band_summary(verdict)))
            if ok:
                state.best, state.best_score, best_verdict, improved = n, score(verdict), verdict, True
            state.tokens, state.cost_usd = spent()
            run.save(state)
            events("verdict", asdict(state.history[-1]))
        idle_rounds = 0 if improved else idle_rounds + 1
        state.round += 1
        if judged < len(proposals) and out_of_time():
            # the time ran out before this round's last proposals (a search's survivors among them): say so,
            # rather than "no progress" on what was never judged
            state.stopped = _short_of_time(budget, start, durations, len(proposals) - judged)
        run.save(state)
    state.tokens, state.cost_usd = spent()
    run.save(state)
    events("stopped", {"reason": state.stopped})
    return state


def _short_of_time(budget: Budget, start: float, durations: list[float], unjudged: int = 0) -> str:
    left = max(0.0, budget.wall_s - (time.time() - start))
    said = (f"wall-time budget of {budget.wall_s:.0f}s: {left:.0f}s left, less than a verification takes "
            f"({max(durations):.0f}s, the longest this session)" if durations
            else f"wall-time budget of {budget.wall_s:.0f}s spent")  # spent on proposing, before any verification
    return said + (f"; {unjudged} proposal(s) of the last round not judged" if unjudged else "")


def _evaluated(evaluator: Evaluator, proposals: list[Proposal], register: Callable[[Proposal], int],
               out_of_time: Callable[[], bool], durations: list[float] | None = None):
    """(n, proposal, verdict) in proposal order, each registered (`register`: numbered, saved) just before
    its evaluation. An evaluator with `gpus` (the host's GPU indices) judges a round's candidates side by
    side, one per GPU (`verify(..., gpu=i)`), in batches of that many; otherwise one at a time. No batch
    starts once `out_of_time()` (the loop's: the wall budget cannot hold another verification as
    long as the longest so far, whose seconds are appended to `durations`)."""
    from concurrent.futures import ThreadPoolExecutor

    gpus = list(evaluator.gpus)
    width = max(1, len(gpus))
    for first in range(0, len(proposals), width):
        if out_of_time():  # the agent's proposing (a search, an exec command) may have spent the rest
            return
        batch = [(register(p), p) for p in proposals[first:first + width]]
        began = time.time()
        if width == 1:
            verdicts = [evaluator.verify(p.source, p.name) for _, p in batch]
        else:
            with ThreadPoolExecutor(max_workers=len(batch)) as pool:
                verdicts = list(pool.map(lambda item: evaluator.verify(item[1][1].source, item[1][1].name,
                                                                       gpu=gpus[item[0]]), enumerate(batch)))
        if durations is not None:
            durations.append(time.time() - began)
        for (n, proposal), verdict in zip(batch, verdicts):
            yield n, proposal, verdict


def _context(run: RunDir, state: RunState, best: Verdict | None, budget: Budget, spent: tuple[int, float],
             start: float) -> Context:
    from astra.optimize.feedback import recent_failures

    tokens, cost = spent
    return Context(state.kernel, state.round, run.best_source(), best, state.history,
                   original_source=run.original(), best_n=state.best, failures=recent_failures(run, state.history),
                   rounds_left=max(0, budget.rounds - state.round - 1),
                   wall_left_s=max(0.0, budget.wall_s - (time.time() - start)),
                   tokens_left=None if budget.tokens is None else max(0, budget.tokens - tokens),
                   cost_left_usd=None if budget.cost_usd is None else max(0.0, budget.cost_usd - cost),
                   run_dir=str(run.root))


def floor_warning(baseline: Verdict) -> str | None:
    """What to tell the user when the original itself times under its physical floor on some case: the
    spec's bytes overcount there (a kernel cannot beat physics), and the judge will refuse as `suspect` any
    candidate as fast as the original on that case. None when every case is above its floor."""
    under = [c for c in baseline.cases if c.timed and c.suspect]
    if not under:
        return None
    timed = sum(1 for c in baseline.cases if c.timed)
    first = under[0].suspect[0].replace("candidate", "the original", 1)
    said = (f"the original itself runs under its physical floor on {len(under)} of {timed} timed case(s) "
            f"({under[0].id}: {first}): ")
    if "through DRAM" in first:
        return said + ("the spec's bytes overcount there, so a candidate as fast as the original is refused as "
                       "suspect on them. Correct the spec's bytes (bytes, bytes_read/bytes_written, "
                       "docs/spec-format.md) and probe it again")
    return said + ("a candidate as fast as the original is refused as suspect on them. The floor is the GPU's "
                   "own measurement (an empty launch, a speedup bound): time it again with `astra bench`")


def _baseline(run: RunDir, evaluator: Evaluator, baselines: BaselineStore | None = None,
              events: Events = lambda kind, data: None) -> Verdict:
    """The original against itself: the profile the first round plans from (kept, not a candidate;
    a resumed run reuses it). With `baselines`, a stored one of the same identity (the evaluator's, and the
    original's text) is taken instead of timing, and one this run times is stored; the run's state records
    where its baseline came from (`baseline_origin`). A "baseline" event says which, before any timing."""
    saved = run.baseline()
    if saved is not None:
        return saved
    identity, why = None, ""
    if baselines is not None:
        identity = evaluator.baseline_identity()
        if identity is None:
            why = "the evaluator names no GPU"
        else:
            identity = {**identity, "original": source_id(run.original())}
            stored, why = baselines.lookup(identity)
            if stored is not None:
                run.save_baseline(stored.verdict)
                _record_origin(run, stored.origin())
                events("baseline", stored.origin())
                return stored.verdict
    events("baseline", {"how": "timing", "why": why} if why else {})
    verdict = evaluator.verify(run.original(), "original")
    run.save_baseline(verdict)
    if baselines is not None:
        path, note = (baselines.save(identity, verdict, run.root.name, run.state().kernel) if identity is not None
                      else (None, why))
        _record_origin(run, {"how": "timed", "timed_at": time.time(), "gpu": verdict.env.get("gpu") or "",
                             "file": str(path) if path else "", "note": note,
                             "why": why if identity is not None else ""})
    return verdict


def _record_origin(run: RunDir, origin: dict) -> None:
    state = run.state()
    state.baseline_origin = origin
    run.save(state)


def _stop_reason(state: RunState, spent: tuple[int, float], budget: Budget, start: float, idle: int,
                 best: Verdict | None) -> str | None:
    tokens, cost = spent
    if state.round >= budget.rounds:
        return f"{budget.rounds} round(s) done"
    if time.time() - start > budget.wall_s:
        return f"wall-time budget of {budget.wall_s:.0f}s spent"
    if budget.tokens is not None and tokens >= budget.tokens:
        return f"token budget of {budget.tokens} spent"
    if budget.cost_usd is not None and cost >= budget.cost_usd:
        return f"cost budget of ${budget.cost_usd:.2f} spent"
    if idle >= budget.patience:
        return f"no progress in {idle} round(s)"
    if state.best is not None and at_roofline(best, budget.roofline_target):
        return f"every timed shape at >= {budget.roofline_target:.0%} of roofline"
    return None


def band_wins(verdict: Verdict | None, mode: str = "graph") -> dict[str, float]:
    """Bands a correct candidate speeds up beyond their noise band (and by at least BAND_GAIN) with no
    shape of that band slower in any mode: a verified improvement there even when the candidate is
    slower elsewhere (and so not the base), the evidence for dispatching on shape."""
    from harness.judge.acceptance import faster_bands

    if score(verdict, mode) == 0.0:
        return {}
    band_of = {case.id: case.band for case in verdict.cases}
    slowed = {band_of.get(s["id"]) for s in verdict.slower_shapes}
    return {band: value for band, value in faster_bands(verdict, mode).items()
            if band != "all" and band not in slowed and value >= 1.0 + BAND_GAIN}


def band_summary(verdict: Verdict | None, mode: str = "graph") -> dict[str, float]:
    bands = (verdict.band_speedups.get(mode) or {}) if verdict else {}
    return {b: v for b, v in bands.items() if isinstance(v, (int, float)) and math.isfinite(v)}


def band_leaders(run: RunDir) -> dict[str, tuple[int, str, float]]:
    """Per band, the candidate with the largest verified band-only win (`band_wins`):
    {band: (candidate number, description, geomean speedup)}."""
    leaders: dict[str, tuple[int, str, float]] = {}
    for entry in run.state().history:
        if entry.status != "correct":
            continue
        _, meta, verdict = run.candidate(entry.n)
        for band, value in band_wins(verdict).items():
            if value > leaders.get(band, (0, "", 0.0))[2]:
                leaders[band] = (entry.n, meta.get("description", entry.name), value)
    return leaders


def band_wins_line(run: RunDir) -> str:
    leaders = band_leaders(run)
    if not leaders:
        return (f"per band: no candidate was verified faster on any band ({100 * BAND_GAIN:g}% or more, beyond "
                "noise, no shape of the band slower)")
    return "per band, verified faster with no shape of the band slower (graph geomean vs the original): " + "; ".join(
        f"{band} #{n:03d} {desc} x{value:.3f}" for band, (n, desc, value) in leaders.items())
