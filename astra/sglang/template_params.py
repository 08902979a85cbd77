"""Template parameter lists, call conditions and scopes of C++ source text read by hand (no compiler,
no libclang), for astra.sglang.source_facts.

`template_params(text, "Kernel")` reads the parameters of `template <int kVec, typename T = float>
struct Kernel` (`parse_param` one of them), `class_templates` the class templates a text defines and
`fits_template_param` which of them a template template parameter accepts; `call_condition(text, i)`
is the first argument of the call whose `(` is at `i` (a `static_assert`'s condition); `drop_inactive`
blanks the `#ifdef USE_ROCM`-like branches a CUDA compile skips; `Scopes` are the `{...}` blocks of a
text with the named scope and the `if constexpr` guards around a position. Brackets and top-level
commas follow astra.cxx.brackets; the text given is blanked first (astra.cxx.text).
"""

from __future__ import annotations

import bisect
import re
from dataclasses import dataclass

from astra.cxx.brackets import closing, levels, spans, split_top
from astra.cxx.text import blank


@dataclass(frozen=True)
class TemplateParam:
    name: str
    kind: str  # "type" | "value" | "template" | "pack"
    type: str  # the declared type of a value parameter ("" for a type parameter)
    default: str | None = None


def parse_param(text: str) -> TemplateParam | None:
    """One template parameter declaration (`int kVec = 4`, `typename T`, `bool... kFlags`)."""
    text = " ".join(text.split())
    if not text:
        return None
    decl, _, default = text.partition("=")
    decl, default = decl.strip(), default.strip() or None
    if decl.startswith("template"):  # `template <uint32_t> class Trait`: its parameters' text as the type
        inner = re.match(r"template\s*<(.*)>\s*(?:class|typename)", decl)
        return TemplateParam(decl.split()[-1], "template", inner.group(1).strip() if inner else "", default)
    m = re.fullmatch(r"(typename|class)\s*(\.\.\.)?\s*(\w+)?", decl)
    if m:
        return TemplateParam(m.group(3) or "", "pack" if m.group(2) else "type", "", default)
    m = re.fullmatch(r"(.+?)\s*(\.\.\.)?\s*\b(\w+)", decl)
    if not m:
        return None
    return TemplateParam(m.group(3), "pack" if m.group(2) else "value", m.group(1).strip(), default)


def template_params(text: str, name: str) -> list[TemplateParam] | None:
    """The template parameters of class or function template `name` (its first primary declaration)."""
    for m in re.finditer(r"\btemplate\s*<", text):
        close = closing(text, m.end() - 1)
        if close is None:
            continue
        head = text[close + 1:close + 601]
        declared = re.match(r"\s*(?:struct|class)\s+(?:\[\[[^\]]*\]\]\s*)?(?:\w+::)*(\w+)\s*(<)?", head)
        if declared:
            if declared.group(1) != name or declared.group(2):
                continue
        else:
            stop = re.search(r"[;{=]", head)
            before_call = head[:stop.start()] if stop else head
            call = re.search(r"\b(\w+)\s*\(", before_call)
            if not call or call.group(1) != name:
                continue
        params = [parse_param(p) for p in split_top(text[m.end():close])]
        return [p for p in params if p is not None]
    return None


def class_templates(text: str) -> list[str]:
    """Names of the class templates `text` defines (`template <...> struct Name {`), in order."""
    out = []
    for m in re.finditer(r"\btemplate\s*<", text):
        close = closing(text, m.end() - 1)
        declared = re.match(r"\s*(?:struct|class)\s+(?:\[\[[^\]]*\]\]\s*)?(\w+)\s*(?::[^;{]*)?\{",
                            text[close + 1:close + 401]) if close is not None else None
        if declared:
            out.append(declared.group(1))
    return list(dict.fromkeys(out))


def fits_template_param(param: TemplateParam, params: list[TemplateParam]) -> bool:
    """Whether a class template with `params` may be the argument of template template parameter `param`."""
    wanted = [parse_param(p) if len(p.split()) > 1 or p in ("typename", "class") else TemplateParam("", "value", p)
              for p in split_top(param.type)] if param.type else []  # the parameters may be unnamed
    wanted = [w for w in wanted if w is not None]
    if len(wanted) != len(params) or any(p.kind == "pack" for p in [*wanted, *params]):
        return False
    return all(w.kind == p.kind and (w.kind != "value" or w.type.split("::")[-1] == p.type.split("::")[-1])
               for w, p in zip(wanted, params))


