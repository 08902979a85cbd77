"""What every rewrite pass is: the result it returns, the protocol it meets, and the frame the passes
of this package share (parse, rewrite or refuse with a one-line reason)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

from astra.optimize.passes.syntax import Headers, Unit, headers_for_spec, try_parse


@dataclass(frozen=True)
class PassResult:
    applies: bool
    source: str | None  # the whole rewritten kernel file when applies
    reason: str  # what was done, or why it refuses (one line)


class RewritePass(Protocol):
    name: str
    family: str  # for the offline agent's ordering

    def apply(self, source: str, spec: dict | None = None) -> PassResult: ...


class Refusal(Exception):
    """Raised inside a pass to refuse: its message is the one-line reason."""


class ParsedPass:
    """The shared frame of the passes: parse (with the given headers, else the spec's), call `rewrite`,
    turn a `Refusal` into a refusing result. `rewrite(unit, spec)` returns (new source, what was done)."""

    name = ""
    family = ""

    def __init__(self, headers: Headers | None = None):
        self.headers = headers

    def apply(self, source: str, spec: dict | None = None) -> PassResult:
        unit, why = try_parse(source, self.headers or headers_for_spec(spec))
        if unit is None:
            return PassResult(False, None, f"cannot parse the source: {why}")
        try:
            new, done = self.rewrite(unit, spec)
        except Refusal as refusal:
            return PassResult(False, None, str(refusal))
        except ValueError as err:  # two rewrites of one range: a gap in the pass's rules, reported as such
            return PassResult(False, None, f"internal: {err}")
        if new == source:
            return PassResult(False, None, "nothing to change")
        return PassResult(True, new, done)

    def rewrite(self, unit: Unit, spec: dict | None) -> tuple[str, str]:
        raise NotImplementedError
