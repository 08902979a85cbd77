"""The optimize loop's rules, with an evaluator written here (CI has no GPU; the harness evaluator
runs in the gpu-marked tests). Candidate sources carry a marker that the evaluator reads as its
'measurement', so every rule is exercised deterministically."""

import re

import pytest

from astra.optimize.evaluator import Evaluator
from astra.optimize.loop import Agent, Budget, Proposal, run_loop
from astra.optimize.rundir import RunDir
from harness import improves_on, score
from tests.verdicts import make_verdict


def verdict(status="correct", all_=1.0, decode=None, slower=()):
    speedups = {"decode": decode or all_, "prefill": [all_] + [0.9 for _ in slower]}
    return make_verdict(speedups, status=status)


def evaluator(source: str, label: str):
    marks = list(re.finditer(r"// measured: (\w+) ([\d.]+)(?: decode ([\d.]+))?( slower)?", source))
    if label == "original" or not marks:
        return verdict()
    m = marks[-1]  # the newest edit's measurement
    status, speed = m.group(1), float(m.group(2))
    return verdict(status, speed, float(m.group(3)) if m.group(3) else None, ("x",) if m.group(4) else ())


class ScriptedAgent(Agent):
    """Proposes the given rounds of (name, marker) in order; records what base it saw each round."""

    name = "scripted"

    def __init__(self, rounds):
        self.rounds = list(rounds)
        self.bases = []

    def usage(self):
        return 0, 0.0

    def propose(self, ctx):
        self.bases.append(ctx.base_source)
        if not self.rounds:
            return []
        return [Proposal(name, "test", name, ctx.base_source + f"\n// measured: {marker}")
                for name, marker in self.rounds.pop(0)]


@pytest.fixture
def run():
    return RunDir.create("demo", "0.5.23", "scripted", "// original kernel")


def test_only_verified_faster_candidates_become_the_base(run):
    agent = ScriptedAgent([
        [("wrong", "incorrect 3.0"), ("slower", "correct 0.8"), ("good", "correct 1.2")],
        [("regresses-a-shape", "correct 1.5 slower"), ("better", "correct 1.3")],
    ])
    state = run_loop(run, agent, Evaluator(evaluator), Budget(rounds=5, patience=3))
    names = {h.n: h.name for h in state.history}
    assert names[state.best] == "better"
    assert [h.accepted for h in state.history] == [False, False, True, False, True]
    assert "measured: correct 1.2" in agent.bases[1]  # round 2 started from the verified "good"
    assert "incorrect" not in agent.bases[1] and "0.8" not in agent.bases[1]
    assert state.stopped == "the agent has nothing left to try"
    assert run.best_source().endswith("// measured: correct 1.3")


def test_band_specific_improvement_is_kept(run):
    agent = ScriptedAgent([[("decode-only", "correct 1.0 decode 1.10")]])
    state = run_loop(run, agent, Evaluator(evaluator), Budget(rounds=1))
    assert state.best == 1 and "decode x1.100" in state.history[0].why


def test_no_progress_stops_and_resume_continues(run):
    agent = ScriptedAgent([[("a", "correct 0.9")], [("b", "correct 0.95")], [("c", "correct 1.5")]])
    state = run_loop(run, agent, Evaluator(evaluator), Budget(rounds=10, patience=2))
    assert state.stopped == "no progress in 2 round(s)" and state.best is None
    resumed = RunDir.open(run.root.name)
    s = resumed.state()
    s.stopped = None
    resumed.save(s)
    state = run_loop(resumed, agent, Evaluator(evaluator), Budget(rounds=10, patience=2))
    assert state.best == 3 and len(state.history) == 3
    assert (run.root / "baseline.json").exists()


def test_round_budget(run):
    agent = ScriptedAgent([[("a", "correct 1.1")]] * 5)
    state = run_loop(run, agent, Evaluator(evaluator), Budget(rounds=2, patience=5))
    assert state.round == 2 and state.stopped == "2 round(s) done"


