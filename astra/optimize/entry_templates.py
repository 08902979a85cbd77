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

from astra.cxx import entry as cxx_entry
from astra.cxx.brackets import closing, spans
from astra.cxx.text import blank

_INT_PARAM = re.compile(r"^\s*(?:int|unsigned(?:\s+int)?|u?int(?:32|64)_t|size_t|uint)\s+(?P<name>\w+)\s*(?:=[^,]*)?$")


@dataclass(frozen=True)
class Slot:
    name: str  # the template parameter: BLOCK_DIM
    value: int  # what the spec's entry passes: 256
    at: int  # where the constant goes (the end of the line of the body's opening brace)
    line_format: str  # "\n  constexpr int BLOCK_DIM = {};  // ..." (format with the value)
    rename: tuple[int, int, str]  # (start, end, text): the template parameter's name left unnamed
    owner: str  # "function dispatch_probability" or "struct MhcPostCombineNormPrefill"


def _template_of(code: str, name: str) -> tuple[int, int, int, str] | None:
    """(list start, list end, body's opening brace, kind) of the template that declares `name` as a
    function or a struct/class, with a body (a definition, not a declaration)."""
    for m in re.finditer(r"\btemplate\s*<", code):
        lt = m.end() - 1
        gt = closing(code, lt)
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
            close = closing(code, open_paren)
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
    code = blank(text)
    slots: list[Slot] = []
    seen: set[tuple[str, str]] = set()
    for entry in entries:
        owner = _listed_owner(entry)
        if owner is None:
            continue
        name, args = owner.name, list(owner.args)
        found = _template_of(code, name)
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
            if (name, pname) in seen:
                continue
            seen.add((name, pname))
            name_at = pstart + pm.start("name")
            decl = "constexpr int" if kind == "function" else "static constexpr int"
            line = f"\n  {decl} {pname} = {{}};  // Astra: set here; the caller passes {arg} (change it there instead)"
            eol = code.find("\n", brace)  # after a comment that ends the brace's line
            slots.append(Slot(pname, int(arg), eol if eol != -1 else brace + 1, line,
                              (name_at, name_at + len(pname), f"/*{pname}: set in the body*/"),
                              f"{kind} {name}"))
    return slots


def _listed_owner(entry: str) -> cxx_entry.Segment | None:
    """The one template argument list of `entry` when it is the function's (`fn<...>`) or its class's
    (`Cls<...>::run`); None for an entry with no list or more than one."""
    parts = cxx_entry.segments(entry)
    listed = [s for s in parts if s.args is not None]
    return listed[0] if len(listed) == 1 and listed[0] in parts[-2:] else None


def _spans(code: str, start: int, end: int) -> list[tuple[int, str]]:
    """Each top-level parameter of the template list code[start:end] with where it starts."""
    out = []
    for b, e in spans(code, start, end):
        raw = code[b:e]
        out.append((b + len(raw) - len(raw.lstrip()), raw.strip()))
    return out
