"""Dim values that meet a draft's constraints.

`violated` lists the constraints a case breaks (free dims given, derived dims computed from them);
`satisfy` moves the dims it may move until every constraint holds or no rule applies: `d % k == 0`
rounds d up (through `d // m` and products), `a <= d` raises d (or lowers a), `d == e` sets d, and a
disjunction takes the first option a rule can meet (`d == 1 or d == 3`).
"""

from __future__ import annotations

import ast
import math

from astra.spec.expr import ExprError, evaluate


def _names(values: dict[str, int], derived: dict[str, str], dtype: str) -> dict:
    names = {**values, "dtype": dtype}
    for _ in range(4):  # derived dims defined from other derived dims, in any order
        for key, expr in derived.items():
            try:
                names[key] = evaluate(expr, names)
            except ExprError:  # a name not known yet: a later round has it
                continue
    return names


def violated(values: dict[str, int], derived: dict[str, str], constraints: list[str], dtype: str) -> list[str]:
    """The constraints that `values` (free dims) break; one that cannot be evaluated counts as broken."""
    names = _names(values, derived, dtype)
    out = []
    for c in constraints:
        try:
            if not evaluate(c, names):
                out.append(c)
        except ExprError:
            out.append(c)
    return out


def satisfy(values: dict[str, int], derived: dict[str, str], constraints: list[str], movable: set[str],
            dtype: str) -> dict[str, int]:
    """`values` moved, only the dims in `movable`, until every constraint holds or no rule applies:
    `d % k == 0` rounds d up, `a <= d` raises d (or lowers a), `d == e` and `d == 4 or d == 8` set d."""
    values = dict(values)
    for _ in range(12):
        broken = violated(values, derived, constraints, dtype)
        if not broken:
            break
        changed = False
        for c in broken:
            fix = _fix(ast.parse(c, mode="eval").body, values, derived, movable, dtype)
            if fix is not None and fix[1] >= 1 and values.get(fix[0]) != fix[1]:
                values[fix[0]] = fix[1]
                changed = True
        if not changed:
            break
    return values


def _value(node: ast.expr, values: dict, derived: dict, dtype: str):
    try:
        return evaluate(ast.unparse(node), _names(values, derived, dtype))
    except ExprError:
        return None


def _fix(node: ast.expr, values: dict, derived: dict, movable: set[str], dtype: str) -> tuple[str, int] | None:
    """(dim, new value) that makes the broken condition `node` hold, when a simple rule finds one."""
    if isinstance(node, ast.BoolOp) and isinstance(node.op, ast.Or):
        for option in node.values:
            fix = _fix(option, values, derived, movable, dtype)
            if fix is not None:
                return fix
        return None
    if not (isinstance(node, ast.Compare) and len(node.ops) == 1):
        return None
    op, left, right = node.ops[0], node.left, node.comparators[0]
    if isinstance(op, ast.Eq) and isinstance(left, ast.BinOp) and isinstance(left.op, ast.Mod) \
            and isinstance(right, ast.Constant) and right.value == 0:
        k = _value(left.right, values, derived, dtype)
        return _round_up(left.left, k, values, derived, movable, dtype) if isinstance(k, int) and k > 0 else None
    lv, rv = _value(left, values, derived, dtype), _value(right, values, derived, dtype)
    if not isinstance(lv, int) or not isinstance(rv, int):
        return None
    target = {ast.Eq: (rv, lv), ast.NotEq: (rv + 1, lv + 1), ast.LtE: (rv, lv), ast.Lt: (rv - 1, lv + 1),
              ast.GtE: (rv, lv), ast.Gt: (rv + 1, lv - 1)}.get(type(op))
    if target is None:
        return None
    # left takes target[0] or right takes target[1]; the larger side moves first when raising
    order = [(right, target[1]), (left, target[0])] if isinstance(op, (ast.LtE, ast.Lt)) else \
        [(left, target[0]), (right, target[1])]
    for side, want in order:
        found = _set(side, want, values, derived, movable, dtype)
        if found is not None:
            return found
    return None


def _set(side: ast.expr, want: int, values: dict, derived: dict, movable: set[str], dtype: str):
    """(dim, value) giving `side` the value `want`: `d`, `d * c`, `d // c`, a derived dim over one."""
    if isinstance(side, ast.Name):
        if side.id in movable:
            return side.id, want
        if side.id in derived:
            return _set(ast.parse(derived[side.id], mode="eval").body, want, values, derived, movable, dtype)
        return None
    if isinstance(side, ast.BinOp):
        c_right = _value(side.right, values, derived, dtype)
        if isinstance(side.op, ast.Mult) and isinstance(c_right, int) and c_right > 0 and want % c_right == 0:
            return _set(side.left, want // c_right, values, derived, movable, dtype)
        if isinstance(side.op, ast.FloorDiv) and isinstance(c_right, int) and c_right > 0:
            return _set(side.left, want * c_right, values, derived, movable, dtype)
        if isinstance(side.op, ast.Add) and isinstance(c_right, int):
            return _set(side.left, want - c_right, values, derived, movable, dtype)
        if isinstance(side.op, ast.Sub) and isinstance(c_right, int):
            return _set(side.left, want + c_right, values, derived, movable, dtype)
    return None


def _round_up(node: ast.expr, k: int, values: dict, derived: dict, movable: set[str], dtype: str):
    """(dim, value) making `node` a multiple of k: the dim itself, the dividend of `d // m`, or one
    factor of a product (the last movable one)."""
    if isinstance(node, ast.Name):
        if node.id in movable:
            v = values[node.id]
            return node.id, -(-v // k) * k
        if node.id in derived:
            return _round_up(ast.parse(derived[node.id], mode="eval").body, k, values, derived, movable, dtype)
        return None
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.FloorDiv):
        m = _value(node.right, values, derived, dtype)
        return _round_up(node.left, k * m, values, derived, movable, dtype) if isinstance(m, int) and m > 0 else None
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Mult):
        for factor, rest in ((node.right, node.left), (node.left, node.right)):
            r = _value(rest, values, derived, dtype)
            if isinstance(r, int) and r > 0:
                found = _round_up(factor, k // math.gcd(k, r), values, derived, movable, dtype)
                if found is not None:
                    return found
    return None