def test_score_and_acceptance_rules():
    assert score(verdict("incorrect", 2.0)) == 0.0
    assert score(verdict("suspect", 9.0)) == 0.0
    decision = improves_on(verdict("correct", 1.005), None)
    assert not decision.ok and "not faster beyond noise" in decision.reason
    decision = improves_on(verdict("correct", 1.2, slower=("s",)), None)
    assert not decision.ok and "slower on 1 shape" in decision.reason


def test_quick_search_best_must_pass_the_full_suite(run):
    from astra.optimize.driver import confirm_best

    agent = ScriptedAgent([[("good-on-bf16", "correct 1.2")]])
    run_loop(run, agent, Evaluator(evaluator), Budget(rounds=1))
    assert run.state().best == 1

    def full_suite(source, label):  # the fp16 cases of the full suite fail
        return verdict("incorrect", 1.0)

    messages = []
    assert confirm_best(run, Evaluator(evaluator, full=full_suite), events=messages.append) is False
    state = run.state()
    assert state.best is None and state.history[-1].why.startswith("full suite: not verified: incorrect")
    assert "FAILED" in messages[0]


def band_verdict(decode, prefill, slower_band=None):
    speedups = {"decode": decode, "prefill": prefill}
    if slower_band:  # a second shape of that band, 5% slower in graph mode
        speedups[slower_band] = [speedups[slower_band], 0.95]
        verdict = make_verdict(speedups)
        band_of = {c.id: c.band for c in verdict.cases}
        assert {band_of[s["id"]] for s in verdict.slower_shapes} == {slower_band}
        return verdict
    return make_verdict(speedups)


def test_band_wins_need_the_gain_and_no_slower_shape_in_that_band():
    from astra.optimize.loop import band_wins

    assert band_wins(band_verdict(0.97, 1.05, slower_band="decode")) == {"prefill": 1.05}
    assert band_wins(band_verdict(1.05, 1.05, slower_band="prefill")) == {"decode": 1.05}
    assert band_wins(band_verdict(1.01, 1.019)) == {}  # under the 2% band gain
    assert band_wins(make_verdict({"decode": 1.2, "prefill": 1.2}, status="incorrect")) == {}


def test_summary_names_band_only_wins_and_says_when_there_are_none(run):
    from astra.optimize.loop import band_wins_line
    from astra.report.run_text import summary

    assert band_wins_line(run).startswith("per band: no candidate was verified faster on any band")
    measured = {"prefill-only": band_verdict(0.96, 1.04, slower_band="decode"),
                "noise": band_verdict(1.0, 1.01)}
    agent = ScriptedAgent([[("prefill-only", "correct 1.0"), ("noise", "correct 1.0")]])
    run_loop(run, agent, Evaluator(lambda src, label: measured.get(label, verdict())), Budget(rounds=1))
    text = summary(run)
    assert "best: the original" in text
    assert "per band, verified faster with no shape of the band slower" in text and "prefill #001" in text
    assert "x1.040" in text and "noise" not in text.split("per band")[1]


def test_a_round_is_judged_one_candidate_per_gpu_side_by_side(run):
    """An evaluator that names two GPUs gets the round's candidates two at a time, each on its own GPU;
    decisions still follow proposal order."""
    import threading
    import time as _time

    active, peak, seen = [0], [0], []
    lock = threading.Lock()

    def two_gpus(source, label, gpu=None):
        with lock:
            active[0] += 1
            peak[0] = max(peak[0], active[0])
            seen.append((label, gpu))
        _time.sleep(0.2)
        with lock:
            active[0] -= 1
        return evaluator(source, label)

    agent = ScriptedAgent([[("a", "correct 1.05"), ("b", "correct 1.20"), ("c", "incorrect 2.0")]])
    state = run_loop(run, agent, Evaluator(two_gpus, gpus=[0, 1]), Budget(rounds=1))
    assert peak[0] == 2
    assert sorted(gpu for label, gpu in seen if label != "original") == [0, 0, 1]
    assert [h.name for h in state.history] == ["a", "b", "c"] and state.best == 2


