"""The pipes between the judge's timing coordinator and the candidate process's timing side.

The judge times the original itself and the candidate in the candidate process, sample by sample
(harness.paired_timing). It drives the candidate's side over two pipes the judge creates (inherited by the
candidate process, their numbers in its request): one JSON object per line each way, a command down and
one reply up. `RemoteSide` is the judge's handle, with the methods of a local `harness.timing_side.TimingSide`
(estimate, prepare, sample, digests, close) plus `dump` (raw outputs of chosen sets into the work directory,
harness.exchange) and `exit`; `serve` is the candidate process's loop.

Everything that comes up the pipe is untrusted: a reply is validated for its shape (times finite and
positive, one per sample asked for; one digest pair of hex strings per set), a reply that does not come in
time, an ended process or a malformed line raise `LinkBroken` (the judge turns it into the candidate
process's failure), and an error the side reports raises `SideFailed` with its kind ("capture", "oom",
"other").
"""

from __future__ import annotations

import json
import math
import os
import re
import select
import time
from typing import Any, Callable

MAX_LINE_BYTES = 64 << 20
_HEX64 = re.compile(r"^[0-9a-f]{64}$")


class LinkBroken(RuntimeError):
    """The candidate process stopped answering, ended, or answered something malformed."""


class SideFailed(RuntimeError):
    """The candidate's side reported an error (`kind`: capture, oom, other)."""

    def __init__(self, kind: str, message: str) -> None:
        super().__init__(message)
        self.kind = kind


def encode(message: dict[str, Any]) -> bytes:
    return (json.dumps(message, separators=(",", ":")) + "\n").encode()


class LineReader:
    """Reads newline-terminated JSON objects from a file descriptor, with a timeout per line."""

    def __init__(self, fd: int) -> None:
        self.fd, self.buffer = fd, b""

    def read(self, timeout_s: float, alive: Callable[[], bool] = lambda: True) -> dict[str, Any]:
        deadline = time.monotonic() + timeout_s
        while b"\n" not in self.buffer:
            left = deadline - time.monotonic()
            if left <= 0:
                raise LinkBroken(f"no reply within {timeout_s:g} s")
            ready, _, _ = select.select([self.fd], [], [], min(left, 0.5))
            if not ready:
                if not alive():
                    raise LinkBroken("the candidate process ended")
                continue
            chunk = os.read(self.fd, 1 << 20)
            if not chunk:
                raise LinkBroken("the candidate process closed its end of the link")
            self.buffer += chunk
            if len(self.buffer) > MAX_LINE_BYTES:
                raise LinkBroken(f"a reply longer than {MAX_LINE_BYTES} bytes")
        line, self.buffer = self.buffer.split(b"\n", 1)
        try:
            message = json.loads(line)
        except ValueError as error:
            raise LinkBroken(f"malformed reply: {error}") from error
        if not isinstance(message, dict):
            raise LinkBroken("a reply that is not an object")
        return message


def write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view):]


