"""`--agent exec:CMD`: a real agent script (written by these tests) reads the folder Astra writes each round,
edits candidate.cuh and names its idea; the loop verifies what it proposes. On the CPU the evaluator reads
the edit (as in test_loop; the numbers are synthetic); the dry-run test builds the agent's candidate with
nvcc; the gpu test verifies it on a GPU."""

from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from astra.errors import AstraError
from astra.optimize.evaluator import Evaluator
from astra.optimize.exec_agent import ExecAgent
from astra.optimize.loop import Budget, run_loop
from astra.optimize.rundir import RunDir
from astra.spec.model import load
from harness import policy_text
from tests.verdicts import make_verdict

AGENT = r'''
import json, os, subprocess, sys, time
from pathlib import Path

EDITS = [  # (old, new, idea): the first that applies and has not already failed is made
    ("if (i < n) ", "", "drop the bounds check"),
    ("x[i] / s", "x[i] * (1.0f / s)", "multiply by the reciprocal of s"),
    # bit-identical (IEEE addition commutes): the reciprocal of kDim, tried before, turned one fp16 output near
    # the overflow edge into Inf on an extreme-magnitude trial, which the harness rightly calls a difference
    ("sum_of_squares / kDim + eps", "eps + sum_of_squares / kDim", "add eps first"),
]
mode = sys.argv[1]
here = Path.cwd()
assert Path(os.environ["ASTRA_CONTEXT_DIR"]).resolve() == here.resolve()
readme = (here / "README.md").read_text()
if "candidate.cuh" not in readme or "IDEA.txt" not in readme:
    sys.exit("README.md does not say which file to edit")
if mode == "fail":
    print("compiler exploded: no GPU for you", file=sys.stderr)
    sys.exit(3)
if mode == "sleep":
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(300)"])
    (here / "child.pid").write_text(str(child.pid))
    print("thinking...", flush=True)
    time.sleep(300)
candidate = Path(os.environ["ASTRA_CANDIDATE"])
source = candidate.read_text()
failed = (here / "failures.md").read_text()
budget = json.loads((here / "budget.json").read_text())
for old, new, idea in EDITS if mode != "noop" else []:
    if old in source and idea not in failed:
        candidate.write_text(source.replace(old, new))
        (here / "IDEA.txt").write_text(idea + "\n")
        if mode == "usage":
            (here / "USAGE.json").write_text(json.dumps({"tokens": 100, "cost_usd": 0.25}))
        print(f"edited: {idea} ({budget['rounds_left']} rounds left)")
        break
else:
    print("nothing left to try")
'''

TOY = """__global__ void scale(const float* x, float* y, float s, int n) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) y[i] = x[i] / s;
}
"""
FILES = ["README.md", "candidate.cuh", "original.cuh", "best.cuh", "best.md", "profile.md", "failures.json",
         "failures.md", "history.md", "budget.json", "spec.yaml", "agent.log"]


@pytest.fixture
def script(tmp_path) -> Path:
    path = tmp_path / "agent.py"
    path.write_text(AGENT)
    return path


def command(script: Path, mode: str) -> str:
    return f"{shlex.quote(sys.executable)} {shlex.quote(str(script))} {mode}"


def with_floors(verdict):
    """Floors as the harness records them: practical 4 us, physical 2 us."""
    for case in verdict.cases:
        orig, cand = case.median_us("graph", "orig"), case.median_us("graph", "cand")
        case.floors["graph"] = {"physical_us": 2.0, "practical_us": 4.0, "orig_us": orig, "cand_us": cand,
                                "orig_x_practical": orig / 4.0, "cand_x_practical": cand / 4.0}
    return verdict


def evaluator(source: str, label: str):
    """Synthetic verdicts read from the edit: no bounds check is wrong, the reciprocal is 1.2x faster."""
    if label == "original":
        return with_floors(make_verdict({"decode": 1.0, "prefill": 1.0}))
    if "if (i < n)" not in source:
        return with_floors(make_verdict({"decode": 3.0, "prefill": 3.0}, status="incorrect"))
    speed = 1.2 if "(1.0f / s)" in source else 1.0
    return with_floors(make_verdict({"decode": speed, "prefill": speed}))


