"""astra.llm.client against a real loopback OpenAI-compatible server, through the real openai package."""

from __future__ import annotations

import json
import logging
import socket
import time

import pytest

from astra.llm.client import (
    Client,
    LLMAuthError,
    LLMBudgetExceeded,
    LLMConfig,
    LLMConfigError,
    LLMModelNotFound,
    LLMRequestError,
    LLMUnavailable,
    LLMUnreachable,
    price_of,
    resolve_config,
)
from tests.llm_server import KEY, MODEL, error, reply

MESSAGES = [{"role": "system", "content": "You optimize CUDA kernels."},
            {"role": "user", "content": "Plan the next step."}]


def config(url: str, **overrides) -> LLMConfig:
    base = dict(base_url=url, model=MODEL, api_key=KEY, timeout_s=0.5, max_retries=3,
                backoff_base_s=0.005, backoff_max_s=0.02)
    return LLMConfig(**{**base, **overrides})


def test_success_with_usage_and_transcript(llm_server, tmp_path):
    llm_server.push(reply("first", 100, 20), reply("second", 50, 10))
    client = Client(config(llm_server.url, temperature=0.2, max_tokens=256), transcript=tmp_path / "llm.jsonl")
    one = client.chat(MESSAGES, role="planning")
    two = client.chat(MESSAGES, role="coding")
    assert (one.text, one.prompt_tokens, one.completion_tokens, one.attempts) == ("first", 100, 20, 1)
    assert two.text == "second"
    assert one.cost_usd is None and one.finish_reason == "stop"
    total = client.usage.total()
    assert (total.calls, total.prompt_tokens, total.completion_tokens) == (2, 150, 30)
    assert client.usage.by_role["coding"].tokens == 60
    assert client.usage.summary() == "2 calls, 180 tokens (150 in, 30 out), unpriced"
    sent = llm_server.chat_requests()[0]
    assert sent.headers["authorization"] == f"Bearer {KEY}"
    assert sent.body == {"model": MODEL, "messages": MESSAGES, "temperature": 0.2, "max_tokens": 256}
    lines = [json.loads(line) for line in (tmp_path / "llm.jsonl").read_text().splitlines()]
    assert [(r["role"], r["reply"], r["prompt_tokens"], r["attempts"]) for r in lines] == [
        ("planning", "first", 100, 1), ("coding", "second", 50, 1)]
    assert lines[0]["messages"] == MESSAGES


def test_429_retry_after_then_success(llm_server):
    llm_server.push(error(429, "Rate limit reached", {"Retry-After": "0.2"}), reply("ok"))
    began = time.monotonic()
    answer = Client(config(llm_server.url)).chat(MESSAGES, role="testing")
    assert answer.text == "ok" and answer.attempts == 2
    assert time.monotonic() - began >= 0.2  # the server's Retry-After was honoured
    assert len(llm_server.chat_requests()) == 2


def test_500_then_success_and_persistent_500(llm_server):
    llm_server.push(error(500, "boom"), reply("ok"))
    client = Client(config(llm_server.url, max_retries=2))
    assert client.chat(MESSAGES, role="coding").attempts == 2
    llm_server.push(*[error(503, "overloaded")] * 3)
    with pytest.raises(LLMUnavailable, match=r"kept failing \(503: overloaded\) after 3 attempts"):
        client.chat(MESSAGES, role="coding")
    assert len(llm_server.chat_requests()) == 5


def test_timeout_then_success(llm_server, caplog):
    llm_server.push(reply("late", delay_s=1.0), reply("ok"))
    with caplog.at_level(logging.INFO, logger="astra.llm.client"):
        answer = Client(config(llm_server.url, timeout_s=0.3)).chat(MESSAGES, role="profiling")
    assert answer.text == "ok" and answer.attempts == 2
    assert "attempt 1/4 failed: no answer within 0.3s; retrying in" in caplog.text