def call_condition(text: str, start: int, code: str | None = None) -> str | None:
    """The first argument of the call whose '(' is at `start` (`static_assert(std::is_same_v<A, B> &&
    x < y, "...")` -> `std::is_same_v<A, B> && x < y`), as `text` writes it with white space folded;
    None when the call does not close or has no argument. Brackets and commas are read in `code`,
    `text` with its comments and literals blanked (astra.cxx.text.blank; made here when not given)."""
    code = blank(text) if code is None else code
    close = closing(code, start)
    pieces = spans(code, start + 1, close) if close is not None else []
    if not pieces:
        return None
    begin, end = pieces[0]
    return " ".join(text[begin:end].split()) or None


def namespace_of(text: str) -> str:
    """The namespace an enum is declared in, relative to `sglang` (the exports' namespace)."""
    names = re.findall(r"\bnamespace\s+([\w:]+)\s*\{", text)
    inner = [n for part in names for n in part.split("::") if n not in ("sglang",)]
    return "::".join(n for n in inner[:1] if not n.startswith(("detail", "impl", "anon")))


# ---------------------------------------------------------------- preprocessor branches and scopes

_PP = re.compile(r"^[ \t]*#[ \t]*(if|ifdef|ifndef|elif|else|endif)\b(.*)$", re.M)
_UNDEFINED = {"USE_ROCM", "__HIP_PLATFORM_AMD__", "__HIPCC__", "USE_HIP", "__HIP__"}  # not set on CUDA


def drop_inactive(text: str) -> str:
    """`text` without the branches of `#ifdef USE_ROCM`-like blocks a CUDA compile skips (lines
    blanked, so offsets stay); a condition on anything else keeps every branch. Give it text whose
    comments are blanked (astra.cxx.text.blank)."""
    lines = text.split("\n")
    stack: list[bool | None] = []  # per open #if: True/False (branch taken) or None (unknown)
    for i, line in enumerate(lines):
        m = _PP.match(line)
        if m:
            kind, cond = m.group(1), m.group(2).strip()
            if kind in ("if", "ifdef", "ifndef"):
                stack.append(_known_branch(kind, cond))
            elif kind in ("elif", "else") and stack:
                stack[-1] = None if stack[-1] is None or kind == "elif" else not stack[-1]
            elif kind == "endif" and stack:
                stack.pop()
            continue
        if any(taken is False for taken in stack):
            lines[i] = " " * len(line)
    return "\n".join(lines)


def _known_branch(kind: str, cond: str) -> bool | None:
    """Whether CUDA takes the branch of `#if(n)def X` / `#if (!)defined(X)` for X in _UNDEFINED."""
    if kind != "if":
        return (kind == "ifndef") if cond in _UNDEFINED else None
    m = re.fullmatch(r"(!?)\s*defined\s*\(?\s*(\w+)\s*\)?", cond)
    return bool(m.group(1)) if m and m.group(2) in _UNDEFINED else None


@dataclass
class Block:
    start: int  # the `{`
    end: int  # just past the `}` (-1: never closed)
    header: str  # the text before `{`, back to the previous `;`, `{` or `}`
    parent: int  # index of the enclosing block (-1: none)
    prev: int  # index of the previous block with the same parent (-1: none)


_NOT_NAMES = {"if", "for", "while", "switch", "catch", "decltype", "noexcept", "sizeof", "alignas",
              "__launch_bounds__", "__attribute__", "requires", "static_assert", "return"}