class Recording(ExecAgent):
    """The exec agent, keeping each round's context to compare with what it wrote."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.contexts = []

    def propose(self, ctx):
        self.contexts.append(ctx)
        return super().propose(ctx)


@pytest.fixture
def run():
    return RunDir.create("rmsnorm", "0.5.23", "exec:test", TOY)


@pytest.fixture(scope="module")
def spec():
    return load("rmsnorm")


def _rounds(run: RunDir) -> list[Path]:
    return sorted((run.root / "agent").iterdir())


def test_the_agent_reads_the_folder_edits_and_the_loop_verifies(run, spec, script):
    agent = Recording(command(script, "usage"), spec, timeout_s=60)
    budget = Budget(rounds=5, wall_s=600, tokens=1000, cost_usd=2.0, patience=3)
    state = run_loop(run, agent, Evaluator(evaluator), budget)

    assert agent.name == f"exec:{sys.executable}"
    assert state.stopped == "the agent has nothing left to try"
    assert [(h.name, h.status, h.accepted) for h in state.history] == [
        ("exec:r0:drop-the-bounds-check", "incorrect", False),
        ("exec:r1:multiply-by-the-reciprocal-of-s", "correct", True)]
    source, meta, _ = run.candidate(2)
    assert "x[i] * (1.0f / s)" in source and "if (i < n)" in source  # made on the original, not the rejected one
    assert meta["description"] == "multiply by the reciprocal of s" and meta["family"] == "exec"
    assert (state.tokens, state.cost_usd) == (200, 0.5)  # USAGE.json of the two rounds that edited

    folders = _rounds(run)
    assert [f.name for f in folders] == ["round-000", "round-001", "round-002"]
    for folder, ctx in zip(folders, agent.contexts):
        for name in FILES:
            assert (folder / name).read_text().strip(), f"{folder.name}/{name} is empty"
        assert json.loads((folder / "budget.json").read_text()) == {
            "round": ctx.round, "rounds_left": ctx.rounds_left, "wall_left_s": ctx.wall_left_s,
            "tokens_left": ctx.tokens_left, "cost_left_usd": ctx.cost_left_usd, "command_time_limit_s": 60.0}
        assert (folder / "original.cuh").read_text() == TOY
        readme = (folder / "README.md").read_text()
        assert policy_text() in readme and "elementwise/rmsnorm.cuh" in readme
        assert "- `rmsnorm`, calling `{'RMSNormWarpKernel'" in readme  # the export and its C++ entries
        assert "not written for this run" in readme  # no SGLang tree given: no sources/ folder
        assert "No Nsight Compute profile is available" in (folder / "profile.md").read_text()
        written = yaml.safe_load((folder / "spec.yaml").read_text())
        assert written["tolerance"]["bfloat16"]["atol"] == 1.6e-2
        assert written["build"]["wrappers"][0]["export"] == "rmsnorm"
    assert [c.rounds_left for c in agent.contexts] == [4, 3, 2]
    assert [c.tokens_left for c in agent.contexts] == [1000, 900, 800]
    assert [c.cost_left_usd for c in agent.contexts] == [2.0, 1.75, 1.5]

    first, second, third = folders
    assert "None yet." in (first / "failures.md").read_text()
    assert "| decode0 | decode | bfloat16 | 10 | 10 | 1 | 2 | 4 | 2.5 | 2.5 |" in (first / "best.md").read_text()
    assert "edited: drop the bounds check (4 rounds left)" in (first / "agent.log").read_text()
    failures = (second / "failures.md").read_text()
    assert "#001 (round 0): drop the bounds check" in failures and "status: incorrect" in failures
    assert "12 of 4096 elements differ" in failures  # the verdict's detail, as feedback shows it
    assert "-  if (i < n) y[i] = x[i] / s;" in failures and "+  y[i] = x[i] / s;" in failures  # its diff
    assert json.loads((second / "failures.json").read_text())[0]["status"] == "incorrect"
    assert (second / "IDEA.txt").read_text().strip() == "multiply by the reciprocal of s"
    best = (third / "best.md").read_text()
    assert "candidate #002" in best
    assert "| decode0 | decode | bfloat16 | 10 | 8.333 | 1.2 | 2 | 4 | 2.5 | 2.08 |" in best
    assert (third / "best.cuh").read_text() == (third / "candidate.cuh").read_text() == source
    history = (third / "history.md").read_text()
    assert "| 001 | 0 | drop the bounds check | incorrect | 0 | no |" in history
    assert "| 002 | 1 | multiply by the reciprocal of s | correct | 1.2 | yes |" in history


def test_no_change_means_nothing_left_to_try(run, spec, script):
    state = run_loop(run, ExecAgent(command(script, "noop"), spec, timeout_s=60), Evaluator(evaluator),
                     Budget(rounds=3))
    assert state.stopped == "the agent has nothing left to try" and state.history == []
    (folder,) = _rounds(run)
    assert (folder / "candidate.cuh").read_text() == TOY and "nothing left to try" in (folder / "agent.log").read_text()


def test_a_failing_command_stops_the_run_with_its_log(run, spec, script):
    with pytest.raises(AstraError) as err:
        run_loop(run, ExecAgent(command(script, "fail"), spec, timeout_s=60), Evaluator(evaluator),
                 Budget(rounds=3))
    message = str(err.value)
    assert "exited with status 3" in message and "compiler exploded: no GPU for you" in message
    assert f"--resume {run.root.name}" in message and "run it by hand in" in message
    state = run.state()
    assert state.stopped.startswith("stopped by the agent:") and "status 3" in state.stopped


def _dead(pid: int) -> bool:
    status = Path(f"/proc/{pid}/status")
    try:
        return "State:\tZ" in status.read_text()
    except FileNotFoundError:
        return True


def test_a_command_past_its_time_limit_is_ended_with_its_children(run, spec, script):
    start = time.monotonic()
    with pytest.raises(AstraError) as err:
        run_loop(run, ExecAgent(command(script, "sleep"), spec, timeout_s=2), Evaluator(evaluator),
                 Budget(rounds=3))
    assert time.monotonic() - start < 60
    message = str(err.value)
    assert "ran past its time limit of 2s" in message and "thinking..." in message and "--agent-timeout" in message
    assert run.state().stopped.startswith("stopped by the agent:")
    child = int((_rounds(run)[0] / "child.pid").read_text())
    deadline = time.monotonic() + 10
    while not _dead(child) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert _dead(child), "the command's child outlived the time limit"


def test_the_wall_time_budget_limits_the_command_and_ends_the_run_normally(run, spec, script):
    state = run_loop(run, ExecAgent(command(script, "sleep"), spec, timeout_s=600), Evaluator(evaluator),
                     Budget(rounds=3, wall_s=3))
    assert "wall-time budget ended it" in state.stopped and state.history == []


def test_agent_options():
    from astra.optimize.agent_registry import agent_kind
    from astra.optimize.options import OptimizeOptions

    assert agent_kind(OptimizeOptions(agent=" exec:./my-agent.sh --fast")) == "exec:./my-agent.sh --fast"
    for bad, needle in [({"agent": "exec:"}, "no command after `exec:`"),
                        ({"agent": "exec:   "}, "no command after `exec:`"),
                        ({"agent": "claude"}, "write exec:CMD"),
                        ({"agent": "exec:./a.sh", "offline": True}, "--agent and --offline: pick one agent"),
                        ({"agent": "exec:./a.sh", "model": "m"}, "--agent and --model: pick one agent"),
                        ({"agent": "exec:./a.sh", "agent_timeout_s": 0}, "--agent-timeout 0: must be a positive")]:
        with pytest.raises(AstraError, match=re.escape(needle)):
            OptimizeOptions(**bad)


@pytest.mark.parametrize("flags,needle", [(["--agent", "exec:"], "no command after `exec:`"),
                                          (["--agent", "exec:./a.sh", "--offline"], "--agent and --offline")])
def test_agent_flags_at_the_cli_edge(capsys, flags, needle):
    from astra.cli import main

    for cmd in (["optimize", "rmsnorm", "--dry-run"], ["eval", "--kernels", "rmsnorm", "--dry-run"]):
        assert main(cmd + flags) == 12
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and err[0].startswith(f"astra {cmd[0]}: ") and needle in err[0], err


def _optimize(script: Path, *flags: str, timeout: int) -> tuple[subprocess.CompletedProcess, dict, Path]:
    proc = subprocess.run([sys.executable, "-m", "astra.cli", "optimize", "rmsnorm", "--rounds", "1",
                           "--agent", f"exec:{command(script, 'edit')}", *flags],
                          capture_output=True, text=True, timeout=timeout, env=dict(os.environ))
    assert "directory " in proc.stdout, proc.stdout + proc.stderr
    run_dir = Path(proc.stdout.split("directory ", 1)[1].split()[0])
    return proc, json.loads((run_dir / "state.json").read_text()), run_dir


@pytest.mark.network
@pytest.mark.skipif(shutil.which("nvcc") is None, reason="needs nvcc")
def test_dry_run_builds_the_agents_candidate(sglang_0523, script):
    proc, state, run_dir = _optimize(script, "--dry-run", timeout=900)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert proc.stdout.split(", agent ", 1)[1].split(";", 1)[0] == f"exec:{sys.executable}"
    assert state["agent"] == f"exec:{command(script, 'edit')}"
    (entry,) = state["history"]
    assert entry["name"] == "exec:r0:add-eps-first" and entry["status"] == "built", entry
    candidate = run_dir / "candidates" / "001"
    assert "eps + sum_of_squares / kDim" in (candidate / "kernel.cuh").read_text()
    assert json.loads((candidate / "verdict.json").read_text())["status"] == "built"
    folder = run_dir / "agent" / "round-000"
    assert (folder / "sources" / "sgl_kernel" / "utils.cuh").is_file()  # the headers the kernel includes
    assert "No timed shapes: this verdict is a build only" in (folder / "best.md").read_text()


@pytest.mark.gpu
@pytest.mark.network
def test_optimize_verifies_the_agents_candidate_on_a_gpu(sglang_0523, script):
    """End to end on a GPU: the agent's edit is built, checked on every shape, sanitized and timed."""
    proc, state, run_dir = _optimize(script, "--wall-min", "8", timeout=540)  # one device call holds it
    assert proc.returncode in (0, 1), proc.stdout + proc.stderr  # 1: verified but not faster
    (entry,) = state["history"]
    assert entry["name"] == "exec:r0:add-eps-first"
    assert entry["status"] == "correct", (entry, proc.stdout)
    assert (run_dir / "agent" / "round-000" / "best.md").read_text().count("| ") > 10  # the baseline's shapes


