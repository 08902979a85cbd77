"""What the LLM agent's roles are told, read back from the requests the real openai client sent to the
real loopback server: the previous candidate's failure and the best's per-shape table reach the coder,
the planner's band is the band the round targets, budgets are real numbers, history is told by idea.
Verdicts are recorded (SYNTHETIC numbers, no GPU), decided by the harness's own aggregation."""

from __future__ import annotations

import json
import shutil
from types import SimpleNamespace

from astra.llm import templates
from astra.llm.client import Client, LLMConfig
from astra.optimize import llm_context, ncu_profile
from astra.optimize.evaluator import Evaluator
from astra.optimize.llm_agent import LLMAgent
from astra.optimize.llm_context import parse_plan, parse_profile
from astra.optimize.loop import Budget, run_loop
from astra.optimize.rundir import RunDir
from astra.spec import model as spec_mod
from harness.judge.verdict import decide
from tests.llm_server import KEY, MODEL, reply
from tests.verdicts import make_verdict, timed_case

ORIGINAL = "// kernel\n__global__ void k(float* x) { x[0] = 1.0f; }\n"
PRACTICAL = {"decode": 4.0, "prefill": 8.0}  # us; the original's 10 us is x2.50 and x1.25 practical
FIRST_DIFF = "out: 12 of 4096 elements differ beyond tolerance; first differing indices (0, 17), (0, 18)"
BASELINE_ROW = "decode0 | decode | graph | 10.00 | 10.00 | 1.000 | 3.20 | 4.00 | 2.50 | 2.50"
FAST_ROW = "decode0 | decode | graph | 10.00 | 8.00 | 1.250 | 3.20 | 4.00 | 2.50 | 2.00"


def _floors(verdict):
    """The floors a worker records per case and view (harness.timing.roofline.floor_entry), from PRACTICAL."""
    for case in verdict.cases:
        for view, timing in case.timings.items():
            p, orig, cand = PRACTICAL[case.band], timing.orig.median_us, timing.cand.median_us
            case.floors[view] = {"physical_us": 0.8 * p, "practical_us": p, "orig_us": orig, "cand_us": cand,
                                 "orig_x_practical": orig / p, "cand_x_practical": cand / p}
    return verdict


def _recorded(source: str, label: str, **_):
    """The verdict a GPU run would give: `wrong` in the source is incorrect at named positions, `fast`
    is x1.25 everywhere, anything else (the original included) x1.0."""
    if "wrong" in source:
        cases = [timed_case("decode0", "decode", 1.0), timed_case("prefill0", "prefill", 1.0)]
        cases[0].fail(FIRST_DIFF)
        return _floors(decide(cases, ["graph"], 0.02))
    speed = 1.25 if "fast" in source else 1.0
    return _floors(make_verdict({"decode": speed, "prefill": speed}))


def _edit(search: str, replace: str) -> str:
    return f"<<<<<<< SEARCH\n{search}\n=======\n{replace}\n>>>>>>> REPLACE\n"


def _plan(band: str, idea: str, speedup=1.2) -> str:
    return "```json\n" + json.dumps({"band": band, "idea": idea, "expected_speedup": speedup,
                                     "risk": "misaligned rows"}) + "\n```"


def _prompts(server, role: str) -> list[str]:
    out = []
    for request in server.chat_requests():
        text = request.body["messages"][1]["content"]
        if text.startswith(f"Role: {role}."):
            out.append(text)
    return out


def _agent(server, run, **kw) -> LLMAgent:
    cfg = LLMConfig(base_url=server.url, model=MODEL, api_key=KEY, timeout_s=5.0, max_retries=0)
    return LLMAgent(Client(cfg, transcript=run.transcript), spec_mod.load("rmsnorm"), SimpleNamespace(version="0.5.23"),
                    evaluator=Evaluator(_recorded),
                    profiler=lambda *_: ncu_profile.unavailable("ncu is not installed in this test"), **kw)


