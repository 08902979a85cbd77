"""Read a staged copy from where it came from: rematerialize per-thread arrays of read-only loads.

A kernel that copies a row into a per-thread array (`int32_t maps[MAX_COPIES];` filled by
`maps[c] = row_map[c];` in a loop) and only reads the array afterwards holds the whole row in
registers; when the row is long (256+ columns) the copy spills to local memory, which costs a store
and a load per element on top of the original load. Reading `row_map[e]` wherever `maps[e]` is read
gives the same values when nothing can change that memory in between, needs no registers for the copy,
and loads only the elements actually read (one, for a gather at a computed index).

The transformation applies to an array when all of these hold (anything else is left alone):
- it is a local array of a compile-time size, written exactly once, by `NAME[i] = SRC[expr];` inside
  `for (int i = 0; i < SIZE; ...)` with the array's own SIZE, and never has its address taken or is
  passed whole;
- SRC is declared in the same function as a pointer to const and is never reassigned;
- from that write to the statement holding the array's last read, the code stores nothing outside
  local arrays and scalars (no subscripted or dereferenced store to another array, no store
  intrinsic such as `__stcs`, no atomics, no barriers, no inline assembly), and neither does any
  loop a read sits in, so no thread can change what SRC points to in between.
Every proposal is still built and verified by the harness like any other candidate.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from astra.cxx.brackets import closing, enclosing, opening
from astra.cxx.text import blank

_ARRAY = re.compile(r"^[ \t]*(?P<type>(?:const\s+)?[\w:]+)\s+(?P<name>\w+)\s*\[\s*(?P<size>\w+)\s*\]\s*;[ \t]*\n", re.M)
_FILL = r"^[ \t]*{name}\s*\[\s*(?P<idx>\w+)\s*\]\s*=\s*(?P<src>\w+)\s*\[(?P<expr>[^\[\];]*)\]\s*;[ \t]*\n"
_FOR = re.compile(r"for\s*\(\s*(?:int|unsigned|uint32_t|int32_t|size_t|auto)\s+(?P<var>\w+)\s*=\s*0\s*;\s*(?P=var)\s*<\s*"
                  r"(?P<bound>\w+)\s*;[^)]*\)\s*\{")
_HAZARD = re.compile(r"__syncthreads|__syncwarp|\batomic\w*\s*\(|\basm\b|__pipeline|cp\.async|\bmemcpy\b|"
                     r"\bcuda::|__threadfence|\b__st\w*\s*\(|\bst_\w*\s*\(|\bstore\w*\s*\(|\bptx::")


@dataclass(frozen=True)
class Remat:
    array: str
    source: str  # the new file
    line: int  # of the array's declaration
    src: str  # the pointer it was copied from


def _enclosing_body(code: str, pos: int) -> tuple[int, int] | None:
    """The outermost brace pair around `pos` that is a function body (its `{` follows a `)`)."""
    best = next((i for i in enclosing(code, pos) if code[i] == "{"
                 and re.search(r"\)\s*(?:const\s*)?$", code[max(0, i - 200):i])), None)
    close = closing(code, best) if best is not None else None
    return (best, close) if close is not None else None


def _signature_start(code: str, body_start: int) -> int:
    """Where the parameter list of the function whose body opens at `body_start` begins."""
    close = code.rfind(")", 0, body_start)
    opened = opening(code, close) if close != -1 else None
    return opened if opened is not None else body_start


def _statement_start(code: str, pos: int) -> int:
    return max(code.rfind(";", 0, pos), code.rfind("{", 0, pos), code.rfind("}", 0, pos)) + 1


def _local_arrays(body: str) -> set[str]:
    return {m.group("name") for m in _ARRAY.finditer(body)}


def find(text: str) -> list[Remat]:
    """One rematerialization per qualifying array of `text` (see the module docstring)."""
    code = blank(text)
    out: list[Remat] = []
    for decl in _ARRAY.finditer(code):
        name, size, elem = decl.group("name"), decl.group("size"), decl.group("type")
        span = _enclosing_body(code, decl.start())
        if span is None:
            continue
        body_start, body_end = span
        body = code[body_start:body_end]
        uses = [m for m in re.finditer(rf"\b{name}\b", code[decl.end():body_end])]
        fills = list(re.finditer(_FILL.format(name=name), code[decl.end():body_end], re.M))
        if len(fills) != 1 or not uses:
            continue
        fill = fills[0]
        fill_at, fill_end = decl.end() + fill.start(), decl.end() + fill.end()
        after = code[decl.end():body_end]
        if any(not after[u.end():].lstrip().startswith("[") or re.search(r"(?<!&)&\s*$", after[:u.start()])
               for u in uses):
            continue  # passed whole or its address taken
        writes = [u for u in uses if re.match(r"\s*\[[^\];]*\]\s*(?:(?:[-+*/%&|^]|<<|>>)?=(?!=)|\+\+|--)", after[u.end():])]
        if len(writes) != 1:
            continue
        loop = _loop_around(code, fill_at, decl.end())
        if loop is None or loop.group("var") != fill.group("idx") or loop.group("bound") != size:
            continue
        src, expr, idx = fill.group("src"), fill.group("expr").strip(), fill.group("idx")
        src_type = _const_pointer(code[_signature_start(code, body_start):body_end], src)
        moved = rf"\b{src}\s*(?:[-+]?=(?!=)|\+\+|--)|(?:\+\+|--)\s*{src}\b"
        if src_type is None or re.search(moved, code[fill_end:body_end]):
            continue
        # from the fill loop to the last read, and to the end of any loop a read sits in (a later
        # iteration's store runs before that read)
        last_use = decl.end() + uses[-1].start()
        end = max([_statement_start(code, last_use)]
                  + [_loop_end(code, decl.end() + u.start(), loop.start()) for u in uses])
        region = code[loop.start():end]
        if _HAZARD.search(region) or _foreign_store(region, _local_arrays(body), _references(body)):
            continue
        new = _rewrite(text, code, decl, fill_at, fill_end, name, src, expr, idx, elem, src_type, body_end)
        if new is not None:
            out.append(Remat(name, new, text.count("\n", 0, decl.start()) + 1, src))
    return out


def _loop_around(code: str, pos: int, not_before: int):
    """The `for (int i = 0; i < N; ...) {` whose body holds `pos` (the nearest one, after `not_before`)."""
    best = None
    for m in _FOR.finditer(code, not_before, pos):
        close = closing(code, m.end() - 1)
        if close is not None and m.end() <= pos < close:
            best = m
    return best


def _loop_end(code: str, pos: int, not_before: int) -> int:
    """The end of the outermost loop (for, while, do) after `not_before` whose body holds `pos`; 0 if none."""
    end = 0
    for m in re.finditer(r"\b(?:for|while)\s*\(|\bdo\b", code[not_before:pos]):
        at = not_before + m.end()
        if m.group().startswith("do"):
            head_end = at
        else:
            head_end = closing(code, at - 1)
            if head_end is None:
                continue
            head_end += 1
        rest = code[head_end:]
        brace = head_end + len(rest) - len(rest.lstrip())
        close = closing(code, brace) if code.startswith("{", brace) else code.find(";", head_end)
        if close is not None and close != -1 and head_end <= pos <= close:
            end = max(end, close)
    return end


def _const_pointer(body: str, name: str) -> str | None:
    """The pointee type when `name` is declared in the function as a pointer to const."""
    m = re.search(rf"\bconst\s+(?P<type>[\w:]+)\s*\*\s*(?:const\s+)?(?:__restrict__\s+)?{name}\b", body)
    return m.group("type") if m else None


_ASSIGN = re.compile(r"(?:[-+*/%&|^]|<<|>>)?=(?!=)|\+\+|--")


def _target_before(code: str, end: int) -> str:
    """The assigned expression that ends at `end` (scanning back over names, member access, subscripts,
    parenthesized expressions and a leading dereference)."""
    i = end
    while i > 0 and code[i - 1] in " \t\n":
        i -= 1
    start = i
    while i > 0:
        ch = code[i - 1]
        if ch in "])":
            j = opening(code, i - 1)
            if j is None:
                break
            i = j
        elif ch.isalnum() or ch == "_" or ch == ".":
            i -= 1
        elif ch == ">" and i > 1 and code[i - 2] == "-":
            i -= 2
        else:
            break
        start = i
    lead = code[:start].rstrip()
    return ("*" if lead.endswith("*") and not lead.endswith("**") else "") + code[start:end].strip()


def _target_after(code: str, start: int) -> str:
    m = re.match(r"\s*(\*?\s*\w+(?:\s*\[[^\];]*\])*(?:\s*(?:\.|->)\s*\w+)*)", code[start:])
    return m.group(1).strip() if m else ""


def _foreign_store(region: str, locals_: set[str], references: set[str] = frozenset()) -> bool:
    """Whether `region` stores anywhere but a local scalar or a local array element: every assignment
    and increment is classified by its target; a dereference, a member, a cast or a subscript of
    anything but a local array is foreign, and so is a scalar declared as a reference."""
    for m in _ASSIGN.finditer(region):
        if m.group() in ("++", "--"):
            target = _target_before(region, m.start()) or _target_after(region, m.end())
        else:
            target = _target_before(region, m.start())
        if not target:
            continue
        plain = re.fullmatch(r"\w+", target)
        if plain and target not in references:
            continue
        element = re.fullmatch(r"(?P<base>\w+)\s*\[[^;]*\]", target)  # a[i], a[i][j]: nothing after the subscript
        if element and element.group("base") in locals_:
            continue
        return True
    return False


def _references(body: str) -> set[str]:
    return set(re.findall(r"&\s*(\w+)\s*=(?!=)", body))


def _rewrite(text, code, decl, fill_at, fill_end, name, src, expr, idx, elem, src_type, body_end) -> str | None:
    """The file with the array's declaration and fill removed and each read `name[e]` replaced by the
    load it copied (reads nested in an index too); None when a read's brackets do not close."""
    same = re.sub(r"\bconst\b", "", elem).strip() == src_type

    def load(index: str) -> str:
        at = index.strip() if expr == idx else re.sub(rf"\b{idx}\b", f"({index.strip()})", expr)
        return f"{src}[{at}]" if same else f"static_cast<{elem}>({src}[{at}])"

    def subst(lo: int, hi: int) -> str | None:
        """text[lo:hi] with every read replaced (positions found in `code`, where comments are blank)."""
        out, pos = [], lo
        for m in re.finditer(rf"\b{name}\s*\[", code[lo:hi]):
            start = lo + m.start()
            if start < pos:
                continue  # inside an index already handled
            open_at = lo + m.end() - 1
            close = closing(code, open_at, hi)
            if close is None:
                return None
            inner = subst(open_at + 1, close)
            if inner is None:
                return None
            out.append(text[pos:start] + load(inner))
            pos = close + 1
        out.append(text[pos:hi])
        return "".join(out)

    rest = subst(fill_end, body_end)
    if rest is None:
        return None
    return text[:decl.start()] + text[decl.end():fill_at] + rest + text[body_end:]
