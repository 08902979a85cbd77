"""LLM access: any OpenAI-compatible endpoint (OpenAI, vLLM, SGLang's server, Ollama) via `openai`.

    cfg = resolve_config({"model": "gpt-4.1"}, None)     # flags > $ASTRA_HOME/config.yaml > env
    client = Client(cfg, transcript=run_dir / "llm.jsonl")
    reply = client.chat([{"role": "user", "content": "..."}], role="planning")
    client.usage.summary()   # "3 calls, 12,345 tokens (11,000 in, 1,345 out), $0.0321"

Retries are ours, not the SDK's (`max_retries=0`), so each attempt is logged and testable: 408, 409,
429, 5xx, timeouts and connection errors back off exponentially with jitter (a `Retry-After` header
wins); 400, 401, 403 and 404 fail at once. Every failure becomes an `LLMError` with one line that
says what to do. The API key is never written: not in errors, logs, transcripts nor `repr`.
"""

from __future__ import annotations

import json
import logging
import os
import random
import re
import sys
import threading
import time
from contextlib import contextmanager
from dataclasses import dataclass, field, fields
from datetime import datetime, timezone
from email.utils import parsedate_to_datetime
from pathlib import Path
from typing import Any, Callable

import openai

from astra import paths
from astra.config import read_config_file, url_problem
from astra.errors import AstraError, BudgetSpent
from astra.llm.usage import Reply, Transcript, Usage, price_of

log = logging.getLogger("astra.llm.client")

OPENAI_URL = "https://api.openai.com/v1"
WAITING_EVERY_S = 5.0  # while a request is unanswered, a "waiting for the model" line this often
RETRY_STATUS = {408, 409, 429}  # and every 5xx
_SECRET_RE = re.compile(r"(sk-[A-Za-z0-9_\-]{3})[A-Za-z0-9_\-*]{6,}")


class LLMError(AstraError):
    exit_code = 13


class LLMConfigError(LLMError):
    """A missing or contradictory setting (no model, a key in config.yaml, ...)."""


class LLMUnreachable(LLMError):
    """Connection refused, DNS, TLS, or timeouts on every attempt."""


class LLMAuthError(LLMError):
    """401/403: the key is wrong or lacks access."""


class LLMModelNotFound(LLMError):
    """404: no such model at the endpoint, or the base URL is not an OpenAI-compatible API."""


class LLMRequestError(LLMError):
    """400/422 and other non-retryable statuses: the request itself is refused."""


class LLMUnavailable(LLMError):
    """429/5xx on every attempt, or a reply without choices."""


class LLMBadReply(LLMError):
    """A 200 answer that is not an OpenAI chat completion (an HTML page, garbage, a wrong shape)."""


class LLMNoUsableReply(LLMError):
    """The model answered, but nothing in its answers could be used (no edit that applies, no code): not
    the same as an agent with nothing left to try (exit 0), nor an endpoint that failed (13)."""

    exit_code = 17


class LLMBudgetExceeded(LLMError, BudgetSpent):
    """The token or cost budget is spent; the run stops cleanly with what it has."""

    exit_code = 10  # 8 and 9 belong to the patch errors


@dataclass
class LLMConfig:
    """Where and how to call the model. `api_key` comes from flags or the environment only."""

    base_url: str | None = None
    model: str | None = None
    api_key: str | None = field(default=None, repr=False)
    timeout_s: float = 120.0
    max_retries: int = 4
    temperature: float | None = None
    max_tokens: int | None = None
    budget_tokens: int | None = None
    budget_usd: float | None = None
    backoff_base_s: float = 1.0  # first retry waits about this long; tests use a few ms
    backoff_max_s: float = 30.0
    retry_after_max_s: float = 120.0  # longest Retry-After honoured

    @property
    def url(self) -> str:
        return self.base_url or OPENAI_URL


def _env(*names: str) -> str | None:
    for name in names:
        if os.environ.get(name):
            return os.environ[name]
    return None


def _env_name(*names: str) -> str:
    return next((name for name in names if os.environ.get(name)), names[0])


