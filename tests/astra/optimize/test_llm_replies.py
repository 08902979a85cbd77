"""Replies no OpenAI-compatible endpoint should send, through the real openai client against the real
loopback server: each is one LLMError line (exit 13) saying what came back and what to check. And
what a model says reaches terminals, reports and run files without control characters or the key."""

from __future__ import annotations

import json
from types import SimpleNamespace

import pytest

from astra.llm.client import Client, LLMConfig, LLMError, LLMUnavailable
from astra.optimize.evaluator import Evaluator
from astra.optimize.llm_agent import LLMAgent
from astra.optimize.loop import Budget, run_loop
from astra.optimize.ncu_profile import unavailable
from astra.optimize.rundir import RunDir
from astra.spec import model as spec_mod
from astra.text import one_line, printable
from tests.llm_server import KEY, MODEL, Step, completion, echo_key, raw, reply
from tests.verdicts import make_verdict

MESSAGES = [{"role": "user", "content": "Plan the next step."}]


def _client(url: str, **kw) -> Client:
    return Client(LLMConfig(base_url=url, model=MODEL, api_key=KEY, timeout_s=2.0, max_retries=0, **kw))


BAD_REPLIES = [
    (raw(b"<!DOCTYPE html><html><body><h1>502 Bad Gateway</h1></body></html>"), "an HTML page",
     "<!DOCTYPE html>"),
    (raw(b"<html>proxy login</html>", content_type="application/json"), "an HTML page", "proxy login"),
    (raw(b"\x00\x01garbage \x1b[2J\xff\xfe", content_type="application/json"), "text that is not JSON", "garbage"),
    (raw(b"", content_type="application/json"), "an empty body", ""),
    (Step(200, [1, 2, 3]), "a JSON list", "[1, 2, 3]"),
    (Step(200, "just a string"), "a JSON string", "just a string"),
    (Step(200, None), "a JSON null", "null"),
    (completion(choices="lol"), "`choices` is a string", "chatcmpl-test"),
    (completion(choices=None), "`choices` is missing", "chatcmpl-test"),
    (completion(choices=[5]), "first choice has no `message`", "chatcmpl-test"),
    (completion(choices=[{"index": 0, "finish_reason": "stop"}]), "first choice has no `message`", "chatcmpl"),
    (completion(choices=[{"message": "hi"}]), "first choice has no `message`", "chatcmpl"),
    (completion(choices=[{"message": {"role": "assistant", "content": 5}}]), "`content` is a number", "chatcmpl"),
    (completion(choices=[{"message": {"content": ["a", "b"]}}]), "`content` is a list", "chatcmpl"),
    (Step(200, {"error": {"message": "upstream down"}}), "an error object with status 200", "upstream down"),
]


@pytest.mark.parametrize("step,what,shown", BAD_REPLIES, ids=[w for _, w, _ in BAD_REPLIES])
def test_garbage_replies_are_one_llm_error(llm_server, step, what, shown):
    llm_server.push(step)
    with pytest.raises(LLMError) as err:
        _client(llm_server.url).chat(MESSAGES, role="planning")
    message = str(err.value)
    assert err.value.exit_code == 13
    assert "\n" not in message and "\x1b" not in message and "\x00" not in message
    assert what in message and shown in message
    assert "check --base-url" in message and "/v1" in message
    assert len(message) < 400


def test_a_reply_with_no_choices_and_odd_usage(llm_server):
    llm_server.push(completion(choices=[]))
    with pytest.raises(LLMUnavailable, match="returned no choices"):
        _client(llm_server.url).chat(MESSAGES, role="planning")
    llm_server.push(completion(usage="lol"), completion(usage={"prompt_tokens": "abc", "completion_tokens": -3}))
    client = _client(llm_server.url)
    assert client.chat(MESSAGES, role="planning").text == "x"
    assert client.chat(MESSAGES, role="planning").prompt_tokens == 0
    assert client.usage.total().tokens == 0


def test_a_null_content_is_an_empty_reply(llm_server):
    llm_server.push(completion(choices=[{"message": {"role": "assistant", "content": None}}]))
    assert _client(llm_server.url).chat(MESSAGES, role="planning").text == ""


