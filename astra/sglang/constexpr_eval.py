"""Evaluating C++ constant expressions read from kernel sources, in three-valued logic.

`evaluate("kVec == 2 || kVec == 4", {"kVec": 8}, facts)` is False; a name that is neither in `env`
nor a known `constexpr` definition makes the result None (unknown) unless the rest decides it
(`false && x` is False). Enumerators compare by name (`kLayout == KVLayout::V4`), `sizeof` and
`std::is_same_v` know the usual kernel types. `facts` is what astra.sglang.source_facts reads: any
object with `constants` ({name: expression}) and `enums` ({name: an object with `values`}).
"""

from __future__ import annotations

import ast
import re
from functools import lru_cache
from typing import Protocol

from astra.cxx.brackets import closing, levels, split_top

TYPE_SIZES = {"bf16_t": 2, "fp16_t": 2, "half": 2, "__half": 2, "__nv_bfloat16": 2, "fp32_t": 4, "float": 4,
              "double": 8, "fp8_e4m3_t": 1, "fp8_e5m2_t": 1, "int8_t": 1, "uint8_t": 1, "int16_t": 2,
              "uint16_t": 2, "int32_t": 4, "uint32_t": 4, "int": 4, "int64_t": 8, "uint64_t": 8, "bf16x2_t": 4,
              "fp16x2_t": 4, "int4": 16, "uint4": 16, "float4": 16, "float2": 8}
INT_SUFFIX = re.compile(r"\b(0[xX][0-9a-fA-F]+|\d+)(?:[uU][lL]{0,2}|[lL]{1,2}[uU]?)\b")
_MAX_DEPTH = 12  # constexpr definitions followed through at most this many names


class KnownNames(Protocol):
    constants: dict[str, str]
    enums: dict  # name -> an enum with `values` ({enumerator: int})


def evaluate(expr: str, env: dict, facts: KnownNames | None = None, _depth: int = 0):
    """The value of C++ constant expression `expr` (int, bool, or None when anything is unknown)."""
    text = _to_python(expr, env)
    if text is None:
        return None
    tree = _parse(text.strip())
    if tree is None:
        return None
    try:
        return _eval(tree.body, env, facts, _depth)
    except (TypeError, ValueError, OverflowError, RecursionError, MemoryError):
        return None  # e.g. arithmetic on an enumerator's name


@lru_cache(maxsize=4096)
def _parse(text: str) -> ast.Expression | None:
    try:
        return ast.parse(text, mode="eval")
    except SyntaxError:
        return None


def _to_python(expr: str, env: dict) -> str | None:
    """C++ condition text as Python expression text (None when it uses what Python cannot read)."""
    text = INT_SUFFIX.sub(r"\1", expr)
    if "[" in text or "->" in text or "\"" in text or "'" in text:
        return None

    def same(m: re.Match) -> str:
        a, b = (_type_name(env.get(x.strip(), x.strip())) for x in (m.group(1), m.group(2)))
        if a in TYPE_SIZES and b in TYPE_SIZES or a == b:
            return str(a == b)
        return "__unknown__"

    text = re.sub(r"std::is_same_v\s*<\s*([\w:]+)\s*,\s*([\w:]+)\s*>", same, text)

    def size(m: re.Match) -> str:
        name = _type_name(env.get(m.group(1).strip(), m.group(1).strip()))
        return str(TYPE_SIZES[name]) if name in TYPE_SIZES else "__unknown__"

    text = re.sub(r"\bsizeof\s*\(\s*([\w:]+)\s*\)", size, text)
    text = re.sub(r"\bstatic_cast\s*<[^<>]*>", "", text)
    text = re.sub(r"\b(?:std|host|device|math|sglang)::(\w+)", r"\1", text)
    # ns::Enum::Value as one name (compared by the enumerator's name below)
    text = re.sub(r"\b\w+(?:::\w+)+", lambda m: m.group(0).replace("::", "__"), text)
    if ":" in text.replace("?", "").replace(":", "", text.count("?")):
        return None  # a `:` that is not a ternary's
    text = _ternaries(text)
    if text is None:
        return None
    text = text.replace("&&", " and ").replace("||", " or ")
    text = re.sub(r"!(?!=)", " not ", text)
    return text.replace("true", "True").replace("false", "False")


def _ternaries(text: str) -> str | None:
    """`c ? a : b` as Python's `((a) if (c) else (b))`, inside parentheses first (C's precedence: the
    ternary binds loosest, so at one level it splits at the first `?` and its matching `:`)."""
    out, i = [], 0
    while i < len(text):
        if text[i] == "(":
            j = closing(text, i)
            inner = _ternaries(text[i + 1:j]) if j is not None else None
            if inner is None:
                return None
            out.append(f"({inner})")
            i = j + 1
            continue
        out.append(text[i])
        i += 1
    flat = "".join(out)
    if "?" not in flat:
        return flat
    ask, nested = -1, 0
    for k, depth, role in levels(flat):
        c = flat[k]
        if depth or role:
            continue
        if c == "?":
            if ask < 0:
                ask = k
            else:
                nested += 1
        elif c == ":" and ask >= 0:
            if nested:
                nested -= 1
                continue
            cond, yes, no = flat[:ask], _ternaries(flat[ask + 1:k]), _ternaries(flat[k + 1:])
            return None if yes is None or no is None else f"(({yes}) if ({cond}) else ({no}))"
    return None


def _type_name(value) -> str:
    return str(value).split("::")[-1] if isinstance(value, str) else ""


