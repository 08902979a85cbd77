"""Brackets of C++ read by hand: which bracket closes which, and what stands at the top level of a list.

Everything here works on either form of C++ Astra reads: text (a `str`, one character per item; give
it text whose comments and literals are blanked, astra.cxx.text.blank) or token spellings (a list of
strings, one token per item, as libclang or astra.sglang.cxx_tokens give them). One rule decides what
is a bracket, for every caller:

- `(`, `[` and `{` always open and `)`, `]` and `}` close; a closer that does not match the innermost
  open bracket is skipped (unbalanced input), one that matches an outer one closes it too;
- `<` and `>` are angle brackets only where no `(`, `[` or `{` is open since the innermost angle
  bracket, that is at the top level of what is scanned or directly in a template argument list.
  Inside parentheses, brackets and braces they are comparison operators, as C++ reads
  `Kernel<(a < b), 4>` or `f(x > 0, y)`;
- even there, a `<` is a comparison when it is spelled as part of another operator (`<<`, `<=`,
  `<=>`), when (in text) it has white space on both sides (`kN < 4`), or when no `>` closes it before
  the list it stands in ends (at a `;`, at a closer of an outer bracket, or at the end): `n < 4, "msg"`
  are two arguments. A `>` closes the innermost angle bracket unless spelled as part of `->` or `>=`;
  the token `>>` closes two (`A<B<C>>`), and so do two `>` in text;
- a `;` ends every angle bracket open above the innermost other bracket.

`levels` walks a sequence with that rule; `closing` and `opening` match one bracket, `enclosing`
lists the brackets open at a position, `spans` and `split_top` cut a list at its top-level separators.
The rule is lexical: C++ itself needs to know which names are templates, which a text cannot say, so
`a < b, c > d` reads as one template-like argument when written tight (`a<b, c>d`).
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence

_OPENERS = {"(": ")", "[": "]", "{": "}"}
_CLOSERS = {")": "(", "]": "[", "}": "{"}
_MIRROR = str.maketrans("()[]{}", ")(][}{")


def levels(seq: Sequence[str], start: int = 0, end: int | None = None,
           inside: str = "") -> Iterator[tuple[int, int, str]]:
    """(index, depth, role) of each item of seq[start:end]: `role` is "open" or "close" for a bracket
    (its depth is the depth outside it) and "" for anything else (the depth it stands at); `inside`: the
    brackets already open at `start`, outermost first (`"<"` to scan a template argument list)."""
    end = len(seq) if end is None else min(end, len(seq))
    stack = list(inside)
    for i in range(start, end):
        item = seq[i]
        if item in _OPENERS:
            yield i, len(stack), "open"
            stack.append(item)
        elif item in _CLOSERS:
            _end_angles(stack)
            if stack and stack[-1] == _CLOSERS[item]:
                stack.pop()
                yield i, len(stack), "close"
            else:
                yield i, len(stack), ""
        elif item == ";":
            _end_angles(stack)
            yield i, len(stack), ""
        elif (not stack or stack[-1] == "<") and _opens_angle(seq, i, end):
            yield i, len(stack), "open"
            stack.append("<")
        elif stack and stack[-1] == "<" and _closes_angle(seq, i):
            for _ in range(2 if item == ">>" else 1):
                if stack and stack[-1] == "<":
                    stack.pop()
            yield i, len(stack), "close"
        else:
            yield i, len(stack), ""


def _end_angles(stack: list[str]) -> None:
    while stack and stack[-1] == "<":
        stack.pop()


def _opens_angle(seq: Sequence[str], i: int, end: int) -> bool:
    """Whether the item at `i` is a `<` that opens an angle bracket (see the module docstring)."""
    if seq[i] != "<":
        return False
    if isinstance(seq, str):
        before, after = seq[i - 1:i] if i else "", seq[i + 1:i + 2]
        if after in ("<", "=") or before == "<" or (before.isspace() and after.isspace()):
            return False
    return closing(seq, i, end) is not None


def _closes_angle(seq: Sequence[str], i: int) -> bool:
    item = seq[i]
    if isinstance(seq, str):
        return item == ">" and seq[i - 1:i] != "-" and seq[i + 1:i + 2] != "="
    return item in (">", ">>")


def closing(seq: Sequence[str], open_at: int, limit: int | None = None) -> int | None:
    """The index of the bracket that closes the one at `open_at` (`(`, `[`, `{` or `<`, taken as a
    bracket whatever its neighbours), before `limit`; None when it does not close there."""
    opener = seq[open_at]
    if opener not in _OPENERS and opener != "<":
        raise ValueError(f"closing() matches (, [, {{ or <, not {opener!r}")
    for i, depth, role in levels(seq, open_at + 1, limit, inside=opener):
        if depth == 0:
            return i if role == "close" else None
    return None


def opening(seq: Sequence[str], close_at: int) -> int | None:
    """The index of the bracket that the `)`, `]` or `}` at `close_at` closes; None when none does.
    The same rule read backwards: `closing` over the mirrored sequence."""
    if seq[close_at] not in _CLOSERS:
        raise ValueError(f"opening() matches ), ] or }}, not {seq[close_at]!r}")
    if isinstance(seq, str):
        mirrored: Sequence[str] = seq[close_at::-1].translate(_MIRROR)
    else:
        mirrored = [s.translate(_MIRROR) if s in _OPENERS or s in _CLOSERS else s for s in seq[close_at::-1]]
    found = closing(mirrored, 0)
    return None if found is None else close_at - found


def enclosing(seq: Sequence[str], pos: int) -> list[int]:
    """The indices of the brackets open at `pos` (scanning from the start), outermost first."""
    opened: list[int] = []
    for i, depth, role in levels(seq, 0, pos):
        del opened[depth:]
        if role == "open":
            opened.append(i)
    return opened


def spans(seq: Sequence[str], start: int = 0, end: int | None = None, sep: str = ",") -> list[tuple[int, int]]:
    """(start, end) of each piece of seq[start:end] between separators `sep` at its top level (`sep`
    may be longer than one character in text: `&&`). An empty last piece is left out, so an empty
    list has no pieces and a trailing comma (`{1, 2,}`) adds none."""
    end = len(seq) if end is None else min(end, len(seq))
    text = isinstance(seq, str)
    width = len(sep) if text else 1
    out, begin = [], start
    for i, depth, role in levels(seq, start, end):
        if i >= begin and depth == 0 and not role and (seq.startswith(sep, i) if text else seq[i] == sep):
            out.append((begin, i))
            begin = i + width
    last = seq[begin:end]
    if (last.strip() if text else last):
        out.append((begin, end))
    return out


def split_top(seq: Sequence[str], sep: str = ",") -> list:
    """The pieces of `seq` between top-level separators (`spans`): stripped strings for text
    (`"a, b<c, d>, f(x < y, z)"` -> `["a", "b<c, d>", "f(x < y, z)"]`), lists of spellings for tokens."""
    pieces = [seq[a:b] for a, b in spans(seq, sep=sep)]
    return [p.strip() for p in pieces] if isinstance(seq, str) else pieces