def test_the_key_in_a_garbage_reply_is_not_shown(llm_server):
    llm_server.push(echo_key("{key}"), raw(f"<html>your key is {KEY}</html>".encode()))
    client = _client(llm_server.url)
    client.chat(MESSAGES, role="planning")
    with pytest.raises(LLMError) as err:
        client.chat(MESSAGES, role="planning")
    assert KEY not in str(err.value) and "***" in str(err.value)


def test_printable_strips_terminal_control():
    assert printable("a\x1b[2Jb\x1b]0;pwned\x07c\x9b31md\re\x00f\x85g") == "abcdefg"
    assert printable("keeps\nnewlines\tand tabs") == "keeps\nnewlines\tand tabs"
    assert one_line("two\nlines\x1b[31m red", 12) == "two lines..."


# ---- the agent's texts in the run directory, the terminal and the reports


def _edit(search: str, replace: str) -> str:
    return f"<<<<<<< SEARCH\n{search}\n=======\n{replace}\n>>>>>>> REPLACE\n"


ORIGINAL = "// kernel\n__global__ void k(float* x) { x[0] = 1.0f; }\n"


def test_a_key_echoing_endpoint_leaves_no_key_under_the_run_directory(llm_server, capsys):
    from astra.cli.optimize import _printer
    from astra.report import run_html, run_text

    spec = spec_mod.load("rmsnorm")
    plan = json.dumps({"idea": "use the key {key} \x1b[2J\x1b]0;pwned\x07 now", "change": "x", "stop": False})
    llm_server.push(
        reply("[]"),                                                              # testing
        echo_key('{"profile": "the key is {key}"}'),                              # profiling
        echo_key(plan),                                                           # planning
        echo_key(_edit("// kernel", "// kernel {key}\x1b[2J")),                   # coding
        reply("{}"),                                                              # round 2: profiling
        reply('{"stop": true, "rationale": "done \\u001b[2J"}'),                  # planning: stop
    )
    run = RunDir.create(spec.name, "0.5.23", f"llm:{MODEL}", ORIGINAL)
    client = Client(LLMConfig(base_url=llm_server.url, model=MODEL, api_key=KEY, timeout_s=2.0, max_retries=0),
                    transcript=run.transcript)
    speeds = iter([1.0, 1.06])
    evaluator = Evaluator(lambda source, label, **_: make_verdict({"decode": next(speeds)}))
    agent = LLMAgent(client, spec, SimpleNamespace(version="0.5.23"), evaluator=evaluator,
                     profiler=lambda *_: unavailable("test"))
    state = run_loop(run, agent, evaluator, Budget(rounds=3, patience=3), events=_printer)

    assert [h.name for h in state.history] == ["llm:r0:use-the-key-now"]
    for path in run.root.rglob("*"):
        if path.is_file():
            data = path.read_bytes()
            assert KEY.encode() not in data, path
            if path.name != "kernel.cuh":  # the model's code is stored as written (nvcc judges it)
                assert b"\x1b" not in data, path
    meta = json.loads((run.root / "candidates" / "001" / "meta.json").read_text())
    assert meta["description"] == "use the key *** now (target band: decode)"
    shown = capsys.readouterr().out
    assert "\x1b" not in shown and KEY not in shown and "use the key *** now" in shown
    for text in (run_text.summary(run), run_html.render(run)):
        assert "\x1b" not in text and KEY not in text


@pytest.mark.network
@pytest.mark.skipif(__import__("shutil").which("nvcc") is None, reason="needs nvcc")
def test_optimize_with_an_html_answering_endpoint_is_one_line(llm_server, sglang_0523):
    import os
    import subprocess
    import sys

    llm_server.push(raw(b"<html><head><title>Sign in</title></head>\x1b[2J</html>"))
    proc = subprocess.run([sys.executable, "-m", "astra.cli", "optimize", "fused_add_rmsnorm", "--dry-run",
                           "--model", MODEL, "--base-url", llm_server.url, "--rounds", "1"],
                          capture_output=True, text=True, env={**os.environ, "ASTRA_API_KEY": KEY}, timeout=300)
    assert proc.returncode == 13, proc.stderr
    errors = [line for line in proc.stderr.splitlines() if line.startswith("astra optimize:")]
    assert len(errors) == 1 and "answered an HTML page" in errors[0] and "check --base-url" in errors[0]
    assert "Traceback" not in proc.stderr and "\x1b" not in proc.stderr + proc.stdout
