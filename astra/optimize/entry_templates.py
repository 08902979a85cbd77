"""Launch-geometry template arguments that the caller, not the kernel file, chooses.

SGLang's loaders often pass a kernel's block size as a template argument of the host entry
(`make_cpp_args(max_copies, DISPATCH_BLOCK_DIM)` builds `dispatch_probability<288, 256>`). The kernel
file never writes that 256, so the literal search of astra.optimize.param_space cannot move it. This
module finds each integer literal of a spec's wrapper entry whose template parameter is named like a
launch or tile size (BLOCK_DIM, Threads, kNumWarps, ...) and describes how to set it inside the file:
the parameter is left unnamed in the template's list and declared as a constant at the top of the
function's (or struct's) body, so every use in that body sees the new value. A candidate that wins this
way says in its description that the same change can be made where the caller passes the argument.

`find(text, entries)` gives (name, value, insert position, insert text format, rename edit) per slot;
astra.optimize.param_space turns each into a `tmpl` Param.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from astra.cxx import decls
from astra.optimize import cpp_args

_ENTRY = re.compile(r"^\s*(?:[\w]+::)*(?P<name>\w+)\s*<(?P<args>.*)>\s*(?:::\s*\w+)?\s*$", re.S)
_INT_PARAM = re.compile(r"^\s*(?:int|unsigned(?:\s+int)?|u?int(?:32|64)_t|size_t|uint)\s+(?P<name>\w+)\s*(?:=[^,]*)?$")


@dataclass(frozen=True)
class Slot:
    name: str  # the template parameter: BLOCK_DIM
    value: int  # what the spec's entry passes: 256
    at: int  # where the constant goes (the end of the line of the body's opening brace)
    line_format: str  # "\n  constexpr int BLOCK_DIM = {};  // ..." (format with the value)
    rename: tuple[int, int, str]  # (start, end, text): the template parameter's name left unnamed
    owner: str  # "function dispatch_probability" or "struct MhcPostCombineNormPrefill"


def split_top(text: str) -> list[str]:
    """`a, b<c, d>, {e(f, g)}` -> ["a", "b<c, d>", "{e(f, g)}"]: commas outside any bracket."""
    parts, depth, start = [], 0, 0
    for i, ch in enumerate(text):
        if ch in "<({[":
            depth += 1
        elif ch in ">)}]":
            depth -= 1
        elif ch == "," and depth == 0:
            parts.append(text[start:i])
            start = i + 1
    parts.append(text[start:])
    return [p.strip() for p in parts]


def _template_of(code: str, name: str) -> tuple[int, int, int, str] | None:
    """(list start, list end, body's opening brace, kind) of the template that declares `name` as a
    function or a struct/class, with a body (a definition, not a declaration)."""
    for m in re.finditer(r"\btemplate\s*<", code):
        lt = m.end() - 1
        gt = cpp_args.closing(code, lt)
        if gt is None:
            continue
        head = re.match(r"\s*(?:(?P<agg>struct|class)\s+(?P<aname>\w+)|(?P<fn>[^;{}()]*?\b(?P<fname>\w+)\s*\())",
                        code[gt + 1:], re.S)
        if head is None:
            continue
        if head.group("agg") and head.group("aname") == name:
            brace = code.find("{", gt + 1)
            semi = code.find(";", gt + 1)
            if brace != -1 and (semi == -1 or brace < semi):
                return lt + 1, gt, brace, "struct"
        elif head.group("fn") and head.group("fname") == name:
            open_paren = gt + 1 + head.end() - 1
            close = cpp_args.closing(code, open_paren)
            if close is None:
                continue
            after = re.match(r"[^;{]*\{", code[close + 1:])
            if after:
                return lt + 1, gt, close + 1 + after.end() - 1, "function"
    return None


def find(text: str, entries: list[str], tunable) -> list[Slot]:
    """The launch-geometry template arguments of `entries` (wrapper entry strings, placeholders allowed)
    that a template defined in `text` receives as integer literals; `tunable(name)` says whether a
    template parameter's name is one worth moving."""
    code = decls.blank_code(text)
    slots: list[Slot] = []
    seen: set[tuple[str, str]] = set()
    for entry in entries:
        m = _ENTRY.match(entry)
        if m is None:
            continue
        args = split_top(m.group("args"))
        found = _template_of(code, m.group("name"))
        if found is None:
            continue
        start, end, brace, kind = found
        params = _spans(code, start, end)
        if len(params) != len(args):
            continue
        for arg, (pstart, ptext) in zip(args, params):
            pm = _INT_PARAM.match(ptext)
            if not (arg.isdigit() and pm and tunable(pm.group("name"))):
                continue
            pname = pm.group("name")
            if (m.group("name"), pname) in seen:
                continue
            seen.add((m.group("name"), pname))
            name_at = pstart + pm.start("name")
            decl = "constexpr int" if kind == "function" else "static constexpr int"
            line = f"\n  {decl} {pname} = {{}};  // Astra: set here; the caller passes {arg} (change it there instead)"
            eol = code.find("\n", brace)  # after a comment that ends the brace's line
            slots.append(Slot(pname, int(arg), eol if eol != -1 else brace + 1, line,
                              (name_at, name_at + len(pname), f"/*{pname}: set in the body*/"),
                              f"{kind} {m.group('name')}"))
    return slots


def _spans(code: str, start: int, end: int) -> list[tuple[int, str]]:
    """Each top-level parameter of the template list code[start:end] with where it starts."""
    out, depth, begin = [], 0, start
    for i in range(start, end):
        ch = code[i]
        if ch in "<({[":
            depth += 1
        elif ch in ">)}]":
            depth -= 1
        elif ch == "," and depth == 0:
            out.append(begin)
            begin = i + 1
    out.append(begin)
    spans = []
    for j, b in enumerate(out):
        e = out[j + 1] - 1 if j + 1 < len(out) else end
        raw = code[b:e]
        lead = len(raw) - len(raw.lstrip())
        spans.append((b + lead, raw.strip()))
    return spans
