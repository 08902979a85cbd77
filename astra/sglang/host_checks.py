"""The host-side checks of a C++ entry: where they are and what they state, in C++.

SGLang's JIT entries refuse a call with `Failed at file:line: message` from a handful of spellings
(sgl_kernel/utils.h and tvm-ffi):

    RuntimeCheck(cond, "message", ...)            host::RuntimeCheck(...)
    CHECK_HOST(cond) << "message"                 TVM_FFI_ICHECK(cond) << ...   TVM_FFI_ICHECK_EQ(a, b) ...
    if (cond) Panic(...)                          switch (x) { case 64: ... default: Panic(...) }

`checks_in` finds them in a function's libclang tokens (a `switch` whose default panics becomes
`x == 64 || x == 128`, an `if` whose body panics becomes `!(cond)`; each check keeps the `if`
conditions it runs under as its guard), and `locals_in` reads the function's local definitions from
its AST (`const auto hidden = static_cast<uint32_t>(D.unwrap());`), so that a condition over locals
can be read in terms of the entry's sizes. Reading a condition as Python is
astra.sglang.cxx_conditions (its names are re-exported here).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from astra.cxx.brackets import closing, levels, split_top
from astra.sglang.cxx_conditions import UNKNOWN, CondEnv, conjuncts, shape_placeholder, to_python
from astra.sglang.cxx_tokens import joined, renamed, tokenize

__all__ = ["UNKNOWN", "CondEnv", "HostCheck", "checks_in", "conjuncts", "locals_in", "renamed",
           "shape_placeholder", "to_python", "tokenize"]

_CHECK_CALLS = ("RuntimeCheck", "CHECK_HOST", "TVM_FFI_ICHECK")
_CMP_CHECKS = {"TVM_FFI_ICHECK_EQ": "==", "TVM_FFI_ICHECK_NE": "!=", "TVM_FFI_ICHECK_LT": "<",
               "TVM_FFI_ICHECK_LE": "<=", "TVM_FFI_ICHECK_GT": ">", "TVM_FFI_ICHECK_GE": ">="}
_PANICS = ("Panic", "SGL_PANIC", "throw")


@dataclass
class HostCheck:
    cond: str  # the C++ condition, tensors and scalars in the entry's names
    message: str
    line: int
    function: str
    locals: dict[str, str] = field(default_factory=dict)  # local definitions of its function (C++ text)
    guard: str | None = None  # the C++ condition under which it runs (enclosing `if`s), None: always


def _message(spellings: list[str]) -> str:
    out = []
    for s in spellings:
        if s.startswith('"'):
            out.append(s[1:-1])
    return "".join(out).strip()


def checks_in(spellings: list[str], lines: list[int], function: str) -> list[HostCheck]:
    """Every host check in a function's token spellings (see the module docstring)."""
    found: list[HostCheck] = []
    n = len(spellings)
    last = n - 1  # a bracket that does not close runs to the last token
    guards = _guards(spellings)
    for i, s in enumerate(spellings):
        before = len(found)
        nxt = spellings[i + 1] if i + 1 < n else ""
        if nxt != "(" or (i and spellings[i - 1] in ("struct", "define", ".", "->")):
            continue
        if s in _CHECK_CALLS or s in _CMP_CHECKS:
            close = closing(spellings, i + 1) or last
            inner = spellings[i + 2:close]
            if s in _CMP_CHECKS:
                parts = split_top(inner)
                if len(parts) != 2:
                    continue
                cond = f"( {joined(parts[0])} ) {_CMP_CHECKS[s]} ( {joined(parts[1])} )"
                message = _message(_stream(spellings, close + 1))
            elif s == "RuntimeCheck":
                parts = split_top(inner)
                if parts and parts[0] and parts[0][0] in ("location", "DebugInfo"):
                    parts = parts[1:]
                if not parts or not parts[0]:
                    continue
                cond, message = joined(parts[0]), _message([t for p in parts[1:] for t in p])
            else:
                cond, message = joined(inner), _message(_stream(spellings, close + 1))
            found.append(HostCheck(cond, message, lines[i], function))
        elif s == "switch":
            found += _switch_check(spellings, lines, i, function)
        elif s == "if":
            close = closing(spellings, i + 1) or last
            body = spellings[close + 1:close + 4]
            body = body[1:] if body[:1] == ["{"] else body
            if body[:1] == ["host"] and body[1:2] == ["::"]:
                body = body[2:]
            if body[:1] and body[0] in _PANICS:
                after = spellings[close + 1:(closing(spellings, close + 1) or last) + 1] if body[0] != "throw" else []
                found.append(HostCheck(f"! ( {joined(spellings[i + 2:close])} )", _message(after), lines[i], function))
        for check in found[before:]:
            check.guard = guards[i]
    return found


