"""Reading C++ call arguments by position, for the offline search's text edits: the spans of a call's
top-level arguments, and a literal thread count among them (shared by astra.optimize.param_space and
astra.optimize.warp_geometry)."""

from __future__ import annotations

import re

MAX_THREADS = 1024
_LITERAL = re.compile(r"\s*(?:dim3\s*\(\s*)?(?P<value>\d+)[uUlL]*\s*\)?\s*")


def arguments(text: str, open_paren: int, close: str = ")") -> list[tuple[int, int]]:
    """The spans of a call's top-level arguments; `open_paren` is just past the opening bracket."""
    spans, depth, start, i = [], 0, open_paren, open_paren
    while i < len(text):
        ch = text[i]
        if depth == 0 and text.startswith(close, i):
            spans.append((start, i))
            return spans
        if ch in "([{":
            depth += 1
        elif ch in ")]}":
            depth -= 1
            if depth < 0:
                return []
        elif ch == ";":
            return []
        elif ch == "," and depth == 0:
            spans.append((start, i))
            start = i + 1
        i += 1
    return []


def literal(text: str, span: tuple[int, int], low: int = 32) -> tuple[int, int, int] | None:
    m = _LITERAL.fullmatch(text, span[0], span[1])
    if not m:
        return None
    value = int(m.group("value"))
    return (m.start("value"), m.end("value"), value) if low <= value <= MAX_THREADS else None


_CLOSERS = {"(": ")", "[": "]", "{": "}", "<": ">"}


def closing(code: str, open_at: int, limit: int | None = None) -> int | None:
    """The index of the bracket that closes the one at `open_at` ((, [, { or <), before `limit`; None if
    it does not close. Give it code whose comments and literals are blanked (decl_chunks.blank_code)."""
    opener = code[open_at]
    closer, depth = _CLOSERS[opener], 0
    for j in range(open_at, len(code) if limit is None else limit):
        if code[j] == opener:
            depth += 1
        elif code[j] == closer:
            depth -= 1
            if depth == 0:
                return j
    return None
