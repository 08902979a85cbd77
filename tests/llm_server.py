"""A real OpenAI-compatible HTTP server on loopback that replays a script, for tests.

    def test_x(llm_server):                       # fixture: started, stopped after the test
        llm_server.push(reply("hello", prompt_tokens=12, completion_tokens=3))
        cfg = LLMConfig(base_url=llm_server.url, model=MODEL, api_key=KEY)
        ...
        assert llm_server.requests[0].headers["authorization"] == f"Bearer {KEY}"

`/v1/chat/completions` answers with the next `Step` of the script; before consuming a step it checks
the `Authorization` header (401 when it does not carry `key`) and the requested model (404 when it is
not in `models`), as real servers do. `/v1/models` lists `models`. Every request is recorded. An
exhausted script answers 400 ("script exhausted"), which fails fast and names the cause.

Import the fixture into a test module with `from tests.llm_server import llm_server  # noqa: F401`.
"""

from __future__ import annotations

import json
import threading
import time
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest

KEY = "sk-test-0123456789abcdefSECRET"
MODEL = "test-model"


@dataclass
class Step:
    """One scripted answer: a status, a body and headers, after `delay_s` seconds. `raw`, when given,
    is sent as the body byte for byte (an HTML error page, garbage) with `content_type`."""

    status: int = 200
    body: Any = field(default_factory=dict)  # any JSON value: a proxy may answer a list or a string
    headers: dict[str, str] = field(default_factory=dict)
    delay_s: float = 0.0
    raw: bytes | None = None
    content_type: str = "application/json"


def reply(text: str, prompt_tokens: int = 10, completion_tokens: int = 5, *, delay_s: float = 0.0) -> Step:
    """A normal chat completion with usage."""
    return Step(200, {
        "id": "chatcmpl-test", "object": "chat.completion", "created": int(time.time()), "model": MODEL,
        "choices": [{"index": 0, "message": {"role": "assistant", "content": text}, "finish_reason": "stop"}],
        "usage": {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens,
                  "total_tokens": prompt_tokens + completion_tokens},
    }, delay_s=delay_s)


def raw(body: bytes, content_type: str = "text/html", status: int = 200) -> Step:
    """A body sent as is: what a misconfigured proxy or a non-OpenAI server answers."""
    return Step(status, raw=body, content_type=content_type)


def completion(**fields: Any) -> Step:
    """A chat completion whose fields are replaced by `fields` (e.g. `choices="lol"`)."""
    base = reply("x").body
    return Step(200, {**base, **fields})


def echo_key(text: str) -> Step:
    """A reply whose text has `{key}` replaced by the API key the request carried (an endpoint that
    echoes secrets), filled in when the request arrives."""
    return Step(200, reply(text).body, headers={"x-echo-key": "1"})


def error(status: int, message: str, headers: dict[str, str] | None = None, code: str | None = None) -> Step:
    """An OpenAI-style error body."""
    return Step(status, {"error": {"message": message, "type": "test_error", "code": code}}, headers or {})


@dataclass
class Recorded:
    method: str
    path: str
    headers: dict[str, str]  # names in lower case
    body: dict[str, Any] | None


class LLMServer:
    """Loopback server; `url` is the base URL to give a client (ends in /v1)."""

    def __init__(self, *, key: str | None = KEY, models: tuple[str, ...] = (MODEL,)):
        self.key, self.models = key, list(models)
        self.script: list[Step] = []
        self.requests: list[Recorded] = []
        self._lock = threading.Lock()
        self._httpd = ThreadingHTTPServer(("127.0.0.1", 0), _handler(self))
        self._httpd.daemon_threads = True
        self._httpd.block_on_close = False
        self._thread = threading.Thread(target=self._httpd.serve_forever, args=(0.02,), name="llm-server",
                                        daemon=True)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self._httpd.server_address[1]}/v1"

    def push(self, *steps: Step) -> "LLMServer":
        with self._lock:
            self.script.extend(steps)
        return self

    def start(self) -> "LLMServer":
        self._thread.start()
        return self

    def stop(self) -> None:
        self._httpd.shutdown()
        self._httpd.server_close()

    def chat_requests(self) -> list[Recorded]:
        return [r for r in self.requests if r.path.endswith("/chat/completions")]

    def answer(self, method: str, path: str, headers: dict[str, str], body: dict | None) -> Step:
        with self._lock:
            self.requests.append(Recorded(method, path, headers, body))
            if self.key is not None and headers.get("authorization") != f"Bearer {self.key}":
                return error(401, "Incorrect API key provided.", code="invalid_api_key")
            if path.rstrip("/").endswith("/v1/models") and method == "GET":
                return Step(200, {"object": "list", "data": [
                    {"id": m, "object": "model", "created": 0, "owned_by": "test"} for m in self.models]})
            if not path.rstrip("/").endswith("/v1/chat/completions") or method != "POST":
                return error(404, f"no route {method} {path}")
            model = (body or {}).get("model")
            if model not in self.models:
                return error(404, f"The model `{model}` does not exist.", code="model_not_found")
            if not self.script:
                return error(400, "llm_server: script exhausted (push more steps)")
            step = self.script.pop(0)
            if step.headers.get("x-echo-key"):
                key = (headers.get("authorization") or "").removeprefix("Bearer ")
                body = json.loads(json.dumps(step.body).replace("{key}", key))
                step = Step(step.status, body, {}, step.delay_s)
            return step


def _handler(server: LLMServer) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"
        disable_nagle_algorithm = True  # headers and body go out in two writes: no 40 ms stalls

        def _serve(self) -> None:
            length = int(self.headers.get("Content-Length") or 0)
            raw = self.rfile.read(length) if length else b""
            body = json.loads(raw) if raw else None
            headers = {name.lower(): value for name, value in self.headers.items()}
            step = server.answer(self.command, self.path, headers, body)
            if step.delay_s:
                time.sleep(step.delay_s)
            data = step.raw if step.raw is not None else json.dumps(step.body).encode()
            try:
                self.send_response(step.status)
                self.send_header("Content-Type", step.content_type)
                self.send_header("Content-Length", str(len(data)))
                for name, value in step.headers.items():
                    self.send_header(name, value)
                self.end_headers()
                self.wfile.write(data)
            except (BrokenPipeError, ConnectionResetError):
                self.close_connection = True  # the client timed out and went away: expected

        do_GET = do_POST = _serve

        def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - stdlib signature
            """Quiet: tests read `server.requests` instead."""

    return Handler


@pytest.fixture
def llm_server():
    server = LLMServer().start()
    try:
        yield server
    finally:
        server.stop()