class RemoteSide:
    """The judge's handle on the candidate process's timing side (see the module docstring).

    `commands`/`replies`: the judge's ends of the two pipes; `alive()`: whether the process still runs;
    `timeout_s`: the longest wait for one reply, and `remaining()` what is left of the judge's budget;
    `before_call()`: run before every command (the coordinator resumes a stopped candidate process there)."""

    name = "cand"

    def __init__(self, commands: int, replies: int, alive: Callable[[], bool], timeout_s: float,
                 before_call: Callable[[], None] = lambda: None,
                 remaining: Callable[[], float] = lambda: math.inf) -> None:
        self.commands, self.reader, self.alive = commands, LineReader(replies), alive
        self.timeout_s, self.before_call, self.remaining = timeout_s, before_call, remaining
        self.case: int | None = None
        self.n_sets = 0

    def call(self, op: str, **fields: Any) -> dict[str, Any]:
        self.send(op, **fields)
        return self.receive(op)

    def send(self, op: str, **fields: Any) -> None:
        """The command only: its reply is `receive(op)`'s (the judge works meanwhile)."""
        self.before_call()
        try:
            write_all(self.commands, encode({"op": op, **fields}))
        except OSError as error:
            raise LinkBroken(f"the candidate process does not take commands: {error}") from error

    def receive(self, op: str) -> dict[str, Any]:
        reply = self.reader.read(max(0.0, min(self.timeout_s, self.remaining())), self.alive)
        if reply.get("op") != op:
            raise LinkBroken(f"a reply to {reply.get('op')!r} where {op!r} was asked")
        if "error" in reply:
            kind = reply.get("kind") if reply.get("kind") in ("capture", "oom", "other") else "other"
            raise SideFailed(kind, str(reply.get("error"))[:300])
        return reply

    def estimate(self, seed: int) -> float:
        value = self.call("estimate", case=self.case, seed=seed).get("us")
        return _positive(value, "estimate")

    def prepare(self, view: str, seeds: list[int], layout: int = 0) -> dict[str, Any]:
        return self.start_prepare(view, seeds, layout)()

    def start_prepare(self, view: str, seeds: list[int], layout: int = 0) -> Callable[[], dict[str, Any]]:
        """Ask the side to prepare now; the returned function waits until it has (the judge prepares its own
        side meanwhile, harness.paired_timing.Pair.both)."""
        self.send("prepare", case=self.case, view=view, seeds=list(seeds), layout=int(layout))
        self.n_sets = len(seeds)
        return self._prepared

    def _prepared(self) -> dict[str, Any]:
        self.receive("prepare")
        return {}

    def sample(self, count: int) -> list[float]:
        values = self.call("sample", count=count).get("us")
        if not isinstance(values, list) or len(values) != count:
            raise LinkBroken(f"{count} sample(s) asked, got {values!r:.80}")
        return [_positive(v, "sample") for v in values]

    def digests(self) -> list[dict[str, str]]:
        return self.start_digests()()

    def start_digests(self) -> Callable[[], list[dict[str, str]]]:
        """Ask for the digests now; the returned function waits for them (the judge computes its own
        meanwhile, harness.paired_timing.Pair.both)."""
        self.send("digests")
        return self._digests

    def _digests(self) -> list[dict[str, str]]:
        values = self.receive("digests").get("digests")
        if not isinstance(values, list) or len(values) != self.n_sets or not all(
                isinstance(d, dict) and all(isinstance(d.get(k), str) and _HEX64.match(d[k]) for k in ("out", "in"))
                for d in values):
            raise LinkBroken(f"malformed digests for {self.n_sets} set(s)")
        return [{"out": d["out"], "in": d["in"]} for d in values]

    def dump(self, indices: list[int]) -> dict[str, Any]:
        """The candidate writes the outputs of sets `indices` into its work directory (harness.exchange);
        returns its tensor entries per index, to be validated by the reader."""
        entries = self.call("dump", sets=list(indices)).get("tensors")
        if not isinstance(entries, dict):
            raise LinkBroken("malformed dump reply")
        return entries

    def close(self) -> None:
        self.call("close")
        self.n_sets = 0

    def exit(self) -> None:
        self.call("exit")


def _positive(value: Any, what: str) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value <= 0:
        raise LinkBroken(f"implausible {what} time {value!r:.40}")
    return float(value)


def serve(commands: int, replies: int, handle: Callable[[dict[str, Any]], dict[str, Any] | None]) -> None:
    """The candidate process's loop: one command per line from `commands`, `handle(command)`'s reply (with
    the command's op) up `replies`; `handle` returning None ends the loop after replying. Ends quietly when
    the judge closes its end."""
    reader = LineReader(commands)
    while True:
        try:
            command = reader.read(timeout_s=math.inf)
        except LinkBroken:
            return
        reply = handle(command)
        write_all(replies, encode({**(reply or {}), "op": command.get("op")}))
        if reply is None:
            return
