"""Run directories that went wrong: a corrupt state.json, a run that died, a resume of another kernel,
budgets across resumes. `runs` keeps listing; `show` and `--resume` answer one line (exit 14)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from types import SimpleNamespace

import pytest

from astra.errors import RunStateError
from astra.optimize import driver
from astra.optimize.driver import run_optimize
from astra.optimize.evaluator import Evaluator
from astra.optimize.loop import Budget, Proposal, run_loop
from astra.optimize.options import OptimizeOptions
from astra.optimize.rundir import RunDir
from astra.spec import model as spec_mod
from tests.astra.sglang.test_sglang_tree import _fake_checkout
from tests.verdicts import make_verdict


def astra(*args, env=None):
    proc = subprocess.run([sys.executable, "-m", "astra.cli", *args], capture_output=True, text=True,
                          env={**os.environ, **(env or {})}, timeout=120)
    return proc.returncode, proc.stdout, proc.stderr


def one_line(code, err, expected, *needles):
    assert code == expected, err
    assert "Traceback" not in err and len(err.strip().splitlines()) == 1, err
    for needle in needles:
        assert needle in err, err


class Agent:
    """Proposes one candidate per round; spends `tokens` and `cost` per session."""

    name, rationale, plan = "scripted", "", None

    def __init__(self, tokens=0, cost=0.0, rounds=1):
        self.tokens, self.cost, self.rounds = tokens, cost, rounds

    def usage(self):
        return self.tokens, self.cost

    def propose(self, ctx):
        if self.rounds <= 0:
            return []
        self.rounds -= 1
        return [Proposal(f"p{ctx.round}", "test", "a change", ctx.base_source + f"\n// r{ctx.round}")]


def evaluator(source, label, **_):
    return make_verdict({"decode": 1.0})


@pytest.fixture
def run():
    return RunDir.create("rmsnorm", "0.5.23", "scripted", "// original kernel\n")


@pytest.mark.parametrize("text,reason", [
    ('{"run_id": "x", "kernel": "rmsn', "truncated JSON"),
    ("not json at all", "not JSON"),
    ("[1, 2]", "a JSON list, not an object"),
    ('{"run_id": "x"}', "no kernel, sglang_version, agent"),
])
def test_corrupt_state(run, text, reason):
    (run.root / "state.json").write_text(text)
    code, out, err = astra("runs")
    assert code == 0 and "Traceback" not in err, err
    row = next(line for line in out.splitlines() if run.root.name in line)
    assert f"unreadable: {reason}" in row, out
    code, _, err = astra("show", run.root.name)
    one_line(code, err, 14, run.root.name, reason)
    with pytest.raises(RunStateError, match=reason):
        RunDir.open(run.root.name)


def test_resume_of_a_corrupt_run_from_the_cli(run, tmp_path):
    (run.root / "state.json").write_text('{"trunc')
    root = _fake_checkout(tmp_path)
    kernel = root / "python" / "sglang" / "kernels" / "jit" / "csrc" / spec_mod.load("rmsnorm").kernel_file
    kernel.parent.mkdir(parents=True, exist_ok=True)
    kernel.write_text("// kernel\n")
    code, _, err = astra("optimize", "rmsnorm", "--dry-run", "--offline", "--sglang-src", str(root),
                         "--resume", run.root.name)
    one_line(code, err, 14, "truncated JSON")


def _tree(tmp_path, spec):
    csrc = tmp_path / "csrc"
    (csrc / spec.kernel_file).parent.mkdir(parents=True, exist_ok=True)
    (csrc / spec.kernel_file).write_text("// kernel\n")
    return SimpleNamespace(csrc_dir=csrc, version="0.5.23", include_dir=tmp_path)


def test_resume_of_another_kernels_run_is_refused(tmp_path):
    spec = spec_mod.load("qknorm")
    other = RunDir.create("rmsnorm", "0.5.23", "offline", "// k\n")
    with pytest.raises(RunStateError, match="optimizes 'rmsnorm', not 'qknorm'") as err:
        run_optimize(spec, _tree(tmp_path, spec), OptimizeOptions(resume=other.root.name, dry_run=True, offline=True))
    assert err.value.exit_code == 14


def test_resume_clears_the_stop_reason(run):
    state = run.state()
    state.stopped = "1 round(s) done"
    run.save(state)
    resumed = driver._resume(run.root.name, spec_mod.load("rmsnorm"))
    assert resumed.state().stopped is None


def test_a_loop_that_dies_is_marked_stopped(run):
    def broken(source, label, **_):
        if label == "original":
            return make_verdict({"decode": 1.0})
        raise RuntimeError("the worker crashed\x1b[2J")

    with pytest.raises(RuntimeError):
        run_loop(run, Agent(), Evaluator(broken), Budget(rounds=3))
    assert run.state().stopped == "failed: RuntimeError: the worker crashed"


def test_an_interrupted_loop_is_marked_stopped(run):
    class Interrupting(Agent):
        def propose(self, ctx):
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        run_loop(run, Interrupting(), Evaluator(evaluator), Budget(rounds=3))
    assert run.state().stopped == "interrupted (Ctrl-C)"


def test_a_run_whose_setup_fails_is_marked_stopped(tmp_path, monkeypatch):
    spec = spec_mod.load("rmsnorm")
    created = []
    real_create = RunDir.create
    monkeypatch.setattr(RunDir, "create", classmethod(
        lambda cls, *a, **k: created.append(real_create(*a, **k)) or created[-1]))
    with pytest.raises(driver.AstraError, match="needs a price"):
        run_optimize(spec, _tree(tmp_path, spec),
                     OptimizeOptions(model="no-price-model", budget_usd=1.0, dry_run=True), say=lambda _: None)
    assert created[0].state().stopped.startswith("failed: --budget-usd needs a price")


def test_tokens_and_cost_accumulate_across_resumes(run):
    state = run_loop(run, Agent(tokens=100, cost=0.25), Evaluator(evaluator), Budget(rounds=1))
    assert (state.tokens, state.cost_usd) == (100, 0.25)
    state.stopped = None
    run.save(state)
    state = run_loop(run, Agent(tokens=40, cost=0.5), Evaluator(evaluator), Budget(rounds=2))
    assert (state.tokens, state.cost_usd) == (140, 0.75)
    state.stopped = None
    run.save(state)
    state = run_loop(run, Agent(tokens=0), Evaluator(evaluator), Budget(rounds=10, tokens=120))
    assert state.stopped == "token budget of 120 spent"  # the totals count, not this session's 0
    assert json.loads((run.root / "state.json").read_text())["tokens"] == 140


def test_client_budget_counts_what_a_resumed_run_spent():
    from astra.llm.client import Client, LLMBudgetExceeded, LLMConfig

    client = Client(LLMConfig(base_url="http://127.0.0.1:9/v1", model="m", budget_tokens=1000))
    client.check_budget()
    client.carry(1000, 0.0)
    with pytest.raises(LLMBudgetExceeded, match="1,000 of 1,000"):
        client.check_budget()


def test_runs_list_in_the_order_they_were_made_even_past_nine_in_one_second(tmp_path, monkeypatch):
    """A second run of a kernel within the same second gets -2, -3, ...; -10 lists after -9, not after -1."""
    from astra.optimize.rundir import list_runs

    monkeypatch.setenv("ASTRA_HOME", str(tmp_path))
    made = [RunDir.create("orderkernel", "0.5.23", "scripted", "// k\n").root.name for _ in range(12)]
    assert list_runs() == made