def test_round_two_is_told_the_failure_the_best_the_band_and_the_budget(llm_server):
    llm_server.push(
        reply("[]"),                                                                    # testing
        reply('```json\n{"decode": {"bottleneck": "latency", "evidence": "x2.50"}}\n```'),  # profiling
        reply(_plan("prefill", "vectorize the prefill loads with 16-byte accesses")),   # planning
        reply(_edit("// kernel", "// kernel wrong")),                                   # coding: incorrect
        reply("the decode band is latency bound"),                                      # round 2: prose profile
        reply(_plan("middle", "two rows per warp for decode")),                         # no middle shapes here
        reply(_edit("// kernel", "// kernel two rows")),                                # correct, x1.0
        reply("{}"),                                                                    # round 3
        reply('{"stop": true, "rationale": "nothing left"}'),
    )
    run = RunDir.create("rmsnorm", "0.5.23", f"llm:{MODEL}", ORIGINAL)
    agent = _agent(llm_server, run)
    state = run_loop(run, agent, agent.evaluator, Budget(rounds=3, tokens=100_000, cost_usd=2.5, patience=3))

    assert [(h.name, h.status, h.accepted) for h in state.history] == [
        ("llm:r0:vectorize-the-prefill-loads-with-16-byte-accesse", "incorrect", False),
        ("llm:r1:two-rows-per-warp-for-decode", "correct", False)]
    assert state.stopped == "the agent has nothing left to try"
    meta = run.candidate(1)[1]
    assert meta["description"] == ("vectorize the prefill loads with 16-byte accesses "
                                   "(target band: prefill, predicted x1.20)")

    planning, coding = _prompts(llm_server, "planning"), _prompts(llm_server, "coding")
    assert len(planning) == 3 and len(coding) == 2
    # round 1: the planner's band is the band the coder targets, with that band's shapes
    assert "Target band: prefill" in coding[0] and "- prefill0 (graph: 10.00 us, x1.25 practical)" in coding[0]
    assert "- decode0" not in coding[0].split("The current best")[0]
    assert "none: no candidate has been rejected yet" in coding[0]
    # round 2: the coder holds the previous candidate's failure and the best's per-shape table
    assert FIRST_DIFF in coding[1] and "incorrect" in coding[1]
    assert BASELINE_ROW in coding[1]
    assert "Target band: decode" in coding[1]  # `middle` has no shapes: the band furthest above its floor
    assert ("the plan gave band 'middle', not one of decode, prefill, all; targeting decode, the band furthest "
            "above its practical floor (x2.50 geomean)") in coding[1]
    # the planner: real budgets, history by idea, the parsed (or raw, said so) profile, the ncu reason
    assert "round 1, 2 more after this one" in planning[0] and "Rounds left after this one: 2." in planning[0]
    assert "100000 tokens left" in planning[0] and "$2.50 left" in planning[0]
    assert "round 2, 1 more after this one" in planning[1] and "Rounds left after this one: 1." in planning[1]
    assert "99940 tokens left" in planning[1]  # 4 calls of 15 tokens in round 1
    assert "nothing tried yet" in planning[0]
    assert "\"vectorize the prefill loads with 16-byte accesses (target band: prefill, predicted x1.20)\" -> " \
           "incorrect" in planning[1]
    assert "two rows per warp for decode" in planning[2]
    assert not any("llm:r" in text for text in planning)
    assert FIRST_DIFF in planning[1] and BASELINE_ROW in planning[1]
    assert '"bottleneck": "latency"' in planning[0]
    assert "the profiling reply was not the JSON object asked for" in planning[1]
    assert "the decode band is latency bound" in planning[1]
    assert "original: no Nsight Compute profile: ncu is not installed in this test" in planning[0]
    assert "The best is the original" in planning[1]
    # every role's input and output is in the transcript, in order
    records = [json.loads(line) for line in run.transcript.read_text().splitlines()]
    assert [r["role"] for r in records] == ["testing", "profiling", "planning", "coding", "profiling", "planning",
                                            "coding", "profiling", "planning"]
    assert records[3]["messages"][1]["content"] == coding[0] and "// kernel wrong" in records[3]["reply"]


