"""What every rewrite pass is: the result it returns, the protocol it meets, and the frame the passes
of this package share (parse, rewrite or refuse with a one-line reason)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Iterable, Protocol

from astra.optimize.passes.syntax import Headers, Unit, headers_for_spec, splice, try_parse

# one place a pass may rewrite: where it is (for messages), its node, and the rewrite, called only when no
# earlier rewrite covers the node: (start, end, new text, a note for the message or "") or a Refusal
Site = tuple[str, object, Callable[[], tuple[int, int, str, str]]]


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

    def rewrite_each(self, unit: Unit, sites: Iterable[Site], what: str, nothing: str,
                     every_reason: bool = False) -> tuple[str, str]:
        """The frame of a pass that rewrites place by place: each site's rewrite collected (a site inside one
        already rewritten is skipped: an outer loop took it), each refusal kept as `where: why`; all spliced
        and described as `what: where (note), ...`. With no rewrite it refuses with the first site's reason
        (every site's, `; `-joined, with `every_reason`), or `nothing` where there was no site."""
        edits: list[tuple[int, int, str]] = []
        done: list[str] = []
        reasons: list[str] = []
        for where, node, edit in sites:
            if any(a <= unit.span(node)[0] < b for a, b, _ in edits):
                continue
            try:
                start, end, text, note = edit()
            except Refusal as refusal:
                reasons.append(f"{where}: {refusal}")
                continue
            edits.append((start, end, text))
            done.append(f"{where} ({note})" if note else where)
        if not edits:
            raise Refusal(("; ".join(reasons) if every_reason else reasons[0]) if reasons else nothing)
        return splice(unit, edits), f"{what}: {', '.join(done)}"


def tolerated(spec: dict | None, change: str) -> tuple[bool, str]:
    """Whether the spec's tolerance admits results a few ulp off the original's (`change` names what would
    move them, for the reason), and why (one line): refused for a spec that compares outputs exactly (no
    tolerance, or atol = rtol = 0 for some dtype); without a spec the harness's tolerance decides. The one
    home of that rule (fast_math's intrinsics, vectorize's reordered float sums)."""
    if spec is None:
        return True, "no spec given: the harness's tolerance decides"
    tolerance = spec.get("tolerance")
    if not tolerance:
        return False, f"the spec compares outputs exactly (no tolerance): {change} would change them"
    for dtype, tol in sorted(tolerance.items()):
        if isinstance(tol, dict) and not tol.get("atol") and not tol.get("rtol"):
            return False, f"the spec is bit-exact for {dtype} (atol = rtol = 0): {change} would change results"
    return True, "the spec's tolerance admits a few ulp"
