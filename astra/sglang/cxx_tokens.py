"""C++ token spellings as the host-check reader handles them: a regex tokenizer for C++ text,
libclang tokens renamed into the entry's names, and bracket matching and comma splitting over
spellings (astra.sglang.host_checks finds the checks, astra.sglang.cxx_conditions reads them)."""

from __future__ import annotations

import re

OPEN = {"(": ")", "[": "]", "{": "}"}
_TOKEN = re.compile(r'"(?:\\.|[^"\\])*"|\'(?:\\.|[^\'\\])*\'|0[xX][0-9a-fA-F]+[uUlLzZ]*|\d+(?:\.\d*)?(?:[eE][-+]?\d+)?'
                    r'[uUlLfFzZ]*|[A-Za-z_]\w*|::|->|<<=|>>=|<=|>=|==|!=|&&|\|\||<<|>>|\S')


def tokenize(text: str) -> list[str]:
    """C++ text as token spellings (string and char literals, numbers with suffixes, operators)."""
    return _TOKEN.findall(text)


def closing(spellings: list[str], start: int) -> int:
    """The index of the bracket closing the one at `start` (the last index when none does)."""
    stack = []
    for i in range(start, len(spellings)):
        s = spellings[i]
        if s in OPEN:
            stack.append(OPEN[s])
        elif stack and s == stack[-1]:
            stack.pop()
            if not stack:
                return i
    return len(spellings) - 1


def split_commas(spellings: list[str]) -> list[list[str]]:
    """Spellings split at top-level commas (not inside brackets)."""
    parts: list[list[str]] = [[]]
    depth = 0
    for s in spellings:
        if s in OPEN:
            depth += 1
        elif s in OPEN.values():
            depth -= 1
        if s == "," and depth == 0:
            parts.append([])
        else:
            parts[-1].append(s)
    return parts


def joined(spellings: list[str]) -> str:
    return " ".join(spellings)


def renamed(tokens: list, rename: dict[str, str]) -> tuple[list[str], list[int]]:
    """(spellings, lines) of libclang `tokens`, identifiers renamed (not after `.`, `->` or `::`)."""
    out: list[str] = []
    lines: list[int] = []
    for token in tokens:
        s = token.spelling
        parts = [s]
        if s in rename and (not out or out[-1] not in (".", "->", "::")):
            parts = ["(", *tokenize(rename[s]), ")"] if not re.fullmatch(r"\w+", rename[s]) else [rename[s]]
        out.extend(parts)
        lines.extend([token.location.line] * len(parts))
    return out, lines