def _guards(spellings: list[str]) -> list[str | None]:
    """Per token, the conjunction of the `if` conditions it runs under: an `else` runs under the
    negation of its `if` and of every `if` before it in an `else if` chain."""
    out: list[str | None] = []
    stack: list[str | None] = []  # one entry per open `{`: the guard it adds
    chains: list[tuple[str | None, str] | None] = []  # per open `{`: (prefix, own) when an `if` body
    closed: dict[int, tuple[str | None, str]] = {}  # depth -> (prefix, own) of the `if` whose body just ended
    pending: tuple[str | None, tuple[str | None, str] | None] = (None, None)  # for the block about to open
    single: list[tuple[str, int, tuple | None]] = []  # brace-less statements: (guard, depth, chain)
    i, n = 0, len(spellings)
    while i < n:
        s = spellings[i]
        if s in ("if", "else") and _statement(spellings, i):
            prefix = None  # the negations an `else` adds
            if s == "else":
                prev = closed.get(len(stack))
                prefix = _conjoin(prev[0], f"! {prev[1]}") if prev else None
                if spellings[i + 1:i + 2] == ["if"]:
                    out.append(_join(stack, single))
                    i += 1
                    s = "if"
            chain = None
            if s == "if":
                j = i + 1 + (spellings[i + 1:i + 2] == ["constexpr"])
                close = closing(spellings, j) or n - 1
                chain = (prefix, f"( {joined(spellings[j + 1:close])} )")
                cond = _conjoin(*chain)
                out.extend([_join(stack, single)] * (close + 1 - i))
                i = close + 1
            else:
                cond = prefix
                out.append(_join(stack, single))
                i += 1
            if i < n and spellings[i] == "{":
                pending = (cond, chain)
            elif cond:
                single.append((cond, len(stack), chain))
            continue
        if s == "{":
            stack.append(pending[0])
            chains.append(pending[1])
            pending = (None, None)
        elif s == "}" and stack:
            stack.pop()
            chain = chains.pop()
            if chain:
                closed[len(stack)] = chain
            else:
                closed.pop(len(stack), None)
            single = [g for g in single if g[1] <= len(stack)]
        out.append(_join(stack, single))
        if s == ";":
            ended = [g for g in single if g[1] >= len(stack)]
            single = [g for g in single if g[1] < len(stack)]
            if spellings[i + 1:i + 2] == ["else"] and ended and ended[-1][2]:
                closed[len(stack)] = ended[-1][2]
            elif spellings[i + 1:i + 2] != ["else"]:
                closed.pop(len(stack), None)
        i += 1
    return out


def _statement(spellings: list[str], i: int) -> bool:
    """Whether the `if` or `else` at `i` is a C++ statement: not a preprocessor line's (`#if`, `#else`),
    and an `if` (or `else if`, `if constexpr`) followed by its parenthesized condition."""
    if i and spellings[i - 1] == "#":
        return False
    k = i
    if spellings[k] == "else":
        if spellings[k + 1:k + 2] != ["if"]:
            return True
        k += 1
    k += 1 + (spellings[k + 1:k + 2] == ["constexpr"])
    return spellings[k:k + 1] == ["("]


def _conjoin(a: str | None, b: str | None) -> str | None:
    return f"{a} && {b}" if a and b else a or b


def _join(stack: list[str | None], single: list[tuple]) -> str | None:
    parts = [g for g in stack if g] + [g[0] for g in single]
    return " && ".join(parts) if parts else None


def _stream(spellings: list[str], start: int) -> list[str]:
    """`<< "a" << x` after a macro check, up to the end of the statement."""
    out = []
    for s in spellings[start:]:
        if s in (";", "{", "}"):
            break
        out.append(s)
    return out if out[:1] == ["<<"] else []


def _switch_check(spellings: list[str], lines: list[int], i: int, function: str) -> list[HostCheck]:
    """`switch (x) { case A: ... default: Panic(...) }` -> `x == A || x == B`."""
    close = closing(spellings, i + 1) or len(spellings) - 1
    subject = spellings[i + 2:close]
    if close + 1 >= len(spellings) or spellings[close + 1] != "{":
        return []
    end = closing(spellings, close + 1) or len(spellings) - 1
    body = spellings[close + 2:end]
    values, default_panics = [], False
    for j, depth, role in levels(body):
        s = body[j]
        if depth or role:
            continue
        if s == "case":
            k = j + 1
            value = []
            while k < len(body) and body[k] != ":":
                value.append(body[k])
                k += 1
            values.append(joined(value))
        elif s == "default" and j + 1 < len(body) and body[j + 1] == ":":
            rest = [t for t in body[j + 2:j + 6] if t not in ("host", "::", "sglang", "{")]
            default_panics = bool(rest) and rest[0] in _PANICS
    if not values or not default_panics:
        return []
    subject_text = joined(subject)
    cond = " || ".join(f"( {subject_text} ) == ( {v} )" for v in values)
    return [HostCheck(cond, f"{subject_text} must be one of {', '.join(values)}", lines[i], function)]


def locals_in(cursor, rename: dict[str, str], code_tokens) -> dict[str, str]:
    """`name -> C++ initializer` of the local variables a function defines once (libclang AST);
    a name defined twice with different initializers is left out (it depends on the branch)."""
    out: dict[str, str] = {}
    twice: set[str] = set()
    for node in cursor.walk_preorder():
        if node.kind.name != "VAR_DECL" or not node.spelling:
            continue
        inits = [c for c in node.get_children() if c.kind.is_expression()]
        if not inits:
            continue
        text = joined(renamed(code_tokens(inits[-1]), rename)[0])
        if not text:
            continue
        if node.spelling in out and out[node.spelling] != text:
            twice.add(node.spelling)
        out.setdefault(node.spelling, text)
    return {k: v for k, v in out.items() if k not in twice}