def resolve_config(flags: dict[str, Any], config_file: Path | None = None) -> LLMConfig:
    """Merge settings: `flags` (None values ignored) > `config_file` (default
    `$ASTRA_HOME/config.yaml`, used when it exists) > environment (`ASTRA_BASE_URL`,
    `OPENAI_BASE_URL`, `ASTRA_API_KEY`, `OPENAI_API_KEY`, `ASTRA_MODEL`)."""
    known = {f.name for f in fields(LLMConfig)}
    bad = sorted(set(flags) - known)
    if bad:
        raise LLMConfigError(f"unknown LLM setting(s) {bad}")
    merged: dict[str, Any] = {
        "base_url": _env("ASTRA_BASE_URL", "OPENAI_BASE_URL"),
        "api_key": _env("ASTRA_API_KEY", "OPENAI_API_KEY"),
        "model": _env("ASTRA_MODEL"),
    }
    url_from = _env_name("ASTRA_BASE_URL", "OPENAI_BASE_URL")
    path = config_file if config_file is not None else paths.astra_home() / "config.yaml"
    if path.exists() or path.is_symlink():
        settings = read_config_file(path, LLMConfigError)
        merged.update({k: v for k, v in settings.items() if v is not None})
        url_from = f"`base_url` in {path}" if settings.get("base_url") is not None else url_from
    merged.update({k: v for k, v in flags.items() if v is not None})
    url_from = "--base-url" if flags.get("base_url") is not None else url_from
    if merged.get("base_url") is not None and (wanted := url_problem(merged["base_url"])):
        raise LLMConfigError(f"{url_from} {merged['base_url']!r}: not a usable endpoint; give {wanted}")
    return LLMConfig(**{k: v for k, v in merged.items() if v is not None})


def waiting_on_terminal(line: str) -> None:
    """A "waiting for the model" line on stderr, only when stderr is a terminal (a log file or a pipe gets none)."""
    if sys.stderr.isatty():
        print(line, file=sys.stderr, flush=True)


