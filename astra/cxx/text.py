"""C++ source text with its comments and the contents of its literals blanked, every offset kept.

`blank(text)` returns a string of the same length and the same line breaks as `text` in which every
comment, and everything between the quotes of every string and character literal, is a space. The
quotes themselves stay (`extern "C" {` reads `extern " " {`, `'{'` reads `' '`), so a literal is still
seen where it stands, but no bracket, `;`, comma or name inside a comment or a literal can count.
Every scan of C++ text by hand in Astra (brackets and argument lists in astra.cxx.brackets,
declarations in astra.cxx.decls, the regexes of the offline search's edits) reads this view, and a
position found in it is the same position in `text`.

The lexical rules it follows:
- `// ...` runs to the end of the line, and on past a line that ends with a backslash (the
  preprocessor splices such lines before comments are removed); `/* ... */` runs to the first `*/`;
- a string literal may carry an encoding prefix (`u8"..."`, `L"..."`); a backslash escapes the next
  character; a raw string `R"delim( ... )delim"` (any prefix before the `R`) ends only at its own
  `)delim"`, backslashes and line breaks included;
- a `'` that continues a number (`1'000'000`, `0xFF'FF`) is a digit separator, not a literal;
- a literal that is not closed on its line ends at the line break (the text is not valid C++ there,
  and a stray quote must not blank the rest of the file); an unclosed comment or raw string runs to
  the end of the text.
"""

from __future__ import annotations

import re

_START = re.compile(r"//|/\*|[\"']")
_RAW_PREFIXES = ("R", "LR", "uR", "UR", "u8R")


def blank(text: str, literals: bool = True) -> str:
    """`text` with comments and the contents of string and character literals as spaces (line breaks
    kept, quotes kept, same length): see the module docstring. `literals=False` blanks the comments
    only, for a caller that reports code as written (a condition comparing with `"silu"`) while it
    scans the fully blanked text."""
    out: list[str] = []
    pos, n = 0, len(text)
    while (m := _START.search(text, pos)) is not None:
        i = m.start()
        token = m.group()
        if token == "//":
            end = _line_comment_end(text, i)
            out += [text[pos:i], _spaces(text[i:end])]
        elif token == "/*":
            close = text.find("*/", i + 2)
            end = n if close < 0 else close + 2
            out += [text[pos:i], _spaces(text[i:end])]
        elif token == "'" and _continues_number(text, i):
            end = i + 1
            out.append(text[pos:end])
        else:
            inner, end = _literal(text, i)
            contents = text[i + 1:inner]
            out += [text[pos:i + 1], _spaces(contents) if literals else contents, text[inner:end]]
        pos = end
    out.append(text[pos:])
    return "".join(out)


def _spaces(part: str) -> str:
    return re.sub(r"[^\n]", " ", part)


def _line_comment_end(text: str, i: int) -> int:
    """Where the `//` comment at `i` ends: at the first line break not escaped by a backslash."""
    end = text.find("\n", i)
    while end > 0 and text[end - 1] == "\\" or end > 1 and text[end - 2:end] == "\\\r":
        end = text.find("\n", end + 1)
    return len(text) if end < 0 else end


def _word_before(text: str, i: int) -> str:
    """The run of identifier characters, digits, dots and quotes that ends at `i`."""
    k = i
    while k > 0 and (text[k - 1].isalnum() or text[k - 1] in "_.'"):
        k -= 1
    return text[k:i]


def _continues_number(text: str, i: int) -> bool:
    """Whether the `'` at `i` is a digit separator: it follows a number (`1'000`, `0x7F'FF`)."""
    word = _word_before(text, i)
    return bool(word) and (word[0].isdigit() or word[0] == "." and word[1:2].isdigit())


def _literal(text: str, i: int) -> tuple[int, int]:
    """(where the contents end, where the literal ends) of the string or character literal whose
    opening quote is at `i`: the contents are text[i + 1:first], the closing quote text[first:second]."""
    quote, n = text[i], len(text)
    if quote == '"' and _word_before(text, i) in _RAW_PREFIXES:
        open_paren = text.find("(", i + 1)
        if 0 <= open_paren <= i + 17 and not re.search(r"[\s\\)]", text[i + 1:open_paren]):
            close = text.find(")" + text[i + 1:open_paren] + '"', open_paren + 1)
            if close < 0:
                return n, n
            inner = close + open_paren - i  # the closing `"` of `)delim"`
            return inner, inner + 1
    j = i + 1
    while j < n and text[j] != quote and text[j] != "\n":
        j += 2 if text[j] == "\\" else 1
    j = min(j, n)
    if j < n and text[j] == quote:
        return j, j + 1
    return j, j  # not closed on its line: the contents end at the line break
