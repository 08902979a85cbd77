"""The planning agent: rules (data) map symptoms to rewrite passes in order; the offline agent tries the
planned passes first and the run keeps the plan in its history. The passes here are tiny fakes of the
rewrite-pass interface (astra.optimize.passes: name, family, apply -> PassResult); the numbers are SYNTHETIC."""

from __future__ import annotations

import sys
import types
from dataclasses import dataclass
from pathlib import Path

import pytest

from astra.errors import AstraError
from astra.optimize import planning
from astra.optimize.evaluator import Evaluator
from astra.optimize.loop import Budget, Context, run_loop
from astra.optimize.offline import OfflineAgent
from astra.optimize.profiling import BandFacts, Profile, ProfilingAgent, Symptom
from astra.optimize.rundir import RunDir
from astra.report import run_html, run_text
from tests.astra.optimize.test_profiling import SERIAL, verdict
from tests.verdicts import make_verdict

KNOWN_PASSES = {"vectorize", "reuse", "warp_reduce", "fast_math", "coarsen", "split", "parallelize", "launch_bounds",
                "fastdiv", "pdl_chain", "batch_loads"}


@dataclass(frozen=True)
class PassResult:
    applies: bool
    source: str | None
    reason: str


@dataclass
class FakePass:
    """A rewrite pass that appends a marker (or refuses, or raises), recording the spec it was given."""

    name: str
    family: str
    mode: str = "apply"  # apply | refuse | raise
    specs: list | None = None

    def apply(self, source: str, spec: dict | None = None) -> PassResult:
        if self.specs is not None:
            self.specs.append(spec)
        if self.mode == "raise":
            raise ValueError("no kernel found")
        if self.mode == "refuse":
            return PassResult(False, None, f"{self.name}: nothing to change")
        return PassResult(True, source + f"\n// {self.name}\n", f"{self.name}: done")


def profile(*symptoms: Symptom, **bands: tuple[float, float]) -> Profile:
    """A profile with bands {band: (x practical, us above)} and the given symptoms."""
    facts = {b: BandFacts(b, f"{b}0", 1, x, us) for b, (x, us) in bands.items()}
    return Profile("original", "0" * 64, facts, symptoms=list(symptoms))


def test_the_shipped_rules_load_and_name_only_known_passes():
    rules = planning.load_rules()
    assert len(rules) >= 10
    named = {p for r in rules for p in (*r.passes, *r.avoid)}
    assert named <= KNOWN_PASSES, named - KNOWN_PASSES
    assert {r.symptom for r in rules} >= {"few_ctas", "uncoalesced_loads", "block_reduce_small_row", "spills",
                                           "serial_loop", "scalar_memory", "launch_bound", "low_occupancy"}


def test_rules_order_the_passes_and_hold_back_what_a_symptom_forbids():
    few = Symptom("few_ctas", "decode", "grid of 4 CTA(s) x 64 threads on 132 SMs (0.03 waves)", "ncu")
    uncoalesced = Symptom("uncoalesced_loads", "prefill", "global loads use 25% of each 32-byte sector", "ncu")
    reduce = Symptom("block_reduce_small_row", "middle", "line 7: a block-wide reduction", "source")
    spills = Symptom("spills", "all", "k: ptxas spills 64 B stored", "ptxas")
    done = Symptom("uncoalesced_stores", "middle", "global stores use 50%", "ncu")
    prof = profile(few, uncoalesced, reduce, spills, done, decode=(2.0, 5.0), prefill=(1.5, 20.0), middle=(1.05, 1.0))
    plans, notes = planning.make_plan(prof, planning.load_rules())
    # priority 10 for all three; prefill has the most time above its floor; middle is near its floor: last
    assert [p.step for p in plans] == ["pass:vectorize", "pass:split", "pass:parallelize", "pass:warp_reduce"]
    assert plans[3].band == "middle" and plans[0].notes == ["also: middle: uncoalesced_stores: global stores use 50% (ncu)"]
    assert plans[0].band == "prefill" and plans[0].expected_speedup == 1.25
    assert plans[0].rationale == "prefill: uncoalesced_loads: global loads use 25% of each 32-byte sector (ncu)"
    assert plans[0].idea.startswith("vectorize: global load efficiency low")
    assert plans[1].band == plans[2].band == "decode" and "132 SMs" in plans[1].rationale
    assert "all: spills: spills: reuse off, lower unroll; anything that keeps more values live makes it worse" in notes
    assert any(n.startswith("pass:coarsen held back: all: spills") for n in notes)  # few_ctas asked for it