def test_no_verification_starts_that_the_wall_budget_cannot_hold(run):
    import time

    def slow(source: str, label: str):  # each candidate's verification takes 1 s; the baseline none
        if label != "original":
            time.sleep(1.0)
        return evaluator(source, label)

    agent = ScriptedAgent([[(f"c{i}", "correct 1.0") for i in range(5)]])
    state = run_loop(run, agent, Evaluator(slow), Budget(rounds=5, patience=3, wall_s=2.6))
    # the first ends near 1 s (a second one fits by 2 s), the second near 2 s: a third would end near
    # 3 s, past the 2.6 s budget, so it never starts (the old rule started it: 2 s < 2.6 s)
    assert [h.name for h in state.history] == ["c0", "c1"]
    assert "less than a verification takes" in state.stopped and "the longest this session" in state.stopped
    assert state.stopped.endswith("; 3 proposal(s) of the last round not judged")


def test_a_round_cut_short_by_time_says_so_not_no_progress(run):
    """With patience 1, a round whose last proposals the time left no room for ends the run on the time, not
    on "no progress": those proposals were never judged."""
    import time

    def slow(source: str, label: str):
        if label != "original":
            time.sleep(0.6)
        return evaluator(source, label)

    agent = ScriptedAgent([[("a", "correct 1.0"), ("b", "correct 1.3")]])
    state = run_loop(run, agent, Evaluator(slow), Budget(rounds=5, patience=1, wall_s=1.0))
    assert [h.name for h in state.history] == ["a"]
    assert state.stopped.startswith("wall-time budget of 1s") and "1 proposal(s) of the last round not judged" \
        in state.stopped


def test_an_original_under_its_own_floor_is_told_before_any_candidate(run):
    from astra.optimize.loop import floor_warning

    under = verdict("suspect")  # the harness's own reason on the original's baseline, first case
    under.cases[0].suspect[:] = ["graph: candidate 380 us is under the physical floor 424 us (1421869568 of "
                                 "1526727168 bytes through DRAM at 3.35 TB/s)"]
    said = floor_warning(under)
    assert "under its physical floor on 1 of" in said and "the original 380 us is under" in said
    assert "bytes_read/bytes_written" in said and under.cases[0].id in said
    assert floor_warning(verdict()) is None
    launch = verdict("suspect")  # not the spec's bytes: the GPU's empty launch
    launch.cases[0].suspect[:] = ["graph: candidate 1.2 us is under the physical floor of an empty launch, 2.1 us"]
    assert "bytes" not in floor_warning(launch) and "astra bench" in floor_warning(launch)

    events: list[tuple[str, dict]] = []
    state = run_loop(run, ScriptedAgent([[("same", "correct 1.0")]]),
                     Evaluator(lambda source, label: under if label == "original" else evaluator(source, label)),
                     Budget(rounds=1), events=lambda kind, data: events.append((kind, data)))
    kinds = [k for k, _ in events]
    assert kinds.index("warning") < kinds.index("candidate") and state.history[0].name == "same"


def test_a_round_whose_proposing_spent_the_time_says_what_was_not_judged(run):
    """The agent's proposing (a search, an exec command) spent the whole budget before any verification of this
    run: the run stops on the time, with the count of proposals never judged."""
    import time

    class SlowAgent(ScriptedAgent):
        def propose(self, ctx):
            time.sleep(0.6)
            return super().propose(ctx)

    agent = SlowAgent([[("a", "correct 1.2"), ("b", "correct 1.3")]])
    state = run_loop(run, agent, Evaluator(evaluator), Budget(rounds=5, wall_s=0.5))
    assert state.history == []
    assert state.stopped == "wall-time budget of 0s spent; 2 proposal(s) of the last round not judged"