class Client:
    """Chat with one model at one endpoint, with retries, budgets, usage and a transcript. While a request is
    unanswered, `waiting` gets a line every `waiting_every_s` seconds (by default on a terminal's stderr)."""

    def __init__(self, cfg: LLMConfig, *, transcript: Path | None = None,
                 sleep: Callable[[float], None] = time.sleep,
                 waiting: Callable[[str], None] | None = waiting_on_terminal, waiting_every_s: float = WAITING_EVERY_S):
        if not cfg.model:
            raise LLMConfigError("no model named: pass --model, set `model:` in $ASTRA_HOME/config.yaml "
                                 "or ASTRA_MODEL")
        self.cfg = cfg
        self.price = price_of(cfg.model)
        if cfg.budget_usd is not None and self.price is None:
            raise LLMConfigError(f"--budget-usd needs a price, and model '{cfg.model}' has none in "
                                 "astra/data/prices.yaml; use --budget-tokens")
        self.usage = Usage()
        self._carried = (0, 0.0)  # tokens and cost spent by earlier sessions of the same run
        self.transcript = Transcript(transcript, self.redact) if transcript else None
        self._sleep = sleep
        self._waiting, self._waiting_every_s = waiting, waiting_every_s
        self._sdk = openai.OpenAI(base_url=cfg.url, api_key=cfg.api_key or "not-needed",
                                  timeout=cfg.timeout_s, max_retries=0)

    def redact(self, text: str) -> str:
        """`text` without the key (and anything shaped like an OpenAI key)."""
        if self.cfg.api_key:
            text = text.replace(self.cfg.api_key, "***")
        return _SECRET_RE.sub(r"\1***", text)

    def carry(self, tokens: int, cost_usd: float) -> None:
        """Count what earlier sessions of the same run spent against the budgets (a resumed run)."""
        self._carried = (int(tokens or 0), float(cost_usd or 0.0))

    def check_budget(self) -> None:
        """Raise LLMBudgetExceeded when the spend so far leaves no room for another call."""
        spent, cfg = self.usage.total(), self.cfg
        tokens, cost = spent.tokens + self._carried[0], spent.cost_usd + self._carried[1]
        if cfg.budget_tokens is not None and tokens >= cfg.budget_tokens:
            raise LLMBudgetExceeded(f"token budget spent: {tokens:,} of {cfg.budget_tokens:,} tokens "
                                    f"over {spent.calls} calls; raise --budget-tokens to go on")
        if cfg.budget_usd is not None and cost >= cfg.budget_usd:
            raise LLMBudgetExceeded(f"cost budget spent: ${cost:.4f} of ${cfg.budget_usd:.4f} "
                                    f"over {spent.calls} calls; raise --budget-usd to go on")

    def chat(self, messages: list[dict[str, str]], *, role: str) -> Reply:
        """One completion. Raises an LLMError subclass; writes the exchange (or failure) to the transcript."""
        self.check_budget()
        began, attempts = time.monotonic(), []
        try:
            with self._reporting_wait(role, began):
                completion = self._with_retries(messages, role, attempts)
            reply = self._reply(completion, len(attempts) + 1, time.monotonic() - began)
        except LLMError as err:
            if self.transcript:
                self.transcript.write(role=role, model=self.cfg.model, messages=messages, error=str(err),
                                      attempts=attempts, seconds=time.monotonic() - began)
            raise
        self.usage.add(role, reply)
        if self.transcript:
            self.transcript.write(role=role, model=self.cfg.model, messages=messages, reply=reply,
                                  attempts=attempts, seconds=reply.seconds)
        return reply

    # ------------------------------------------------------------------ internals

    @contextmanager
    def _reporting_wait(self, role: str, began: float):
        """While the block runs, a line every `waiting_every_s` seconds saying how long the model has taken."""
        if self._waiting is None:
            yield
            return
        done = threading.Event()

        def report() -> None:
            while not done.wait(self._waiting_every_s):
                self._waiting(f"astra: waiting for the model ({self.cfg.model} at {self.cfg.url}, {role}): "
                              f"{time.monotonic() - began:.0f}s (timeout {self.cfg.timeout_s:g}s per attempt)")

        watcher = threading.Thread(target=report, name="astra-llm-waiting", daemon=True)
        watcher.start()
        try:
            yield
        finally:
            done.set()
            watcher.join()

    def _with_retries(self, messages: list[dict[str, str]], role: str, failures: list[str]) -> Any:
        kwargs: dict[str, Any] = {"model": self.cfg.model, "messages": messages}
        if self.cfg.temperature is not None:
            kwargs["temperature"] = self.cfg.temperature
        if self.cfg.max_tokens is not None:
            kwargs["max_tokens"] = self.cfg.max_tokens
        total = self.cfg.max_retries + 1
        for attempt in range(1, total + 1):
            try:
                return self._sdk.chat.completions.with_raw_response.create(**kwargs).http_response
            except (openai.APIConnectionError, openai.APIStatusError) as err:
                note, problem, retry_after = self._classify(err)
                failures.append(note)
                if retry_after is None or attempt == total:
                    log.warning("llm %s attempt %d/%d failed: %s; giving up", role, attempt, total, note)
                    raise problem from None
                delay = retry_after or self._backoff(attempt)
                log.info("llm %s attempt %d/%d failed: %s; retrying in %.2fs", role, attempt, total, note, delay)
                self._sleep(delay)
        raise AssertionError("unreachable")

    def _backoff(self, attempt: int) -> float:
        cap = min(self.cfg.backoff_max_s, self.cfg.backoff_base_s * 2 ** (attempt - 1))
        return cap * random.uniform(0.5, 1.0)

    def _classify(self, err: Exception) -> tuple[str, LLMError, float | None]:
        """What went wrong in one attempt (a short note), the error to raise if we stop now, and the
        wait before a retry (0: back off; None: never retry)."""
        url, model, tries = self.cfg.url, self.cfg.model, self.cfg.max_retries + 1
        if isinstance(err, openai.APITimeoutError):
            return (f"no answer within {self.cfg.timeout_s:g}s",
                    LLMUnreachable(f"the LLM endpoint at {url} did not answer within {self.cfg.timeout_s:g}s "
                                   f"in {tries} attempts; check --base-url, or raise `timeout_s:` in $ASTRA_HOME/config.yaml"), 0.0)
        if isinstance(err, openai.APIConnectionError):
            cause = self.redact(str(err.__cause__ or err))
            return (f"connection failed: {cause}",
                    LLMUnreachable(f"cannot reach the LLM endpoint at {url}: {cause}; check --base-url"), 0.0)
        assert isinstance(err, openai.APIStatusError)
        status, detail = err.status_code, self.redact(_detail(err))
        note = f"{status}: {detail}"
        if status in (401, 403):
            what = "rejected the API key" if self.cfg.api_key else "needs an API key and none is set"
            return note, LLMAuthError(f"the endpoint at {url} {what} ({note}); set ASTRA_API_KEY or "
                                      "OPENAI_API_KEY"), None
        if status == 404:
            return note, LLMModelNotFound(self._not_found(detail)), None
        if status in RETRY_STATUS or status >= 500:
            return note, LLMUnavailable(f"the LLM endpoint at {url} kept failing ({note}) after {tries} "
                                        "attempts; try again later"), _retry_after(err.response,
                                                                                  self.cfg.retry_after_max_s)
        return note, LLMRequestError(f"the LLM endpoint at {url} refused the request for model "
                                     f"'{model}' ({note})"), None

    def _not_found(self, detail: str) -> str:
        """Tell a missing model from a wrong base URL by listing the endpoint's models."""
        url, model = self.cfg.url, self.cfg.model
        try:
            names = sorted(m.id for m in self._sdk.models.list())
        except (openai.APIConnectionError, openai.APIStatusError):
            return (f"model '{model}' does not exist at {url} (404: {detail}), or {url} is not an "
                    "OpenAI-compatible API (it usually ends in /v1); check --model and --base-url")
        if model in names:
            return f"the endpoint at {url} answered 404 for model '{model}', which it lists ({detail}); check --base-url"
        shown = ", ".join(names[:12]) + (" ..." if len(names) > 12 else "")
        return f"model '{model}' does not exist at {url} (404); models there: {shown or 'none'}; check --model"

    def _reply(self, response: Any, attempts: int, seconds: float) -> Reply:
        """The reply in an HTTP answer, checked field by field: what came back is never trusted."""
        data = self._completion(bytes(response.content or b""), response.headers.get("content-type", ""))
        choice = data["choices"][0]
        usage = data.get("usage") if isinstance(data.get("usage"), dict) else {}
        prompt, done = _count(usage.get("prompt_tokens")), _count(usage.get("completion_tokens"))
        cost = None if self.price is None else (prompt * self.price[0] + done * self.price[1]) / 1e6
        finish = choice.get("finish_reason")
        model = data.get("model")
        return Reply(text=choice["message"].get("content") or "", prompt_tokens=prompt, completion_tokens=done,
                     cost_usd=cost, seconds=seconds, attempts=attempts, model=model if isinstance(model, str) else "",
                     finish_reason=finish if isinstance(finish, str) else None)

    def _completion(self, body: bytes, content_type: str) -> dict:
        """The parsed completion, or an LLMBadReply saying what came back and what to check."""
        text = body.decode("utf-8", errors="replace")
        if not text.strip():
            self._bad("an empty body", text)
        try:
            data = json.loads(text)
        except (json.JSONDecodeError, RecursionError):
            looks_html = "html" in content_type.lower() or text.lstrip()[:15].lower().startswith(("<!doctype", "<html"))
            self._bad("an HTML page (a proxy's or web server's, not the API)" if looks_html else "text that is not JSON",
                      text)
        if not isinstance(data, dict):
            self._bad(f"a JSON {_json_kind(data)}, not a chat completion object", text)
        if "error" in data and "choices" not in data:
            self._bad("an error object with status 200", text)
        choices = data.get("choices")
        if not isinstance(choices, list):
            self._bad("a completion whose `choices` is " + ("missing" if choices is None else
                                                             f"a {_json_kind(choices)}, not a list"), text)
        if not choices:
            raise LLMUnavailable(f"the LLM endpoint at {self.cfg.url} returned no choices")
        choice = choices[0]
        if not isinstance(choice, dict) or not isinstance(choice.get("message"), dict):
            self._bad("a completion whose first choice has no `message` object", text)
        content = choice["message"].get("content")
        if content is not None and not isinstance(content, str):
            self._bad(f"a message whose `content` is a {_json_kind(content)}, not text", text)
        return data

    def _bad(self, what: str, body: str) -> None:
        from astra.text import one_line

        snippet = one_line(self.redact(body), 80)
        raise LLMBadReply(f"the LLM endpoint at {self.cfg.url} answered {what}: {snippet!r}; check --base-url "
                          "(it must be an OpenAI-compatible API, usually ending in /v1)")


