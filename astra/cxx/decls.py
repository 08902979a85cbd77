"""A C++ file cut into its namespace-scope pieces: declarations, preprocessor lines, namespace braces.

`layout(text)` returns every piece at namespace scope in order: each declaration (a kernel, a struct,
a host function, a constant, a `using`) with its span, the comments just above it and the names it
declares; each preprocessor line at namespace scope (with its continuations); and the opening
(`namespace demo {`, `extern "C" {`) and closing `}` of each namespace, which is entered, not a
declaration. `chunks(text)` is the declarations alone. Blank lines and comments fall between pieces.

A declaration's name is a record's or alias's, else the identifier before its parameter list or
initializer (`#if` lines inside it are not read for it); `Chunk.names` adds what a reader looks it up
under: the class of an out-of-class member definition (`Cls<T>::run(...)` is found under `Cls`), and
for a namespace-scope `static_assert` the file's names it checks. A `#define` is found under its macro.

The scan is lexical (astra.cxx.text.blank: comments and literals blanked, offsets kept). Conditional
compilation is read as the compiler would read either branch: at `#else`/`#elif` the brace depth goes
back to what it was at the `#if`, and after `#endif` it is what the first branch left, so a function
whose branches each open a brace (`#if A` / `if (x) {` / `#else` / `if (y) {` / `#endif`) stays one
declaration, and declarations in either branch are pieces of their own. A `}` that closes nothing
in a declaration ends it (a macro call without `;` before its namespace closes).

Two users: band dispatch (astra.optimize.band_dispatch) matches two versions of a file chunk by chunk
by name and copies the ones that differ; the testing agent (astra.spec.llm_draft) shows a
model the declarations an entry reaches, with their comments and the file's includes and namespaces.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field, replace

from astra.cxx.brackets import closing
from astra.cxx.text import blank

_NAMESPACE = re.compile(r'(?:inline\s+)?namespace\b[\w:\s]*\{|extern\s*"\s*"\s*\{')
_DIRECTIVE = re.compile(r"#\s*(\w*)")
_DEFINE = re.compile(r"#\s*define\s+(?P<name>[A-Za-z_]\w*)")
_DIRECTIVE_LINE = re.compile(r"^[ \t]*#(?:[^\n]*\\\n)*[^\n]*", re.M)
_IDENT = re.compile(r"[A-Za-z_]\w*")
_TEMPLATE = re.compile(r"\s*template\s*<")
_RECORD = re.compile(r"^\s*(?:struct|class|union|enum(?:\s+class)?)\b\s*(?:(?:alignas|__align__)\s*\([^()]*\)\s*)?"
                     r"(?:\[\[[^\]]*\]\]\s*)?(?P<name>\w+)")
_USING = re.compile(r"^\s*using\s+(?P<name>\w+)\s*=")
_QUALIFIED = re.compile(r"(?P<owner>[A-Za-z_]\w*)\s*(?:<[^;{}()]*>)?\s*::\s*~?(?P<member>[A-Za-z_]\w*)\s*\(")
_NOT_A_NAME = {"__launch_bounds__", "__align__", "alignas", "__attribute__", "decltype", "__declspec", "sizeof",
               "operator"}

DECLARATION, DIRECTIVE, NAMESPACE, CLOSE = "declaration", "directive", "namespace", "close"


@dataclass(frozen=True)
class Chunk:
    name: str  # the name it declares ("" when the scan cannot tell; a #define's macro; "" for the others)
    start: int
    end: int
    kind: str = DECLARATION  # DECLARATION | DIRECTIVE | NAMESPACE (`namespace x {`) | CLOSE (its `}`)
    lead: int = -1  # where the comments just above it begin (its start when there are none)
    # other names a reader finds it under: `Cls` of an out-of-class `Cls<T>::run(...)`, the names a
    # namespace-scope `static_assert` checks
    found_under: frozenset[str] = field(default_factory=frozenset)

    @property
    def names(self) -> frozenset[str]:
        """The names a reader looking one up finds this piece under: what it declares, and `found_under`."""
        return frozenset({self.name} - {"", "static_assert"}) | self.found_under


def chunks(text: str) -> list[Chunk]:
    """The declarations at namespace scope of `text`, in order (see the module docstring)."""
    return [c for c in _scan(text)[0] if c.kind == DECLARATION]


def layout(text: str) -> list[Chunk] | None:
    """Every piece at namespace scope of `text`, in order; None when its braces do not balance."""
    pieces, balanced = _scan(text)
    return pieces if balanced else None


def _scan(text: str) -> tuple[list[Chunk], bool]:
    """(the pieces of `text`, whether its braces balance)."""
    code = blank(text)
    out: list[Chunk] = []
    n, i = len(code), 0
    ns_depth, depth, start, previous = 0, 0, None, 0  # start: of the declaration being read
    branches: list[list] = []  # per open #if: [(ns_depth, depth) at the #if, the same after its first branch]
    balanced = True

    def piece(kind: str, begin: int, end: int) -> None:
        nonlocal previous
        lead = next((j for j in range(previous, begin) if code[j] != text[j] and not text[j].isspace()), begin)
        name, found_under = "", frozenset()
        if kind == DIRECTIVE:
            m = _DEFINE.match(code, begin, end)
            name = m.group("name") if m else ""
        elif kind == DECLARATION:
            decl = _DIRECTIVE_LINE.sub(lambda m: " " * len(m.group()), code[begin:end])  # `#if` lines declare nothing
            name = _name(decl)
            if name == "static_assert":  # the file's names it checks: filled in once all are known
                found_under = frozenset(_IDENT.findall(decl))
            elif name:
                found_under = frozenset(m.group("owner") for m in _QUALIFIED.finditer(_head(decl))
                                        if m.group("member") == name)
        out.append(Chunk(name, begin, end, kind, lead, found_under))
        previous = end

    while i < n:
        c = code[i]
        if c == "#" and not code[code.rfind("\n", 0, i) + 1:i].strip():
            end = _directive_end(code, i)
            ns_depth, depth = _conditional(_DIRECTIVE.match(code, i).group(1), branches, (ns_depth, depth))
            if start is None:
                piece(DIRECTIVE, i, end)
            i = end
            continue
        if start is None:
            if c.isspace() or c == ";":
                i += 1
                continue
            m = _NAMESPACE.match(code, i)
            if m:
                ns_depth += 1
                piece(NAMESPACE, i, m.end())
                i = m.end()
                continue
            if c == "}":
                if ns_depth:
                    ns_depth -= 1
                    piece(CLOSE, i, i + 1)
                else:
                    balanced = False
                i += 1
                continue
            start, depth = i, 0
        if c in "([{":
            depth += 1
        elif c == "}" and depth == 0:  # closes the namespace: the declaration ends before it
            piece(DECLARATION, start, len(code[:i].rstrip()))
            start = None
            continue
        elif c in ")]}":
            depth -= 1
            if depth == 0 and c == "}":
                end = _after_body(code, start, i)
                piece(DECLARATION, start, end)
                start, i = None, end
                continue
        elif c == ";" and depth == 0:
            piece(DECLARATION, start, i + 1)
            start = None
        i += 1
    if start is not None:
        piece(DECLARATION, start, n)
        balanced = balanced and depth == 0
    declared = {c.name for c in out} - {"", "static_assert"}
    out = [replace(c, found_under=c.found_under & declared) if c.name == "static_assert" else c for c in out]
    return out, balanced and ns_depth == 0


def _directive_end(code: str, i: int) -> int:
    """The end of the preprocessor line at `i`, its backslash continuations included (before its `\\n`)."""
    end = code.find("\n", i)
    while end > 0 and code[end - 1] == "\\":
        end = code.find("\n", end + 1)
    return len(code) if end < 0 else end


def _conditional(directive: str, branches: list[list], depths: tuple[int, int]) -> tuple[int, int]:
    """The (namespace, declaration) brace depths after the directive `directive`: each branch of an
    `#if` starts at the depths of the `#if`, and after `#endif` the depths are those its first branch
    left (see the module docstring)."""
    if directive in ("if", "ifdef", "ifndef"):
        branches.append([depths, None])
    elif directive in ("elif", "else") and branches:
        if branches[-1][1] is None:
            branches[-1][1] = depths
        return branches[-1][0]
    elif directive == "endif" and branches:
        at_if, after_first = branches.pop()
        return after_first if after_first is not None else depths
    return depths


def _after_body(code: str, start: int, close: int) -> int:
    """The end of the declaration from `start` whose outermost braces close at `close`: after the `;`
    that follows them, or, for an initializer (`int a[] = {...}, b;`), after the next `;`."""
    j = close + 1
    while j < len(code) and code[j].isspace():
        j += 1
    if j < len(code) and code[j] == ";":
        return j + 1
    if _is_initializer(code[start:close]):
        semi = code.find(";", close)
        return semi + 1 if semi != -1 else len(code)
    return close + 1


def _is_initializer(head: str) -> bool:
    """Whether the braces that just closed were an initializer (`= {...}`), not a body."""
    head = _strip_template_head(head)
    return head[: head.find("{")].rstrip().endswith("=") if "{" in head else False


def _strip_template_head(decl: str) -> str:
    """`decl` without its leading `template <...>` heads."""
    while (m := _TEMPLATE.match(decl)) is not None:
        close = closing(decl, m.end() - 1)
        decl = decl[close + 1:] if close is not None else ""
    return decl


def _head(decl: str) -> str:
    """The part of a declaration before its body: where the names it declares stand."""
    decl = _strip_template_head(decl)
    return decl[: decl.find("{") + 1] if "{" in decl else decl


def _name(decl: str) -> str:
    """The name a declaration declares: a record's or alias's, else the identifier before the first `(`
    that opens a parameter list (not an attribute's), or before `=`, `[` or `;` for a variable."""
    decl = _strip_template_head(decl)
    for pattern in (_USING, _RECORD):
        m = pattern.match(decl)
        if m and (pattern is _USING or re.match(r"\s*(?:final\b\s*)?[{:;<]", decl[m.end():])):
            return m.group("name")
    head = _head(decl)
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
    words = set(re.findall(r"\w+", blank(text)))
    return names & words
