"""Token and cost accounting for LLM calls, and the transcript of every exchange (never a key)."""

from __future__ import annotations

import json
import re
import threading
from dataclasses import asdict, dataclass
from datetime import datetime, timezone
from functools import lru_cache
from pathlib import Path
from typing import Any, Callable

import yaml

from astra import paths


@dataclass
class Reply:
    """One chat completion: its text, token counts, cost and how it went."""

    text: str
    prompt_tokens: int
    completion_tokens: int
    cost_usd: float | None  # None: the model has no price in prices.yaml
    seconds: float
    attempts: int
    model: str = ""
    finish_reason: str | None = None


PRICES = paths.DATA_DIR / "prices.yaml"

@lru_cache(maxsize=1)
def _prices() -> dict[str, dict[str, float]]:
    return yaml.safe_load(PRICES.read_text()) or {}


def price_of(model: str | None) -> tuple[float, float] | None:
    """(USD per 1M input tokens, per 1M output tokens), or None when unpriced. A provider prefix
    (`openai/`) and a dated snapshot suffix (`-2024-08-06`) are ignored."""
    if not model:
        return None
    name = re.sub(r"-\d{4}-\d{2}-\d{2}$", "", model.rsplit("/", 1)[-1])
    entry = _prices().get(name)
    return None if entry is None else (float(entry["input"]), float(entry["output"]))


@dataclass
class Tally:
    """Totals of one role (or of all)."""

    calls: int = 0
    prompt_tokens: int = 0
    completion_tokens: int = 0
    cost_usd: float = 0.0
    unpriced_calls: int = 0
    seconds: float = 0.0
    attempts: int = 0

    @property
    def tokens(self) -> int:
        return self.prompt_tokens + self.completion_tokens

    def add(self, other: "Tally | Reply") -> None:
        self.calls += getattr(other, "calls", 1)
        self.prompt_tokens += other.prompt_tokens
        self.completion_tokens += other.completion_tokens
        self.seconds += other.seconds
        self.attempts += other.attempts
        if isinstance(other, Tally):
            self.cost_usd += other.cost_usd
            self.unpriced_calls += other.unpriced_calls
        elif other.cost_usd is None:
            self.unpriced_calls += 1
        else:
            self.cost_usd += other.cost_usd

    def summary(self) -> str:
        cost = "unpriced" if self.unpriced_calls == self.calls and self.calls else f"${self.cost_usd:.4f}"
        if 0 < self.unpriced_calls < self.calls:
            cost += f" ({self.unpriced_calls} calls unpriced)"
        return (f"{self.calls} calls, {self.tokens:,} tokens ({self.prompt_tokens:,} in, "
                f"{self.completion_tokens:,} out), {cost}")


class Usage:
    """Token and cost totals per role (testing, profiling, planning, coding) and overall."""

    def __init__(self) -> None:
        self.by_role: dict[str, Tally] = {}
        self._lock = threading.Lock()  # the coder's samples run in threads on one client

    def add(self, role: str, reply: Reply) -> None:
        with self._lock:
            self.by_role.setdefault(role, Tally()).add(reply)

    def total(self) -> Tally:
        out = Tally()
        with self._lock:
            for tally in self.by_role.values():
                out.add(tally)
        return out

    def summary(self) -> str:
        return self.total().summary()

    def to_dict(self) -> dict[str, Any]:
        return {"total": asdict(self.total()), "by_role": {r: asdict(t) for r, t in self.by_role.items()}}


class Transcript:
    """Appends one JSON line per exchange (or failed exchange) to `path`, with secrets redacted."""

    def __init__(self, path: Path, redact: Callable[[str], str]):
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._redact = redact
        self._lock = threading.Lock()  # one whole line per exchange, also from concurrent samples

    def write(self, *, role: str, model: str | None, messages: list[dict[str, str]], attempts: list[str],
              seconds: float, reply: Reply | None = None, error: str | None = None) -> None:
        record = {"time": datetime.now(timezone.utc).isoformat(timespec="seconds"), "role": role,
                  "model": model, "messages": messages, "reply": reply.text if reply else None,
                  "prompt_tokens": reply.prompt_tokens if reply else 0,
                  "completion_tokens": reply.completion_tokens if reply else 0,
                  "cost_usd": reply.cost_usd if reply else None,
                  "attempts": len(attempts) + (1 if reply else 0), "failed_attempts": attempts,
                  "seconds": round(seconds, 3), "finish_reason": reply.finish_reason if reply else None,
                  "error": error}
        line = self._redact(json.dumps(record, ensure_ascii=False)) + "\n"
        with self._lock, self.path.open("a", encoding="utf-8") as out:
            out.write(line)