def test_a_pass_asked_for_twice_is_planned_once_with_the_second_reason_as_a_note():
    prof = profile(Symptom("uncoalesced_loads", "decode", "25% of each sector", "ncu"),
                   Symptom("scalar_memory", "prefill", "4.0 sectors per request", "ncu"),
                   decode=(2.0, 5.0), prefill=(1.5, 20.0))
    plans, _ = planning.make_plan(prof, planning.load_rules())
    assert [p.step for p in plans] == ["pass:vectorize", "pass:reuse"]
    assert plans[0].band == "decode" and plans[0].notes == ["also: prefill: scalar_memory: 4.0 sectors per request (ncu)"]


def test_rules_with_conditions_on_facts():
    by_registers = Symptom("low_occupancy", "decode", "22%", "ncu", {"limiter": "registers"})
    by_blocks = Symptom("low_occupancy", "decode", "22%", "ncu", {"limiter": "block size"})
    rules = planning.load_rules()
    plans, notes = planning.make_plan(profile(by_blocks, decode=(2.0, 5.0)), rules)
    assert plans == [] and any("more threads per CTA or more CTAs" in n for n in notes)  # advice, no pass
    plans, notes = planning.make_plan(profile(by_registers, decode=(2.0, 5.0)), rules)
    assert [p.step for p in plans] == ["pass:launch_bounds"]  # registers: fit them to the block size
    assert any(n.startswith("pass:reuse held back") for n in notes)


def test_a_wrong_rules_file_names_the_rule(tmp_path):
    path = tmp_path / "rules.yaml"
    path.write_text("rules:\n  - symptom: spills\n    expect: x\n  - symptom: few_ctas\n    expect: y\n    pases: [coarsen]\n")
    with pytest.raises(AstraError, match="rule 2: unknown key.s. pases"):
        planning.load_rules(path)
    path.write_text("rules:\n  - symptom: spills\n    expect: x\n    speedup: -1\n")
    with pytest.raises(AstraError, match="rule 1: `speedup` is a positive number"):
        planning.load_rules(path)
    path.write_text("- not a mapping\n")
    with pytest.raises(AstraError, match="no `rules:` list"):
        planning.load_rules(path)


def test_planned_proposals_apply_each_pass_in_order_and_say_why_not():
    prof = profile(Symptom("serial_loop", "all", "line 5: a loop only thread 0 runs", "source"),
                   Symptom("uncoalesced_loads", "decode", "25%", "ncu"),
                   Symptom("block_reduce_small_row", "decode", "line 9", "source"),
                   Symptom("transcendental_heavy", "decode", "12% XU", "ncu"), decode=(2.0, 5.0))
    plans, _ = planning.make_plan(prof, planning.load_rules())
    assert [p.step for p in plans] == ["pass:parallelize", "pass:vectorize", "pass:warp_reduce", "pass:fast_math"]
    specs: list = []
    catalog = {"parallelize": FakePass("parallelize", "parallelize", specs=specs),
               "vectorize": FakePass("vectorize", "vectorize", "refuse"),
               "warp_reduce": FakePass("warp_reduce", "reduce", "raise")}
    proposals = planning.planned_proposals(prof, plans, "// base\n", {"name": "demo"}, catalog)
    assert [(p.name, p.family) for p in proposals] == [("pass:parallelize", "parallelize")]
    assert proposals[0].source == "// base\n\n// parallelize\n" and specs == [{"name": "demo"}]
    assert proposals[0].description.startswith("parallelize: done (planned for all: all: serial_loop:")
    assert plans[1].notes == ["does not apply: vectorize: nothing to change"]
    assert plans[2].notes == ["the pass failed: ValueError: no kernel found"]
    assert plans[3].notes == ["no pass 'fast_math' in the catalog"]


