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
    assert proc.returncode == 7, proc.stderr
    errors = [line for line in proc.stderr.splitlines() if line.startswith("astra optimize:")]
    assert len(errors) == 1 and needle in errors[0], proc.stderr
    assert "Traceback" not in proc.stderr and key not in proc.stderr + proc.stdout
    run_dir = proc.stdout.split("directory ")[1].split()[0]
    state = json.loads(open(os.path.join(run_dir, "state.json")).read())
    assert state["stopped"].startswith("stopped by the agent:")