def _json_kind(value: Any) -> str:
    return {dict: "object", list: "list", str: "string", bool: "boolean", type(None): "null"}.get(
        type(value), "number")


def _count(value: Any) -> int:
    """A token count from a reply's `usage` (anything else counts as 0)."""
    return value if isinstance(value, int) and not isinstance(value, bool) and value >= 0 else 0


def _detail(err: openai.APIStatusError) -> str:
    body = err.body
    if isinstance(body, dict):
        body = body.get("message") or body.get("error") or body
    text = str(body if body else err.message)
    return text if len(text) <= 200 else text[:200] + "..."


def _retry_after(response: Any, ceiling: float) -> float:
    """Seconds the server asked us to wait (`retry-after-ms` or `Retry-After` in seconds), else 0."""
    headers = getattr(response, "headers", None) or {}
    for name, scale in (("retry-after-ms", 1e-3), ("retry-after", 1.0)):
        value = headers.get(name)
        if value is None:
            continue
        try:
            seconds = float(value) * scale
        except ValueError:
            try:  # an HTTP date
                seconds = (parsedate_to_datetime(value) - datetime.now(timezone.utc)).total_seconds()
            except (TypeError, ValueError):
                log.debug("ignoring unparseable %s header %r", name, value)
                continue
        return min(max(seconds, 0.0), ceiling)
    return 0.0