class Scopes:
    """The `{...}` blocks of C++ text: which named scope (struct, class or function, outside any other)
    holds a position, and which `if constexpr` conditions guard it."""

    def __init__(self, text: str):
        masked = blank(text)
        self.blocks: list[Block] = []
        stack: list[int] = []
        last_child: dict[int, int] = {}
        stop = 0
        for i, c in enumerate(masked):
            if c == "{":
                parent = stack[-1] if stack else -1
                self.blocks.append(Block(i, -1, " ".join(masked[stop:i].split()), parent,
                                         last_child.get(parent, -1)))
                last_child[parent] = len(self.blocks) - 1
                stack.append(len(self.blocks) - 1)
                stop = i + 1
            elif c == "}":
                if stack:
                    self.blocks[stack.pop()].end = i + 1
                stop = i + 1
            elif c == ";":
                stop = i + 1
        self.names = [block_name(b.header) for b in self.blocks]

    def enclosing(self, pos: int) -> list[int]:
        """Indices of the blocks around `pos`, outermost first."""
        starts = [b.start for b in self.blocks]
        i = bisect.bisect_left(starts, pos) - 1  # the last block opened before pos: those around pos
        out = []  # are it or its ancestors (blocks nest)
        while i >= 0:
            b = self.blocks[i]
            if b.end < 0 or pos < b.end:
                out.append(i)
            i = b.parent
        return out[::-1]

    def named(self, pos: int) -> list[str]:
        """The named scopes around `pos`, outermost first (empty at namespace level)."""
        return [self.names[i] for i in self.enclosing(pos) if self.names[i]]

    def top(self, pos: int) -> str | None:
        """The outermost named scope around `pos` (None at namespace level)."""
        return next(iter(self.named(pos)), None)

    def guards(self, pos: int) -> list[str]:
        """The conditions under which `pos` is compiled: those of the `if constexpr` branches around it."""
        out = []
        for i in self.enclosing(pos):
            cond = self._branch_condition(i)
            if cond:
                out.append(cond)
        return out

    def _branch_condition(self, i: int) -> str | None:
        header = self.blocks[i].header
        own = constexpr_condition(header)
        if own is None and not re.search(r"(?:^|\s)else$", header):
            return None
        earlier, j = [], self.blocks[i].prev
        while re.match(r"else\b", header) and j >= 0:  # the earlier branches of the chain did not apply
            header = self.blocks[j].header
            cond = constexpr_condition(header)
            if cond is None:
                return None  # a runtime if: its branches are all compiled
            earlier.append(f"!({cond})")
            j = self.blocks[j].prev
        parts = [*reversed(earlier), *([f"({own})"] if own else [])]
        return " && ".join(parts) or None

    def bodies(self, text: str) -> dict[str, list[str]]:
        """{name: [header and body text]} of the named scopes that no other named scope holds."""
        out: dict[str, list[str]] = {}
        for i, b in enumerate(self.blocks):
            if self.names[i] and not self._named_ancestor(i):
                out.setdefault(self.names[i], []).append(b.header + text[b.start:b.end if b.end > 0 else None])
        return out


    def _named_ancestor(self, i: int) -> bool:
        i = self.blocks[i].parent
        while i >= 0 and not self.names[i]:
            i = self.blocks[i].parent
        return i >= 0


def constexpr_condition(header: str) -> str | None:
    m = re.search(r"(?:^|\s)if\s+constexpr\s*\(", header)
    return call_condition(header, m.end() - 1) if m else None


def block_name(header: str) -> str | None:
    """The struct, class or function a block with this header opens (None: namespace, control flow,
    lambda, enum, initializer)."""
    text = header
    while (m := re.search(r"\btemplate\s*<", text)) is not None:  # drop the template heads
        close = closing(text, m.end() - 1)
        if close is None:
            break
        text = text[:m.start()] + " " + text[close + 1:]
    if re.search(r"\b(namespace|enum)\b|^extern\b", text):
        return None
    m = re.search(r"\b(?:struct|class|union)\s+(?:\[\[[^\]]*\]\]\s*)?(?:alignas\s*\([^)]*\)\s*)?(\w+)", text)
    if m:
        return m.group(1)
    if re.match(r"(else|do|try)\b", text) or "=" in text.split("(")[0]:
        return None
    top, flat, opened = set(), list(text), None  # flat: `text` without its top-level template arguments
    for i, depth, role in levels(text):
        if depth:
            continue
        if not role:
            top.add(i)
        elif role == "open" and text[i] == "<":
            opened = i
        elif role == "close" and text[i] == ">" and opened is not None:
            flat[opened:i + 1] = " " * (i + 1 - opened)
            opened = None
    called = [m.group(1) for m in re.finditer(r"\b(\w+)\s*(?=\()", "".join(flat))
              if m.start() in top and m.group(1) not in _NOT_NAMES]  # `dequant<half2, id()>(...)` names dequant
    return called[-1] if called else None


def inline_names(cond: str, local: dict[str, str], depth: int = 0) -> str:
    """`cond` with the names a scope defines itself replaced by their definitions."""
    if not local or depth > 8:
        return cond
    new = re.sub(r"(?<![\w:.])[A-Za-z_]\w*\b", lambda m: f"({local[m.group(0)]})" if m.group(0) in local
                 else m.group(0), cond)
    return cond if new == cond else inline_names(new, local, depth + 1)


def bind_names(cond: str, binding: dict[str, str]) -> str:
    """`cond` with a template's parameters replaced, once, by the arguments the entry gives them."""
    if not binding:
        return cond
    return re.sub(r"(?<![\w:.])[A-Za-z_]\w*\b", lambda m: f"({binding[m.group(0)]})" if m.group(0) in binding
                  else m.group(0), cond)
