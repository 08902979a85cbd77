"""`astra optimize` at the CLI edge with a real loopback LLM endpoint: a wrong key and a model that
does not exist each give one clear line and a non-zero exit, and the run directory keeps its state.
(--dry-run: no GPU here; the original is built with nvcc for the baseline.)"""

import json
import os
import shutil
import subprocess
import sys

import pytest

from tests.llm_server import KEY, MODEL

pytestmark = [pytest.mark.network, pytest.mark.skipif(shutil.which("nvcc") is None, reason="needs nvcc")]


def _optimize(url: str, model: str, key: str):
    env = {**os.environ, "ASTRA_API_KEY": key}
    proc = subprocess.run([sys.executable, "-m", "astra.cli", "optimize", "fused_add_rmsnorm", "--dry-run",
                           "--model", model, "--base-url", url, "--rounds", "1"],
                          capture_output=True, text=True, env=env, timeout=300)
    return proc


@pytest.mark.parametrize("model,key,needle", [
    (MODEL, "sk-wrong-key-000000000000", "rejected the API key (401"),
    ("no-such-model", KEY, "model 'no-such-model' does not exist"),
])
def test_llm_errors_are_one_line_and_keep_the_run(llm_server, sglang_0523, model, key, needle):
    proc = _optimize(llm_server.url, model, key)
    assert proc.returncode == 13, proc.stderr
    errors = [line for line in proc.stderr.splitlines() if line.startswith("astra optimize:")]
    assert len(errors) == 1 and needle in errors[0], proc.stderr
    assert "Traceback" not in proc.stderr and key not in proc.stderr + proc.stdout
    run_dir = proc.stdout.split("directory ")[1].split()[0]
    state = json.loads(open(os.path.join(run_dir, "state.json")).read())
    assert state["stopped"].startswith("stopped by the agent:")


def _run_agent(stdout: str) -> str:
    """The agent named in the run header: `run ID: NAME from SGLang V, agent AGENT; directory D`."""
    return stdout.split(", agent ", 1)[1].split(";", 1)[0]


def test_astra_model_in_the_environment_selects_the_llm_agent(llm_server, sglang_0523, tmp_path):
    """One rule picks the agent: $ASTRA_MODEL (with $ASTRA_BASE_URL) selects the LLM agent for a dry run
    with no model flag, and --offline still forces the search agent."""
    env = {**os.environ, "ASTRA_MODEL": MODEL, "ASTRA_BASE_URL": llm_server.url, "ASTRA_API_KEY": KEY}
    command = [sys.executable, "-m", "astra.cli", "optimize", "fused_add_rmsnorm", "--dry-run", "--rounds", "1"]
    proc = subprocess.run(command, capture_output=True, text=True, env=env, timeout=600)
    assert _run_agent(proc.stdout) == f"llm:{MODEL}", proc.stdout + proc.stderr
    assert llm_server.chat_requests(), "the LLM agent never called the endpoint"
    assert all(r.headers["authorization"] == f"Bearer {KEY}" for r in llm_server.chat_requests())
    asked = len(llm_server.chat_requests())
    proc = subprocess.run(command + ["--offline"], capture_output=True, text=True, env=env, timeout=600)
    assert _run_agent(proc.stdout) == "offline", proc.stdout + proc.stderr
    assert len(llm_server.chat_requests()) == asked  # the search agent asks no model


def test_config_file_selects_the_llm_agent(llm_server, tmp_path):
    from astra.optimize.agent_registry import agent_kind
    from astra.optimize.options import OptimizeOptions

    home = tmp_path / "home"
    home.mkdir()
    (home / "config.yaml").write_text(f"model: {MODEL}\nbase_url: {llm_server.url}\n")
    env = {k: v for k, v in os.environ.items() if k not in ("ASTRA_MODEL", "ASTRA_BASE_URL", "OPENAI_BASE_URL")}
    code = ("from astra.optimize.agent_registry import agent_kind; from astra.optimize.options import OptimizeOptions; "
            "print(agent_kind(OptimizeOptions()), agent_kind(OptimizeOptions(offline=True)))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                         env={**env, "ASTRA_HOME": str(home)}).stdout.split()
    assert out == [f"llm:{MODEL}", "offline"]
    assert agent_kind(OptimizeOptions(offline=True)) == "offline"