def test_timeouts_on_every_attempt(llm_server):
    llm_server.push(*[reply("late", delay_s=0.6)] * 2)
    with pytest.raises(LLMUnreachable, match="did not answer within 0.2s"):
        Client(config(llm_server.url, timeout_s=0.2, max_retries=1)).chat(MESSAGES, role="coding")


def test_wrong_key_fails_fast(llm_server):
    client = Client(config(llm_server.url, api_key="sk-wrong-key-abcdefghijkl"))
    with pytest.raises(LLMAuthError, match=r"rejected the API key \(401") as caught:
        client.chat(MESSAGES, role="coding")
    assert len(llm_server.chat_requests()) == 1  # no retry
    assert "sk-wrong-key-abcdefghijkl" not in str(caught.value)


def test_unknown_model_lists_models(llm_server):
    with pytest.raises(LLMModelNotFound, match=r"model 'gpt-9' does not exist at .*\(404\); models there: "
                                               r"test-model"):
        Client(config(llm_server.url, model="gpt-9")).chat(MESSAGES, role="coding")
    assert len(llm_server.chat_requests()) == 1


def test_wrong_base_url_path(llm_server):
    url = llm_server.url.removesuffix("/v1") + "/api"
    with pytest.raises(LLMModelNotFound, match="not an OpenAI-compatible API"):
        Client(config(url)).chat(MESSAGES, role="coding")


def test_bad_request_fails_fast(llm_server):
    llm_server.push(error(400, "max_tokens is too large"))
    with pytest.raises(LLMRequestError, match=r"refused the request for model 'test-model' \(400: max_tokens"):
        Client(config(llm_server.url)).chat(MESSAGES, role="coding")
    assert len(llm_server.chat_requests()) == 1


def test_unreachable_port():
    with socket.socket() as sock:  # a port nobody listens on
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    url = f"http://127.0.0.1:{port}/v1"
    with pytest.raises(LLMUnreachable, match=f"cannot reach the LLM endpoint at {url}: .*; check --base-url"):
        Client(config(url, max_retries=1)).chat(MESSAGES, role="coding")


def test_token_budget(llm_server):
    llm_server.push(reply("a", 60, 10), reply("b", 30, 5))
    client = Client(config(llm_server.url, budget_tokens=100))
    client.chat(MESSAGES, role="coding")
    client.chat(MESSAGES, role="coding")  # 70 spent < 100: may start
    with pytest.raises(LLMBudgetExceeded, match="token budget spent: 105 of 100 tokens over 2 calls"):
        client.chat(MESSAGES, role="coding")
    assert len(llm_server.chat_requests()) == 2


def test_cost_budget_and_prices(llm_server):
    llm_server.models.append("gpt-4o-mini")
    llm_server.push(reply("a", 1_000_000, 1_000_000))
    client = Client(config(llm_server.url, model="gpt-4o-mini", budget_usd=0.5))
    assert client.chat(MESSAGES, role="planning").cost_usd == pytest.approx(0.75)
    assert client.usage.summary().endswith("$0.7500")
    with pytest.raises(LLMBudgetExceeded, match=r"cost budget spent: \$0.7500 of \$0.5000"):
        client.chat(MESSAGES, role="planning")
    assert price_of("gpt-4o-2024-08-06") == (2.5, 10.0) and price_of("openai/o4-mini") == (1.1, 4.4)
    assert price_of("Qwen/Qwen3-32B") is None
    with pytest.raises(LLMConfigError, match="has none in astra/data/prices.yaml"):
        Client(config(llm_server.url, budget_usd=1.0))


