"""The orchestrator-to-judge channel: a private config on the judge's STDIN, and the signed verdict.

`harness.worker.judge_process.run_job` draws a random HMAC key per job and writes `encode_config(...)` to the
judge's stdin (never argv, never the environment, so neither the candidate process nor anything that
reads /proc/<pid>/environ or cmdline sees it). The judge (`python -m harness run`) reads it once with
`read_config`, keeps it in memory (`current()`), signs its verdict with `sign` and never passes the key
on. `run_job` accepts a verdict only when `verify` holds: a verdict file written by anything else
(a candidate process of the same user, say) is refused.

The config also carries the judge's time budget (`timeout_s`: the judge bounds its candidate process
inside it, so no candidate outlives the judge's own timeout) and, for compute-sanitizer runs, the
command prefix (`wrap`) the candidate process is started under, and whether that tool watches the candidate's
own kernels alone (`watch_own_kernels`: the judge names them in the prefix once it has built them).

Signature: hex HMAC-SHA256 over the canonical JSON (sorted keys, no spaces) of the verdict dict without
its "signature" entry.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import secrets
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

SIGNATURE = "signature"


@dataclass
class JudgeConfig:
    """What the orchestrator tells the judge privately (see the module docstring)."""

    key: bytes | None = None
    timeout_s: float | None = None
    wrap: list[str] = field(default_factory=list)
    sanitizer: bool = False  # running under a sanitizer: a candidate exit status of `wrap_exitcode` is fine
    wrap_exitcode: int | None = None
    watch_own_kernels: bool = False  # the wrap's tool watches the candidate's kernels alone, named once built
    received_at: float | None = None  # time.monotonic() when it was read: the judge's budget starts there


_CURRENT = JudgeConfig()


def new_key() -> bytes:
    """A fresh random HMAC key (32 bytes)."""
    return secrets.token_bytes(32)


def encode_config(key: bytes, timeout_s: float | None = None, wrap: list[str] | None = None,
                  wrap_exitcode: int | None = None, watch_own_kernels: bool = False) -> bytes:
    """The bytes the orchestrator writes to the judge's stdin."""
    return json.dumps({"hmac_key": key.hex(), "timeout_s": timeout_s, "wrap": list(wrap or []),
                       "wrap_exitcode": wrap_exitcode, "watch_own_kernels": watch_own_kernels}).encode()


def read_config(stream: IO[str] | None = None) -> JudgeConfig:
    """Read the config from `stream` (default stdin) and make it `current()`. A terminal, an empty or a
    malformed stdin gives an empty config (no key: the verdict goes unsigned and `run_job` refuses it)."""
    global _CURRENT
    stream = sys.stdin if stream is None else stream
    config = JudgeConfig()
    try:
        text = "" if stream is None or stream.isatty() else stream.read()
        data = json.loads(text) if text.strip() else {}
        if isinstance(data, dict):
            key = data.get("hmac_key")
            config = JudgeConfig(key=bytes.fromhex(key) if isinstance(key, str) else None,
                                 timeout_s=float(data["timeout_s"]) if data.get("timeout_s") else None,
                                 wrap=[str(part) for part in data.get("wrap") or []],
                                 wrap_exitcode=data.get("wrap_exitcode"),
                                 watch_own_kernels=bool(data.get("watch_own_kernels")))
            config.sanitizer = bool(config.wrap)
            config.received_at = time.monotonic()
    except (OSError, ValueError, TypeError):
        config = JudgeConfig()
    _CURRENT = config
    return config


def current() -> JudgeConfig:
    """The config read by `read_config` in this process (empty before)."""
    return _CURRENT


def canonical(data: dict[str, Any]) -> bytes:
    """The canonical JSON bytes of `data` without its signature."""
    body = {k: v for k, v in data.items() if k != SIGNATURE}
    return json.dumps(body, sort_keys=True, separators=(",", ":"), default=str, allow_nan=True).encode()


def sign(data: dict[str, Any], key: bytes) -> dict[str, Any]:
    """`data` normalised through JSON, with its "signature" added."""
    body = json.loads(canonical(data))
    body[SIGNATURE] = hmac.new(key, canonical(body), hashlib.sha256).hexdigest()
    return body


def verify(data: dict[str, Any], key: bytes) -> bool:
    """Whether `data` carries a valid signature under `key`."""
    signature = data.get(SIGNATURE)
    if not isinstance(signature, str):
        return False
    expected = hmac.new(key, canonical(data), hashlib.sha256).hexdigest()
    return hmac.compare_digest(signature, expected)


def run_judge(job_json: str, tmp: str | Path, *, timeout_s: float, python: str, env: dict[str, str],
              wrap: list[str] | None = None, wrap_exitcode: int | None = None, watch_own_kernels: bool = False,
              progress=None, cancel=None):
    """Start `python -m harness run job.json --out verdict.json` in `tmp` (harness.worker.process_group.run_isolated)
    with a fresh key and this config on its stdin. Returns (outcome, verdict path, key)."""
    from harness.worker.process_group import run_isolated

    tmp = Path(tmp)
    job_path, out_path = tmp / "job.json", tmp / "verdict.json"
    job_path.write_text(job_json)
    key = new_key()
    command = [python, "-m", "harness", "run", str(job_path), "--out", str(out_path)]
    outcome = run_isolated(command, timeout_s=timeout_s, env=env, cwd=tmp,
                           stdin_data=encode_config(key, timeout_s, wrap, wrap_exitcode, watch_own_kernels),
                           progress=progress,
                           cancel=cancel)
    return outcome, out_path, key
