"""C++ token spellings as the host-check reader handles them: a regex tokenizer for C++ text, and
libclang tokens renamed into the entry's names (astra.sglang.host_checks finds the checks,
astra.sglang.cxx_conditions reads them; astra.cxx.brackets matches brackets over spellings)."""

from __future__ import annotations

import re

_TOKEN = re.compile(r'"(?:\\.|[^"\\])*"|\'(?:\\.|[^\'\\])*\'|0[xX][0-9a-fA-F]+[uUlLzZ]*|\d+(?:\.\d*)?(?:[eE][-+]?\d+)?'
                    r'[uUlLfFzZ]*|[A-Za-z_]\w*|::|->|<<=|>>=|<=|>=|==|!=|&&|\|\||<<|>>|\S')


def tokenize(text: str) -> list[str]:
    """C++ text as token spellings (string and char literals, numbers with suffixes, operators)."""
    return _TOKEN.findall(text)


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