def _eval(node, env: dict, facts: KnownNames | None, depth: int):
    ev = lambda n: _eval(n, env, facts, depth)  # noqa: E731
    if isinstance(node, ast.Constant):
        return node.value if isinstance(node.value, (int, bool)) else None
    if isinstance(node, ast.Name):
        return _name(node.id, env, facts, depth)
    if isinstance(node, ast.BoolOp):
        values = [ev(v) for v in node.values]
        if isinstance(node.op, ast.And):
            return False if any(v is False or v == 0 for v in values if v is not None) else (
                None if None in values else True)
        return True if any(v for v in values if v is not None) else (None if None in values else False)
    if isinstance(node, ast.UnaryOp):
        v = ev(node.operand)
        if v is None:
            return None
        return (not v) if isinstance(node.op, ast.Not) else (-v if isinstance(node.op, ast.USub) else
                                                            (~v if isinstance(node.op, ast.Invert) else v))
    if isinstance(node, ast.IfExp):
        test = ev(node.test)
        return None if test is None or isinstance(test, str) else ev(node.body if test else node.orelse)
    if isinstance(node, ast.BinOp):
        return _binary(type(node.op), ev(node.left), ev(node.right))
    if isinstance(node, ast.Compare):
        return _compare(ev, ev(node.left), node.ops, node.comparators)
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and not node.keywords:
        args = [ev(a) for a in node.args]
        if None in args or any(isinstance(a, str) for a in args):
            return None
        fn = {"min": min, "max": max, "div_ceil": lambda a, b: -(-a // b) if b else None,
              "is_power_of_two": lambda a: a > 0 and a & (a - 1) == 0, "abs": abs}.get(node.func.id)
        try:
            return fn(*args) if fn else None
        except (TypeError, ValueError):
            return None
    return None


def _binary(op: type, a, b):
    if a is None or b is None or isinstance(a, str) or isinstance(b, str):
        return None
    if op in (ast.Div, ast.FloorDiv, ast.Mod) and b == 0:
        return None
    ops = {ast.Add: lambda: a + b, ast.Sub: lambda: a - b, ast.Mult: lambda: a * b,
           ast.Div: lambda: _cdiv(a, b), ast.Mod: lambda: a - b * _cdiv(a, b),
           ast.LShift: lambda: a << b if 0 <= b < 64 else None, ast.RShift: lambda: a >> b if b >= 0 else None,
           ast.BitAnd: lambda: a & b, ast.BitOr: lambda: a | b, ast.BitXor: lambda: a ^ b}
    return ops[op]() if op in ops else None


def _compare(ev, left, ops: list, comparators: list):
    """A chained comparison (`a < b <= c`), operands evaluated left to right by `ev`; None as soon as
    one is unknown, False at the first that fails."""
    for op, node in zip(ops, comparators):
        right = ev(node)
        if left is None or right is None:
            return None
        if isinstance(left, str) != isinstance(right, str) and not isinstance(op, (ast.Eq, ast.NotEq)):
            return None
        ok = {ast.Eq: lambda: left == right, ast.NotEq: lambda: left != right, ast.Lt: lambda: left < right,
              ast.LtE: lambda: left <= right, ast.Gt: lambda: left > right, ast.GtE: lambda: left >= right}
        if type(op) not in ok:
            return None
        if not ok[type(op)]():
            return False
        left = right
    return True


def _cdiv(a: int, b: int) -> int:
    """C's integer division (truncates toward zero)."""
    q = abs(a) // abs(b)
    return q if (a >= 0) == (b >= 0) else -q


def _name(ident: str, env: dict, facts: KnownNames | None, depth: int):
    if ident in ("True", "False"):
        return ident == "True"
    if ident in env:
        value = env[ident]
        return value if isinstance(value, (int, bool)) else _enum_value(str(value), facts)
    if "__" in ident and facts is not None:  # Enum__Value
        return _enum_value(ident.replace("__", "::"), facts)
    if facts is not None and depth < _MAX_DEPTH and facts.constants.get(ident):
        return evaluate(facts.constants[ident], env, facts, depth + 1)
    if facts is not None and any(ident in e.values for e in facts.enums.values()):
        return ident  # an enumerator by its bare name (`using enum`)
    return None


def _enum_value(text: str, facts: KnownNames | None):
    """An enumerator as its bare name (so `kLayout == KVLayout::V4` compares names)."""
    last = text.split("::")[-1]
    if facts is not None and any(last in e.values for e in facts.enums.values()):
        return last
    return None


# ---------------------------------------------------------------- the shape of a condition


def conjuncts(cond: str) -> list[str]:
    """The parts of `a && (b && c)` joined by a top-level `&&`, outer parentheses dropped, flattened."""
    parts = split_top(_unwrap(cond), "&&")
    return parts if len(parts) == 1 else [c for p in parts for c in conjuncts(p)]


def comparison(text: str) -> tuple[str, str, str] | None:
    """(left, operator, right) of a single top-level comparison (`a + b == c`); None otherwise. What is
    inside brackets, template arguments included (`is_same_v<A, B> == x`), is not at the top level
    (astra.cxx.brackets tells a template's `<` from a comparison)."""
    found, skip = [], 0
    for i, depth, role in levels(text):
        c, two = text[i], text[i:i + 2]
        if i < skip or depth or role:
            continue
        if two in ("<<", ">>", "&&", "||", "->"):
            skip = i + 2
        elif two in ("==", "!=", "<=", ">="):
            found.append((i, two))
            skip = i + 2
        elif c in "<>":
            found.append((i, c))
    if len(found) != 1:
        return None
    at, op = found[0]
    return _unwrap(text[:at]), op, _unwrap(text[at + len(op):])


def _unwrap(text: str) -> str:
    text = text.strip()
    while text.startswith("(") and closing(text, 0) == len(text) - 1:
        text = text[1:-1].strip()
    return text
