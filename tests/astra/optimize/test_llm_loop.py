"""The whole optimize loop driven by the LLM agent, through the real openai client, against a real
OpenAI-compatible HTTP server on loopback with scripted replies.

Candidates are built for real with nvcc (SGLang 0.5.23's fused_add_rmsnorm, exactly as SGLang builds
it). CI has no GPU, so a candidate that builds gets its correctness/speed verdict from this test's
script instead of the harness; everything before that (model protocol, retries, edit feedback,
compilation, keep-only-verified bookkeeping, transcripts) is the real code path.
"""

import json
import shutil

import pytest

from astra.llm.client import Client, LLMConfig, LLMUnreachable
from astra.optimize.evaluator import BuildOnlyEvaluator, Evaluator
from astra.optimize.llm_agent import LLMAgent
from astra.optimize.loop import Budget, run_loop
from astra.optimize.rundir import RunDir
from astra.spec import model as spec_mod
from tests.llm_server import KEY, MODEL, error, reply
from tests.verdicts import make_verdict

pytestmark = [pytest.mark.network, pytest.mark.skipif(shutil.which("nvcc") is None, reason="needs nvcc")]


def _edit(search: str, replace: str) -> str:
    return f"<<<<<<< SEARCH\n{search}\n=======\n{replace}\n>>>>>>> REPLACE\n"


def _scripted_evaluator(spec, tree):
    """Real nvcc build; where it builds, the verdict a GPU run would give (x1.05 on every band)."""
    build = BuildOnlyEvaluator(spec, tree)

    def evaluate(source: str, label: str):
        built = build.verify(source, label)
        if built.status != "built":
            return built
        speed = 1.0 if label == "original" else 1.05
        return make_verdict({"decode": speed, "middle": speed, "prefill": speed})

    return Evaluator(evaluate)


def test_loop_survives_a_difficult_model(llm_server, sglang_0523, tmp_path):
    spec = spec_mod.load("fused_add_rmsnorm")
    source = (sglang_0523.csrc_dir / spec.kernel_file).read_text()
    anchor = next(line for line in source.splitlines() if line.startswith("#include"))
    plan = '```json\n{"idea": "unroll the reduction", "change": "x", "rationale": "y", "band": "decode", ' \
           '"expected_speedup": 1.05, "risk": "low", "stop": false}\n```'
    llm_server.push(
        error(429, "slow down", {"Retry-After": "0"}),                    # testing role: 429, then success
        reply('```json\n[{"tokens": 3, "hidden": 4096}, {"tokens": 5, "hidden": 4097}]\n```'),
        reply('{"decode": {"bottleneck": "latency"}}'),                    # profiling
        reply(plan),                                                       # planning
        reply("I would unroll the loop."),                                 # coding 1: malformed (no blocks)
        reply(_edit("this line is not in the file", "x")),                 # coding 2: does not apply
        reply(_edit(anchor, anchor + "\nthis is not C++;")),               # coding 3: applies, does not compile
        reply('{"decode": {}}', delay_s=2.0),                              # round 2 profiling: times out ...
        reply('{"decode": {"bottleneck": "latency"}}'),                    # ... then answers
        reply(plan),
        reply(_edit(anchor, anchor + "\n// astra: a harmless change")),    # compiles; scripted x1.05
        reply('{"decode": {}}'),
        reply('```json\n{"idea": "", "stop": true, "rationale": "at roofline"}\n```'),
    )
    cfg = LLMConfig(base_url=llm_server.url, model=MODEL, api_key=KEY, timeout_s=1.0, backoff_base_s=0.01,
                    backoff_max_s=0.05)
    run = RunDir.create(spec.name, sglang_0523.version, f"llm:{MODEL}", source)
    evaluator = _scripted_evaluator(spec, sglang_0523)
    agent = LLMAgent(Client(cfg, transcript=run.transcript), spec, sglang_0523, evaluator=evaluator)
    state = run_loop(run, agent, evaluator, Budget(rounds=5, patience=3))

    assert agent.extra_shapes == [{"tokens": 3, "hidden": 4096}]  # 4097 violates the spec's hidden % 16 == 0
    statuses = [(h.name, h.status, h.accepted) for h in state.history]
    assert statuses == [("llm:r0:unroll-the-reduction", "build_failed", False),
                        ("llm:r1:unroll-the-reduction", "correct", True)]
    assert state.best == 2 and "a harmless change" in run.best_source()
    assert state.stopped == "the agent has nothing left to try"
    assert state.tokens > 0
    # each round's plan is in the run's history, in the structure the offline planner fills too
    assert [(p.round, p.agent, p.base, p.plans[0]["band"], p.plans[0]["stop"]) for p in run.state().plans] == [
        (0, f"llm:{MODEL}", "original", "decode", False), (1, f"llm:{MODEL}", "original", "decode", False),
        (2, f"llm:{MODEL}", "best #2", "all", True)]
    assert state.plans[0].plans[0]["idea"] == "unroll the reduction" and state.plans[2].plans[0]["rationale"] == "at roofline"
    # the edit errors went back to the model, written for it
    coding = [r for r in llm_server.chat_requests() if "Role: coding" in json.dumps(r.body)]
    assert "holds no edit" in json.dumps(coding[1].body)  # the malformed reply, explained
    assert "this line is not in the file" in json.dumps(coding[2].body)
    # round 2's coder is told why round 1's candidate failed: nvcc's own error line
    assert "build_failed" in json.dumps(coding[3].body) and "error: expected a declaration" in json.dumps(coding[3].body)
    transcript = run.transcript.read_text()
    assert KEY not in transcript and "Authorization" not in transcript


def test_unreachable_endpoint_keeps_the_run(sglang_0523):
    spec = spec_mod.load("fused_add_rmsnorm")
    source = (sglang_0523.csrc_dir / spec.kernel_file).read_text()
    run = RunDir.create(spec.name, sglang_0523.version, "llm:x", source)
    cfg = LLMConfig(base_url="http://127.0.0.1:9/v1", model="x", api_key="sk-abc", timeout_s=0.5,
                    max_retries=1, backoff_base_s=0.01)
    def original_only(source, label):
        return make_verdict({"decode": 1.0})

    evaluator = Evaluator(original_only)
    agent = LLMAgent(Client(cfg, transcript=run.transcript), spec, sglang_0523, evaluator=evaluator)
    with pytest.raises(LLMUnreachable, match="127.0.0.1:9"):
        run_loop(run, agent, evaluator, Budget(rounds=2))
    assert run.state().stopped.startswith("stopped by the agent: ")
    assert (run.root / "baseline.json").exists()


def test_best_candidate_goes_to_the_patch_emitter(sglang_0523):
    """A verdict without per-shape timings: the emitter must refuse it and say why."""
    from astra.optimize.driver import emit_best_patch

    spec = spec_mod.load("fused_add_rmsnorm")
    source = (sglang_0523.csrc_dir / spec.kernel_file).read_text()
    run = RunDir.create(spec.name, sglang_0523.version, "offline", source)
    n = run.add_candidate(source.replace("#include", "// x\n#include", 1), {"description": "a comment"})
    untimed = make_verdict({"decode": 1.1}, name=spec.name)
    untimed.cases = []
    run.save_verdict(n, untimed)
    state = run.state()
    state.best = n
    run.save(state)
    message = emit_best_patch(run, spec, sglang_0523)
    assert message.startswith("patch: not emitted:") and "timing" in message