def test_samples_are_asked_at_once_and_each_distinct_one_is_a_candidate(llm_server):
    fast, wrong = _edit("// kernel", "// kernel fast"), _edit("// kernel", "// kernel wrong")
    again = _edit("// kernel fast", "// kernel fast again")
    llm_server.push(
        reply("[]"), reply("{}"), reply(_plan("decode", "unroll by four")),
        reply(fast), reply(fast), reply(wrong),                  # three samples, two distinct
        reply("{}"), reply(_plan("decode", "unroll by eight")),
        reply(again), reply(again), reply(again),                # three samples, one distinct
    )
    run = RunDir.create("rmsnorm", "0.5.23", f"llm:{MODEL}", ORIGINAL)
    agent = _agent(llm_server, run, samples=3)
    state = run_loop(run, agent, agent.evaluator, Budget(rounds=2, patience=3))

    first = [h for h in state.history if h.round == 0]
    assert sorted(h.name for h in first) == ["llm:r0:unroll-by-four:s1", "llm:r0:unroll-by-four:s2"]
    assert sorted(h.status for h in first) == ["correct", "incorrect"]
    best = next(h for h in first if h.accepted)
    assert state.best == best.n
    assert [h.name for h in state.history if h.round == 1] == ["llm:r1:unroll-by-eight"]
    coding = _prompts(llm_server, "coding")
    assert len(coding) == 6
    for text in coding[3:]:
        assert FAST_ROW in text and FIRST_DIFF in text and "// kernel fast" in text
    planning = _prompts(llm_server, "planning")[1]
    assert f"Candidate #{best.n}, \"unroll by four (target band: decode, predicted x1.20)\"" in planning
    assert "// kernel fast" in planning and "// the same as the original above" not in planning
    # one transcript line and one tally per call, although the samples ran at once
    assert len(run.transcript.read_text().splitlines()) == len(llm_server.chat_requests()) == 11
    assert agent.client.usage.total().calls == 11


# ---- plans and profiles as parsed


def _baseline():
    return _recorded(ORIGINAL, "original")


def test_a_plan_with_a_band_of_the_verdict_drives_the_round():
    plan = parse_plan(_plan("PREFILL", "wider loads", 1.1), _baseline())
    assert (plan.band, plan.idea, plan.expected_speedup, plan.risk, plan.notes) == (
        "prefill", "wider loads", 1.1, "misaligned rows", [])
    assert "Target band: prefill" in llm_context.plan_text(plan)


def test_an_unknown_band_falls_back_to_the_band_furthest_above_its_floor_and_says_so():
    plan = parse_plan(_plan("huge", "wider loads", "lots"), _baseline())
    assert plan.band == "decode" and plan.expected_speedup is None
    assert plan.notes == ["the plan gave band 'huge', not one of decode, prefill, all; targeting decode, the band "
                          "furthest above its practical floor (x2.50 geomean)",
                          "expected_speedup 'lots' is not a positive number; ignored"]


def test_a_plan_that_is_not_json_still_drives_a_round_and_says_so():
    plan = parse_plan("Unroll the reduction loop by four.", _baseline())
    assert plan.idea == "Unroll the reduction loop by four." and plan.band == "decode" and not plan.stop
    assert plan.notes[0] == "the plan was not the JSON object asked for; its text is the idea"
    assert "no band" in plan.notes[1]
    untimed = parse_plan(_plan("decode", "x"), None)  # a build-only run: no band has shapes
    assert untimed.band == "all" and "every shape (no band has a measured floor)" in untimed.notes[0]
    assert parse_plan('{"stop": true, "rationale": "at the floor"}', _baseline()).stop


def test_the_plan_asked_for_is_the_plan_parsed():
    text = templates.render("planning", **{v: "" for v in templates.variables("planning")})
    example = json.loads(text.split("```json\n")[1].split("```")[0])
    assert set(example) == {"band", "idea", "expected_speedup", "risk"}
    assert example["band"].split("|") == list(llm_context.BAND_CHOICES)


