"""Reading C++ call arguments by position, for the offline search's text edits: the spans of a call's
top-level arguments, and a literal thread count among them (shared by astra.optimize.param_space and
astra.optimize.warp_geometry)."""

from __future__ import annotations

import re

from astra.cxx.brackets import closing, spans

MAX_THREADS = 1024
_LITERAL = re.compile(r"\s*(?:dim3\s*\(\s*)?(?P<value>\d+)[uUlL]*\s*\)?\s*")


def arguments(text: str, open_paren: int, close: str = ")") -> list[tuple[int, int]]:
    """The spans of a call's top-level arguments (astra.cxx.brackets.spans); `open_paren` is just past the
    opening bracket: a `(` that `)` closes, or `<<<` that `close=">>>"` closes. Empty when the call does
    not close, or holds a `;` (a lambda's body: not a plain argument list)."""
    if close == ")":
        end = closing(text, open_paren - 1) if text[open_paren - 1:open_paren] == "(" else None
    else:
        end = text.find(close, open_paren)
    if end is None or end < 0 or ";" in text[open_paren:end]:
        return []
    return spans(text, open_paren, end) or [(open_paren, end)]


def literal(text: str, span: tuple[int, int], low: int = 32) -> tuple[int, int, int] | None:
    m = _LITERAL.fullmatch(text, span[0], span[1])
    if not m:
        return None
    value = int(m.group("value"))
    return (m.start("value"), m.end("value"), value) if low <= value <= MAX_THREADS else None