def test_without_the_passes_package_the_catalog_is_empty_or_the_real_one():
    catalog = planning.pass_catalog()
    assert isinstance(catalog, dict) and set(catalog) <= KNOWN_PASSES


def test_ordered_puts_planned_first_and_drops_duplicates():
    from astra.optimize.loop import Proposal

    planned = [Proposal("pass:coarsen", "coarsen", "", "a"), Proposal("pass:vectorize", "vectorize", "", "b")]
    rest = [Proposal("const:kBlockSize=512", "launch", "", "c"), Proposal("pass:vectorize", "vectorize", "", "b")]
    assert [p.name for p in planning.ordered(planned, rest)] == ["pass:coarsen", "pass:vectorize", "const:kBlockSize=512"]


@pytest.fixture
def fake_passes(monkeypatch):
    """The rewrite-pass package as its interface promises it (PASSES, all_passes), with fake passes."""
    import astra.optimize

    specs: list = []
    module = types.ModuleType("astra.optimize.passes")
    module.PASSES = {"parallelize": FakePass("parallelize", "parallelize", specs=specs),
                     "vectorize": FakePass("vectorize", "vectorize"),
                     "reuse": FakePass("reuse", "reuse", "refuse"),
                     "fast_math": FakePass("fast_math", "fastmath")}
    module.all_passes = lambda: dict(module.PASSES)
    module.DEFAULT = ()  # the offline agent's own proposals of the default catalog: none here, the plan's only
    module.catalog = lambda headers, names=(): {}
    syntax = types.ModuleType("astra.optimize.passes.syntax")
    syntax.Headers = lambda *args: args
    module.syntax = syntax
    monkeypatch.setitem(sys.modules, "astra.optimize.passes.syntax", syntax)
    monkeypatch.setitem(sys.modules, "astra.optimize.passes", module)
    monkeypatch.setattr(astra.optimize, "passes", module, raising=False)
    return specs


RESOURCES = [{"name": "void topk(const float*, float*, int)", "registers": 40}]


@pytest.fixture
def serial_tree(tmp_path, monkeypatch) -> Path:
    """A home and a source tree holding SERIAL as topk.cuh."""
    monkeypatch.setenv("ASTRA_HOME", str(tmp_path / "home"))
    src = tmp_path / "src"
    src.mkdir()
    (src / "topk.cuh").write_text(SERIAL)
    return src


def test_the_offline_agent_tries_the_planned_passes_first_and_the_run_keeps_the_plan(serial_tree, fake_passes):
    src, resources = serial_tree, RESOURCES
    run = RunDir.create("topk", "0.5.23", "offline", SERIAL)

    def judge(source, label):
        if label == "original":
            return verdict(resources=resources)
        return make_verdict({"decode": 1.2, "prefill": 1.2} if label == "pass:parallelize" else {"decode": 0.9})

    agent = OfflineAgent("topk.cuh", src, [], evaluator=Evaluator(judge), per_round=3,
                         profiler=ProfilingAgent(), spec={"name": "topk"})
    state = run_loop(run, agent, Evaluator(judge), Budget(rounds=1, patience=5))
    names = [h.name for h in state.history]
    assert names[:2] == ["pass:parallelize", "pass:vectorize"] and len(names) == 3
    assert fake_passes == [{"name": "topk"}]
    assert state.history[0].accepted and state.best == 1

    record = RunDir(run.root).state().plans[0]  # read back from state.json
    assert record.round == 0 and record.agent == "offline" and record.base == "original"
    assert [p["step"] for p in record.plans] == ["pass:parallelize", "pass:vectorize", "pass:reuse", "pass:coarsen"]
    assert record.plans[2]["notes"] == ["does not apply: reuse: nothing to change"]
    assert record.plans[3]["notes"] == ["no pass 'coarsen' in the catalog"]
    ids = {(s["id"], s["band"]) for s in record.symptoms}
    assert {("serial_loop", "all"), ("launch_bound", "decode"), ("far_from_floor", "prefill"),
            ("scalar_memory", "prefill")} <= ids
    assert any(n.startswith("decode: launch_bound: at the empty-launch floor") for n in record.notes)

    text = run_text.summary(run)
    assert "round 0 (offline, profiled: original):" in text
    assert "  symptom all: serial_loop: line 5: a loop only thread 0 runs (source)" in text
    assert "  plan 1. pass:parallelize [all] parallelize: a loop only thread 0 runs" in text
    assert "  applied #001 pass:parallelize: correct, x1.200, kept" in text
    assert "  applied #002 pass:vectorize:" in text
    page = run_html.render(run)
    assert "<h2>Profile and plan per round</h2>" in page and "Round 0: offline, profiled original" in page
    assert "serial_loop" in page and "line 5: a loop only thread 0 runs" in page
    assert "<li>pass:parallelize [all] parallelize:" in page and "<td class=\"l\">pass:parallelize</td>" in page


