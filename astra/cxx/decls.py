"""A CUDA file cut into its namespace-scope declarations, for edits that copy or change whole ones.

`chunks(text)` returns each declaration at namespace scope (a kernel, a struct, a host function, a
constant, a `using`) with its span and the name it declares; namespace braces, blank lines and
preprocessor lines fall between chunks. The scan is lexical (comments and string literals blanked,
offsets kept) and only has to agree with itself on two versions of one file: band dispatch
(astra.optimize.band_dispatch) matches the two versions' chunks by name and copies the ones that differ.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

_NOT_CODE = re.compile(r'//[^\n]*|/\*.*?\*/|"(?:\\.|[^"\\\n])*"|\'(?:\\.|[^\'\\\n])\'', re.S)
_NAMESPACE = re.compile(r'(?:inline\s+)?namespace\b[\w:\s]*\{|extern\s*"[^"]*"\s*\{')
_TEMPLATE = re.compile(r"\s*template\s*<")
_RECORD = re.compile(r"^\s*(?:struct|class|union|enum(?:\s+class)?)\b\s*(?:(?:alignas|__align__)\s*\([^()]*\)\s*)?"
                     r"(?:\[\[[^\]]*\]\]\s*)?(?P<name>\w+)")
_USING = re.compile(r"^\s*using\s+(?P<name>\w+)\s*=")
_NOT_A_NAME = {"__launch_bounds__", "__align__", "alignas", "__attribute__", "decltype", "__declspec", "sizeof",
               "operator"}


@dataclass(frozen=True)
class Chunk:
    name: str  # "" for a declaration whose name the scan cannot tell
    start: int
    end: int


def blank_code(text: str) -> str:
    """`text` with comments and string/char literals replaced by spaces (newlines kept)."""
    return _NOT_CODE.sub(lambda m: re.sub(r"[^\n]", " ", m.group()), text)


def chunks(text: str) -> list[Chunk]:
    code = _first_branches(blank_code(text))
    out: list[Chunk] = []
    i, n, depth_ns = 0, len(code), 0
    while i < n:
        c = code[i]
        if c.isspace() or c == ";":
            i += 1
            continue
        if c == "#":  # a preprocessor line, with its continuations
            while i < n and code[i] != "\n":
                i += 2 if code[i] == "\\" else 1
            continue
        m = _NAMESPACE.match(code, i)
        if m:
            depth_ns += 1
            i = m.end()
            continue
        if c == "}" and depth_ns:
            depth_ns -= 1
            i += 1
            continue
        end = _declaration_end(code, i)
        out.append(Chunk(_name(code[i:end]), i, end))
        i = end
    return out


def _first_branches(code: str) -> str:
    """`code` with the `#else`/`#elif` branches of each conditional blanked (offsets kept): branches that
    each open a brace would otherwise count twice."""
    out, skipping, depth = [], 0, 0  # skipping: the depth of the conditional whose later branch this is
    for line in code.splitlines(keepends=True):
        word = re.match(r"\s*#\s*(\w+)", line)
        directive = word.group(1) if word else ""
        if directive in ("if", "ifdef", "ifndef"):
            depth += 1
        elif directive in ("else", "elif") and not skipping:
            skipping = depth
        elif directive == "endif":
            if skipping == depth:
                skipping = 0
            depth -= 1
        out.append(re.sub(r"[^\n]", " ", line) if skipping and directive not in ("endif",) else line)
    return "".join(out)


def _declaration_end(code: str, start: int) -> int:
    """The end of the declaration at `start`: after its `;` at depth 0, or after its outermost `}` (and the
    `;` that may follow it)."""
    depth, i, n = 0, start, len(code)
    while i < n:
        c = code[i]
        if c in "([{":
            depth += 1
        elif c in ")]}":
            depth -= 1
            if depth == 0 and c == "}":
                j = i + 1
                while j < n and code[j].isspace():
                    j += 1
                if j < n and code[j] == ";":
                    return j + 1
                if _is_initializer(code[start:i]):  # `int a[] = {...}, b;`
                    semi = code.find(";", i)
                    return semi + 1 if semi != -1 else n
                return i + 1
        elif c == ";" and depth == 0:
            return i + 1
        i += 1
    return n


def _is_initializer(head: str) -> bool:
    """Whether the braces that just closed were an initializer (`= {...}`), not a body."""
    head = _strip_template_head(head)
    return head[: head.find("{")].rstrip().endswith("=") if "{" in head else False


def _strip_template_head(decl: str) -> str:
    while True:
        m = _TEMPLATE.match(decl)
        if not m:
            return decl
        depth, i = 1, m.end()
        while i < len(decl) and depth:
            depth += {"<": 1, ">": -1}.get(decl[i], 0)
            i += 1
        decl = decl[i:]


def _name(decl: str) -> str:
    """The name a declaration declares: a record's or alias's, else the identifier before the first `(`
    that opens a parameter list (not an attribute's), or before `=`, `[` or `;` for a variable."""
    decl = _strip_template_head(decl)
    for pattern in (_USING, _RECORD):
        m = pattern.match(decl)
        if m and (pattern is _USING or re.match(r"\s*(?:final\b\s*)?[{:;<]", decl[m.end():])):
            return m.group("name")
    head = decl[: decl.find("{") + 1] if "{" in decl else decl  # the name comes before any body
    m = re.search(r"\boperator\s*(?P<op>[^\s(]+)\s*\(", head)
    if m:
        return "operator" + m.group("op")
    for m in re.finditer(r"(?P<name>~?\w+)\s*(?:<[^;{}()]*>)?\s*(?P<open>[(=\[;{])", head):
        name = m.group("name")
        if name in _NOT_A_NAME:
            continue
        if m.group("open") == "(" and re.fullmatch(r"\d+", name):
            continue
        return name.lstrip("~")
    return ""


def references(text: str, names: set[str]) -> set[str]:
    """Which of `names` the code of `text` mentions (whole words, comments and strings left out)."""
    if not names:
        return set()
    words = set(re.findall(r"\w+", blank_code(text)))
    return names & words
