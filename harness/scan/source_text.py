"""Lexing for harness.scan.source_scan: comments removed, literals kept or blanked, `#if 0` bodies dead, and the lines
a candidate adds to the original (line numbers preserved)."""

from __future__ import annotations

import difflib
import re

# --------------------------------------------------------------------------------------------------------------
# Lexing: comments removed, literals kept (`strs`) or blanked (`code`), columns and line numbers preserved.
# --------------------------------------------------------------------------------------------------------------

_RAW_PREFIX = re.compile(r'(?:u8|u|U|L)?R"([^()\\\s]{0,16})\($')


def clean_source(text: str) -> tuple[list[str], list[str]]:
    """(code, strs): per physical line, comments replaced by spaces; in `code` the contents of string and
    character literals are spaces too (quotes kept). Both have the same length per line as each other."""
    n = len(text)
    code: list[str] = []
    strs: list[str] = []
    i = 0
    while i < n:
        c = text[i]
        nxt = text[i + 1] if i + 1 < n else ""
        if c == "/" and nxt == "/":
            j = text.find("\n", i)
            j = n if j < 0 else j
            code.append(" " * (j - i))
            strs.append(" " * (j - i))
            i = j
        elif c == "/" and nxt == "*":
            j = text.find("*/", i + 2)
            j = n if j < 0 else j + 2
            blank = "".join("\n" if ch == "\n" else " " for ch in text[i:j])
            code.append(blank)
            strs.append(blank)
            i = j
        elif c == '"':
            raw = _RAW_PREFIX.search(text[max(0, i - 3):i + 1] + "(") if i and text[i - 1] == "R" else None
            if raw is not None:
                open_paren = text.find("(", i)
                delim = text[i + 1:open_paren] if open_paren >= 0 else ""
                end_mark = ")" + delim + '"'
                j = text.find(end_mark, open_paren + 1) if open_paren >= 0 else -1
                j = n if j < 0 else j + len(end_mark)
            else:
                j = i + 1
                while j < n and text[j] != '"' and text[j] != "\n":
                    j += 2 if text[j] == "\\" else 1
                j = min(j + 1, n)
            body = text[i:j]
            code.append('"' + "".join("\n" if ch == "\n" else " " for ch in body[1:-1]) + body[-1:] if len(body) > 1
                        else body)
            strs.append(body)
            i = j
        elif c == "'" and not (i and (text[i - 1].isdigit() or text[i - 1] in "abcdefABCDEF") and _in_number(text, i)):
            j = i + 1
            while j < n and text[j] != "'" and text[j] != "\n":
                j += 2 if text[j] == "\\" else 1
            j = min(j + 1, n)
            body = text[i:j]
            code.append("'" + " " * (len(body) - 2) + "'" if len(body) > 1 else body)
            strs.append(body)
            i = j
        else:
            j = i
            while j < n and text[j] not in "/\"'":
                j += 1
            if j == i:
                j = i + 1
            code.append(text[i:j])
            strs.append(text[i:j])
            i = j
    code_lines = "".join(code).split("\n")
    strs_lines = "".join(strs).split("\n")
    _blank_if0(code_lines, strs_lines)
    return code_lines, strs_lines


def _in_number(text: str, i: int) -> bool:
    """Whether the quote at i is a digit separator (1'000'000, 0xFF'FF), not a character literal."""
    j = i - 1
    while j >= 0 and (text[j].isalnum() or text[j] in "'."):
        j -= 1
    token = text[j + 1:i]
    return bool(token) and token[0].isdigit()


_IF0 = re.compile(r"^\s*#\s*if\s+0\s*$")
_IF = re.compile(r"^\s*#\s*if(n?def)?\b")
_ENDIF = re.compile(r"^\s*#\s*endif\b")
_ELSE = re.compile(r"^\s*#\s*(else|elif)\b")


def _blank_if0(code: list[str], strs: list[str]) -> None:
    """Blank the body of `#if 0` ... (`#else`|`#endif`): dead text, like a comment."""
    i = 0
    while i < len(code):
        if _IF0.match(code[i]):
            depth, j = 1, i + 1
            while j < len(code):
                if _IF.match(code[j]):
                    depth += 1
                elif _ENDIF.match(code[j]):
                    depth -= 1
                    if depth == 0:
                        break
                elif depth == 1 and _ELSE.match(code[j]):
                    break
                code[j] = strs[j] = ""
                j += 1
            i = j
        i += 1


def added_lines(original_source: str, candidate_source: str) -> tuple[set[int], list[str], list[str]]:
    """(0-based indices of candidate lines that are not in the original, candidate code, candidate strs)."""
    _, orig_strs = clean_source(original_source) if original_source else ([], [])
    code, strs = clean_source(candidate_source)
    norm = lambda lines: [" ".join(line.split()) for line in lines]  # noqa: E731
    a, b = norm(orig_strs), norm(strs)
    matcher = difflib.SequenceMatcher(None, a, b, autojunk=False)
    added: set[int] = set()
    for tag, _i1, _i2, j1, j2 in matcher.get_opcodes():
        if tag in ("replace", "insert"):
            added.update(j for j in range(j1, j2) if b[j])
    return added, code, strs
