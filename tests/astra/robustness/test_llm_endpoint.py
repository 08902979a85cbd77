"""The LLM endpoint as a user meets it through the real `astra optimize`: an endpoint URL no request can go to
is refused at once (exit 13, one line naming where the URL came from, nothing sent); a model that answers
without any usable code ends the run with its own exit code (17), not "nothing left to try"; a slow model is
reported while Astra waits, on a terminal only. The endpoint is the real loopback server of tests/llm_server.py
answering OpenAI-compatible chat completions."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.astra.robustness.run_astra import REPO, astra, refused, with_stderr_on_terminal
from tests.astra_home import cached_home
from tests.llm_server import KEY, MODEL, reply

NO_CODE = "I looked at the kernel; it is already well written, so I would leave it as it is."


@pytest.mark.parametrize("url", ["not a url", "ftp://x", "http://", "http:///v1", "localhost:30000"])
def test_an_unusable_base_url_flag_is_refused_before_any_work(tmp_path, url):
    answer = astra("optimize", "rmsnorm", "--dry-run", "--model", MODEL, "--base-url", url,
                   env={"ASTRA_HOME": str(cached_home(tmp_path / "home"))})
    refused(answer, 13, "--base-url", repr(url), "http:// or https:// URL with a host")
    assert not list((tmp_path / "home").glob("runs/*")), "a run was started"


def test_an_unusable_base_url_in_the_environment_or_config_names_its_source(tmp_path, llm_server):
    home = cached_home(tmp_path / "home")
    answer = astra("optimize", "rmsnorm", "--dry-run", "--model", MODEL,
                   env={"ASTRA_HOME": str(home), "ASTRA_BASE_URL": "ftp://models.example/v1"})
    refused(answer, 13, "ASTRA_BASE_URL", "ftp://models.example/v1")
    (home / "config.yaml").write_text("base_url: ftp://x\nmodel: m\n")
    answer = astra("optimize", "rmsnorm", "--dry-run", env={"ASTRA_HOME": str(home)})
    refused(answer, 13, str(home / "config.yaml"), "base_url", "ftp://x")
    assert llm_server.requests == []


def _optimize_with_model(tmp_path: Path, llm_server, *, stderr_on_terminal: bool) -> tuple[int, str, str, Path]:
    """`astra optimize rmsnorm --dry-run` against the loopback model whose every answer holds no code, the
    first after 6 s; (exit code, stdout, stderr, home)."""
    llm_server.push(reply(NO_CODE, delay_s=6.0), *[reply(NO_CODE) for _ in range(20)])
    home = cached_home(tmp_path / "home")
    env = {**os.environ, "ASTRA_HOME": str(home), "ASTRA_API_KEY": KEY}
    command = [sys.executable, "-m", "astra.cli", "optimize", "rmsnorm", "--dry-run", "--rounds", "2",
               "--model", MODEL, "--base-url", llm_server.url]
    if not stderr_on_terminal:
        done = subprocess.run(command, cwd=REPO, env=env, capture_output=True, text=True, timeout=600)
        return done.returncode, done.stdout, done.stderr, home
    return (*with_stderr_on_terminal(command, env, 600), home)


def test_a_model_that_answers_no_code_ends_the_run_with_its_own_exit_code(tmp_path, llm_server):
    code, out, err, home = _optimize_with_model(tmp_path, llm_server, stderr_on_terminal=False)
    assert code == 17, (code, err[-2000:], out[-2000:])
    assert "Traceback" not in err + out
    lines = err.strip().splitlines()
    assert len(lines) == 1, err  # no "waiting" line: stderr is not a terminal
    assert lines[0].startswith(f"astra optimize: model '{MODEL}' answered, but none of its 3 coding replies")
    assert "transcript.jsonl" in lines[0]
    (state,) = home.glob("runs/*/state.json")
    stopped = json.loads(state.read_text())["stopped"]
    assert stopped.startswith(f"stopped by the agent: model '{MODEL}' answered"), stopped
    assert "nothing left to try" not in stopped
    assert len(llm_server.chat_requests()) == 6  # testing, profiling, planning, three coding attempts: no retries


def test_a_slow_model_is_reported_while_astra_waits_on_a_terminal(tmp_path, llm_server):
    code, _, err, _ = _optimize_with_model(tmp_path, llm_server, stderr_on_terminal=True)
    assert code == 17, (code, err[-2000:])
    waiting = [line for line in err.splitlines() if "waiting for the model" in line]
    assert waiting and f"({MODEL} at {llm_server.url}, testing): 5s" in waiting[0], err