def test_key_never_written(llm_server, tmp_path, caplog):
    """The key reaches the server's Authorization header and nowhere else we write."""
    llm_server.push(error(429, f"slow down, {KEY}"), reply(f"echo {KEY}"), error(400, f"bad key {KEY}"))
    path = tmp_path / "llm.jsonl"
    client = Client(config(llm_server.url), transcript=path)
    messages = [{"role": "user", "content": f"the key is {KEY}"}]
    with caplog.at_level(logging.DEBUG):
        client.chat(messages, role="coding")
        with pytest.raises(LLMRequestError) as caught:
            client.chat(messages, role="coding")
        wrong = Client(config(llm_server.url, api_key=KEY + "x"), transcript=path)
        with pytest.raises(LLMAuthError) as auth:
            wrong.chat(messages, role="coding")
    assert all(r.headers["authorization"] == f"Bearer {KEY}" for r in llm_server.chat_requests()[:3])
    written = path.read_text() + caplog.text + str(caught.value) + str(auth.value)
    written += repr(client.cfg) + json.dumps(client.usage.to_dict())
    assert KEY[:-3] not in written
    assert "***" in path.read_text()


def test_a_key_without_a_model_is_refused():
    with pytest.raises(LLMConfigError, match="no model named"):
        Client(LLMConfig(api_key="sk-x"))


ENV = ("ASTRA_BASE_URL", "OPENAI_BASE_URL", "ASTRA_API_KEY", "OPENAI_API_KEY", "ASTRA_MODEL")


@pytest.fixture
def env(monkeypatch, tmp_path):
    for name in ENV:
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("ASTRA_HOME", str(tmp_path))
    return monkeypatch


def test_config_precedence(env, tmp_path):
    env.setenv("OPENAI_BASE_URL", "http://env-openai/v1")
    env.setenv("OPENAI_API_KEY", "sk-from-openai-env")
    env.setenv("ASTRA_MODEL", "env-model")
    cfg = resolve_config({}, None)
    assert (cfg.base_url, cfg.model, cfg.api_key) == ("http://env-openai/v1", "env-model", "sk-from-openai-env")
    env.setenv("ASTRA_BASE_URL", "http://env-astra/v1")
    env.setenv("ASTRA_API_KEY", "sk-from-astra-env")
    cfg = resolve_config({}, None)
    assert (cfg.base_url, cfg.api_key) == ("http://env-astra/v1", "sk-from-astra-env")
    (tmp_path / "config.yaml").write_text("base_url: http://file/v1\nmodel: file-model\nbudget_tokens: 5000\n")
    cfg = resolve_config({}, None)  # default file: $ASTRA_HOME/config.yaml
    assert (cfg.base_url, cfg.model, cfg.budget_tokens) == ("http://file/v1", "file-model", 5000)
    cfg = resolve_config({"model": "flag-model", "base_url": None, "timeout_s": 5}, None)
    assert (cfg.base_url, cfg.model, cfg.timeout_s) == ("http://file/v1", "flag-model", 5)
    other = tmp_path / "other.yaml"
    other.write_text("model: other-model\n")
    assert resolve_config({}, other).model == "other-model"
    assert "sk-from-astra-env" not in repr(cfg)


def test_config_file_refuses_keys(env, tmp_path):
    (tmp_path / "config.yaml").write_text("model: m\napi_key: sk-in-a-file-123456789\n")
    with pytest.raises(LLMConfigError, match="holds `api_key`; Astra never reads API keys from files") as caught:
        resolve_config({}, None)
    assert "sk-in-a-file" not in str(caught.value)
    (tmp_path / "config.yaml").write_text("modle: m\n")
    with pytest.raises(LLMConfigError, match=r"unknown setting\(s\) \['modle'\]"):
        resolve_config({}, None)
    with pytest.raises(LLMConfigError, match="unknown LLM setting"):
        resolve_config({"modle": "x"}, None)


def test_missing_key_is_named(llm_server):
    with pytest.raises(LLMAuthError, match=r"needs an API key and none is set \(401"):
        Client(config(llm_server.url, api_key=None)).chat(MESSAGES, role="coding")
    assert llm_server.chat_requests()[0].headers["authorization"] == "Bearer not-needed"