SWAP_AGENT = r'''
import os, sys
from pathlib import Path
Path(os.environ["ASTRA_CANDIDATE"]).write_text(Path(sys.argv[1]).read_text())
Path("IDEA.txt").write_text("16-byte vector loads and stores\n")
print("swapped in the vectorized kernel")
'''


@pytest.mark.gpu
def test_an_agents_faster_kernel_is_verified_and_patched_on_a_gpu(tmp_path):
    """Our own RowScale kernel in a stand-in package: the agent (a script standing in for a coding agent)
    writes the vectorized version; the loop verifies it on every case, finds it faster and emits the patch."""
    from tests.rowscale_package import VECTORIZED, make_rowscale

    rowscale = make_rowscale(tmp_path)
    agent = tmp_path / "swap.py"
    agent.write_text(SWAP_AGENT)
    cmd = f"{shlex.quote(sys.executable)} {shlex.quote(str(agent))} {shlex.quote(str(VECTORIZED))}"
    proc = subprocess.run([sys.executable, "-m", "astra.cli", "optimize", str(rowscale["spec"]), "--sglang-src",
                           str(rowscale["package"]), "--rounds", "1", "--wall-min", "6", "--agent", f"exec:{cmd}"],
                          capture_output=True, text=True, timeout=540,
                          env={**os.environ, "ASTRA_HOME": str(rowscale["home"])})
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out
    run_dir = Path(proc.stdout.split("directory ", 1)[1].split()[0])
    state = json.loads((run_dir / "state.json").read_text())
    (entry,) = state["history"]
    assert entry["name"] == "exec:r0:16-byte-vector-loads-and-stores" and entry["status"] == "correct", entry
    assert entry["accepted"] is True and entry["score"] > 1.0, entry
    assert state["best"] == 1, state
    patch_line = next((line for line in proc.stdout.splitlines() if line.startswith("patch: ")), "no patch line")
    assert patch_line.startswith("patch: ") and "not emitted" not in patch_line, out
    repo_patch = Path(patch_line.split("patch: ", 1)[1].strip())
    text = repo_patch.read_text()
    assert "a/python/sglang/kernels/jit/csrc/test/rowscale.cuh" in text, text[:2000]
    assert "Found by `astra optimize` (exec:" in text, text[:2000]  # the commit message names the agent