def test_a_context_with_a_best_profiles_the_original_too():
    ctx = Context("topk", 2, SERIAL + "// best\n", verdict(), original_source=SERIAL, best_n=4)
    proposals, record = planning.plan_round(ProfilingAgent(), ctx, None, passes={})
    assert proposals == [] and record.base == "best #4" and record.round == 2
    assert record.original_symptoms and all(s["id"] != "" for s in record.original_symptoms)
    assert planning.summary(record).startswith("plan: pass:parallelize")


def test_with_a_screening_evaluator_the_planned_passes_run_before_the_parameter_search(serial_tree, fake_passes):
    src, resources = serial_tree, RESOURCES

    def judge(source, label):
        return verdict(resources=resources) if label == "original" else make_verdict({"decode": 0.9})

    def screen(source, label, cases):
        return make_verdict({"decode": 0.9})

    evaluator = Evaluator(judge, screen=screen)
    agent = OfflineAgent("topk.cuh", src, [], evaluator=evaluator, per_round=6, profiler=ProfilingAgent(),
                         spec={"name": "topk"})
    run = RunDir.create("topk", "0.5.23", "offline", SERIAL)
    rationales: list[str] = []
    searched_before: list[int] = []  # bases the parameter search had run on when each candidate was proposed

    def on_event(kind, data):
        if kind == "candidate":
            rationales.append(data.get("rationale", ""))
            searched_before.append(len(agent.searched))

    state = run_loop(run, agent, evaluator, Budget(rounds=2, patience=5, wall_s=600.0), events=on_event)
    assert rationales[0].startswith("the profile's plan before the parameter search")
    first = [h.name for h in state.history if h.round == 0]
    assert first == ["pass:parallelize", "pass:vectorize"]  # the plan alone
    assert searched_before[:2] == [0, 0] and searched_before[-1] == 1  # the search ran after them, not before
    later = [h.name for h in state.history if h.round == 1]
    assert later and not {"pass:parallelize", "pass:vectorize"} & set(later)  # the search's round: no retries
    assert state.history[0].base == state.history[-1].base  # nothing better: the same base, searched now
    assert agent.searched  # the base was searched in the second round


def test_coarsen_is_planned_for_many_tiny_ctas_only():
    rules = planning.load_rules()
    for symptom in (Symptom("few_ctas", "decode", "1 CTA on 132 SMs", "ncu"),
                    Symptom("small_ctas", "decode", "32 threads per CTA", "ncu"),
                    Symptom("far_from_floor", "decode", "x9 its practical floor", "timing")):
        plans, notes = planning.make_plan(profile(symptom, decode=(9.0, 40.0)), rules)
        assert "pass:coarsen" not in [p.step for p in plans], symptom
    plans, _ = planning.make_plan(profile(Symptom("small_ctas", "prefill", "8192 CTAs of 64 threads", "ncu"),
                                          prefill=(2.0, 30.0)), rules)
    assert [p.step for p in plans] == ["pass:coarsen"]