def test_profiles_are_parsed_or_passed_raw_with_a_note():
    assert parse_profile('```json\n{"decode": {"bottleneck": "launch"}}\n```') == {
        "parsed": {"decode": {"bottleneck": "launch"}}}
    raw = parse_profile("decode is launch bound")
    assert raw["raw"] == "decode is launch bound" and "not the JSON" in llm_context.profile_text(raw)


# ---- Nsight Compute


def test_no_ncu_or_no_gpu_is_a_reason_not_a_profile(monkeypatch):
    import harness.timing.ncu_cross_check

    profiler = ncu_profile.Profiler(spec_mod.load("rmsnorm"), SimpleNamespace(version="0.5.23"))
    monkeypatch.setattr(harness.timing.ncu_cross_check, "ncu_path", lambda: None)
    result = profiler(None, "decode0", [])
    assert result == {"available": False, "why": "ncu (Nsight Compute) not found on PATH or in $CUDA_HOME/bin"}
    assert ncu_profile.text(result, "original") == ("original: no Nsight Compute profile: ncu (Nsight Compute) "
                                                    "not found on PATH or in $CUDA_HOME/bin")
    monkeypatch.setattr(harness.timing.ncu_cross_check, "ncu_path", lambda: "/opt/ncu")
    monkeypatch.setattr(shutil, "which", lambda name: None)
    assert profiler(None, "decode0", []) == {"available": False, "why": "no GPU: nvidia-smi not found"}
    assert profiler(None, None, [])["why"].startswith("no timed shape to profile")
    assert ncu_profile.pick_case(_baseline()) == "decode0"  # 6 us above its practical floor, prefill 2 us


def test_ncu_csv_becomes_one_profile_per_marked_shape():
    from harness.timing.ncu_cross_check import split_by_markers

    def rows(kid, name, metrics):
        return [f'"{kid}","1","python","h","{name}","1","7","(128, 1, 1)","(4, 1, 1)","0","9.0","s","{m}","u","{v}"'
                for m, v in metrics.items()]

    stall = "smsp__average_warps_issue_stalled_{}_per_issue_active.ratio".format
    kernel = {"gpu__time_duration.sum": "3000", "dram__throughput.avg.pct_of_peak_sustained_elapsed": "60",
              "dram__bytes.sum.per_second": "2,000,000,000,000", "launch__registers_per_thread": "40",
              "sm__warps_active.avg.pct_of_peak_sustained_active": "50",
              "smsp__sass_inst_executed_op_local_ld.sum": "0", "smsp__sass_inst_executed_op_local_st.sum": "4",
              stall("long_scoreboard"): "9", stall("selected"): "1", stall("barrier"): "3", stall("wait"): "2",
              stall("branch_resolving"): "0.5", "launch__grid_size": "n/a"}
    header = ('"ID","Process ID","Process Name","Host Name","Kernel Name","Context","Stream","Block Size",'
              '"Grid Size","Device","CC","Section Name","Metric Name","Metric Unit","Metric Value"')
    lines = ["==PROF== Connected", header, *rows(0, "fill_kernel", {"gpu__time_duration.sum": "1"}),
             *rows(1, "spin_kernel", {"gpu__time_duration.sum": "2000"}), *rows(2, "rmsnorm_kernel", kernel),
             *rows(3, "spin_kernel", {"gpu__time_duration.sum": "2000"})]
    groups = split_by_markers(ncu_profile.parse_csv("\n".join(lines)))
    profile = ncu_profile.summarize(groups[-1])
    assert profile["kernels"] == 1 and profile["duration_us"] == 3.0 and profile["registers"] == 40
    assert profile["dram_Bps"] == 2e12 and profile["local_stores"] == 4 and profile["grid"] == []
    assert profile["top_stalls"] == [["long_scoreboard", 9.0], ["barrier", 3.0], ["wait", 2.0]]
    line = ncu_profile.text({**profile, "case": "decode0"}, "best (#2)")
    assert "DRAM 60.0% of peak (2.00 TB/s)" in line and "achieved occupancy 50.0%" in line
    assert "long_scoreboard 9.00, barrier 3.00, wait 2.00" in line

