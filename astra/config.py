"""`$ASTRA_HOME/config.yaml`: the LLM settings a user keeps in a file, read and checked before any use.

    base_url: http://localhost:30000/v1     # an OpenAI-compatible endpoint
    model: gpt-4.1
    timeout_s: 120                           # seconds per request (> 0)
    max_retries: 4                           # 0 to 100
    temperature: 0.2                         # 0 to 2
    max_tokens: 4096                         # > 0
    budget_tokens: 500000                    # > 0
    budget_usd: 5.0                          # > 0

Every key is optional (`null` is the same as leaving it out). The file is a user's file (astra.input_files:
a regular file of at most 64 KiB, UTF-8 YAML without anchors or repeated keys); API keys are never read
from it. Every mistake is one line naming the file, the key and the value (exit 13, as the LLM settings
the file holds; docs/exit-codes.md). The LLM client merges these settings with flags and the environment.
"""

from __future__ import annotations

import math
from pathlib import Path

from astra import input_files, paths
from astra.errors import AstraError

FILE_KEYS = ("base_url", "model", "timeout_s", "max_retries", "temperature", "max_tokens",
             "budget_tokens", "budget_usd")


class ConfigFileError(AstraError):
    """A config.yaml Astra cannot use: it configures the LLM endpoint, so it shares that exit code."""

    exit_code = 13


def _text(value) -> str | None:
    return None if isinstance(value, str) and value.strip() else "a non-empty string"


def url_problem(value) -> str | None:
    """What an endpoint URL must be, when `value` is not one a request can go to (None when it is): an
    http:// or https:// URL with a host. The one rule for config.yaml, --base-url and the environment."""
    from urllib.parse import urlsplit

    wanted = "an http:// or https:// URL with a host, such as http://localhost:30000/v1"
    if not isinstance(value, str) or not value.strip() or any(c.isspace() for c in value.strip()):
        return wanted
    try:
        parts = urlsplit(value.strip())
        _ = parts.port  # a port that is not a number raises here
    except ValueError:
        return wanted
    return None if parts.scheme in ("http", "https") and parts.hostname else wanted


def _number(low: float, high: float, *, integer: bool = False, low_open: bool = False):
    """A check of a number in [low, high] (`low_open`: (low, high]); it returns what the value must be, or None."""
    wanted = "a whole number" if integer else "a finite number"
    wanted += f" above {low:g}" if low_open else f" from {low:g}"
    wanted += f" to {high:g}" if high < math.inf else ""

    def check(value) -> str | None:
        if isinstance(value, bool) or not isinstance(value, int if integer else (int, float)):
            return wanted
        if not math.isfinite(value) or value < low or value == low and low_open or value > high:
            return wanted
        return None
    return check


_CHECKS = {
    "base_url": url_problem, "model": _text,
    "timeout_s": _number(0, math.inf, low_open=True),
    "max_retries": _number(0, 100, integer=True),
    "temperature": _number(0, 2),
    "max_tokens": _number(0, math.inf, integer=True, low_open=True),
    "budget_tokens": _number(0, math.inf, integer=True, low_open=True),
    "budget_usd": _number(0, math.inf, low_open=True),
}


def config_path() -> Path:
    return paths.astra_home() / "config.yaml"


def read_config_file(path: Path, error: type[AstraError] = ConfigFileError) -> dict:
    """The settings of a config file, each checked; `error` (exit 13 by default) for every mistake."""
    try:
        data = input_files.read_yaml(path, input_files.CONFIG_BYTES, what="a config file")
    except input_files.Refused as err:
        raise error(str(err)) from None
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise error(f"{path}: must hold a mapping such as `base_url: ...` and `model: ...`")
    secret = [k for k in data if any(w in str(k).lower() for w in ("key", "secret", "password"))]
    if secret:
        raise error(f"{path}: holds `{secret[0]}`; Astra never reads API keys from files. Remove it and set "
                    "ASTRA_API_KEY or OPENAI_API_KEY in the environment instead.")
    unknown = sorted(set(map(str, data)) - set(FILE_KEYS))
    if unknown:
        raise error(f"{path}: unknown setting(s) {unknown}; known: {', '.join(FILE_KEYS)}")
    for key, value in data.items():
        wanted = None if value is None else _CHECKS[key](value)
        if wanted:
            shown = repr(value) if len(repr(value)) <= 60 else repr(value)[:57] + "..."
            raise error(f"{path}: `{key}: {shown}` must be {wanted}")
    return data


def home_settings(error: type[AstraError] = ConfigFileError) -> dict:
    """The checked settings of $ASTRA_HOME/config.yaml ({} when there is none)."""
    path = config_path()
    return read_config_file(path, error) if path.exists() or path.is_symlink() else {}
