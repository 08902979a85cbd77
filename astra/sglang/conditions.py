"""Conditions in Python source: the chain of tests that hold where a statement runs, their negation
written the way a person would, and the numeric tests on dimension names in them (constraints).
Used for the runtime's call sites (`srt_gates`) and for the guards inside kernel helpers."""

from __future__ import annotations

import ast
import copy
import re
from dataclasses import dataclass

_DIM = re.compile(r"head|dim$|^d$|hidden|expert|topk|top_k|rotary|rope|heads|rank$|page_size|block_size"
                  r"|group_size|tp_size|world_size|intermediate|vocab", re.I)
_OPS = {ast.Eq: "==", ast.NotEq: "!=", ast.Lt: "<", ast.LtE: "<=", ast.Gt: ">", ast.GtE: ">=",
        ast.In: "in", ast.NotIn: "not in"}
_NOT = {"==": "!=", "!=": "==", "<": ">=", ">=": "<", ">": "<=", "<=": ">", "in": "not in", "not in": "in",
        "multiple_of": "not multiple_of", "not multiple_of": "multiple_of"}
_MIRROR = {"<": ">", ">": "<", "<=": ">=", ">=": "<=", "==": "==", "!=": "!="}


@dataclass
class Constraint:
    """A numeric test on a dimension name that holds at a site: `head_size in [64, 128, 256]`."""

    name: str  # head_size, head_dim, rotary_dim, hidden_size, num_experts, topk, ...
    op: str  # "in" | "not in" | "==" | "!=" | "<" | "<=" | ">" | ">=" | "multiple_of" | "not multiple_of"
    values: list
    condition: str  # the condition it was read from
    certain: bool  # False when it is one side of an `or` (one way, not the only way, to reach the site)


_INVERSE = {ast.In: ast.NotIn, ast.NotIn: ast.In, ast.Eq: ast.NotEq, ast.NotEq: ast.Eq, ast.Is: ast.IsNot,
            ast.IsNot: ast.Is, ast.Lt: ast.GtE, ast.GtE: ast.Lt, ast.Gt: ast.LtE, ast.LtE: ast.Gt}


def negate_node(test: ast.expr) -> ast.expr:
    """`not test`, written the way a person would (`x not in S` rather than `not (x in S)`)."""
    if isinstance(test, ast.UnaryOp) and isinstance(test.op, ast.Not):
        return test.operand
    if isinstance(test, ast.Compare) and len(test.ops) == 1 and type(test.ops[0]) in _INVERSE:
        return ast.Compare(test.left, [_INVERSE[type(test.ops[0])]()], test.comparators)
    return ast.UnaryOp(ast.Not(), test)


def negate(test: ast.expr) -> str:
    return ast.unparse(negate_node(test))


def _conjuncts(test: ast.expr) -> list[ast.expr]:
    if isinstance(test, ast.BoolOp) and isinstance(test.op, ast.And):
        return [c for v in test.values for c in _conjuncts(v)]
    if isinstance(test, ast.UnaryOp) and isinstance(test.op, ast.Not) and isinstance(test.operand, ast.BoolOp) \
            and isinstance(test.operand.op, ast.Or):
        return [c for v in test.operand.values for c in _conjuncts(negate_node(v))]
    return [test]


def _exits(stmt: ast.stmt) -> bool:
    return isinstance(stmt, ast.If) and not stmt.orelse and bool(stmt.body) and isinstance(
        stmt.body[-1], (ast.Return, ast.Raise, ast.Continue, ast.Break))


def chain(node: ast.AST, parents: dict) -> list[ast.expr]:
    """The conditions that hold where `node` runs, up to its function: outermost first, each `if`'s
    conjuncts in source order (`if`/`elif`/`else`, ternaries, `and`/`or`, `while`, earlier
    `if ...: return|raise` guards and asserts in the same blocks)."""
    levels: list[list[ast.expr]] = []
    child, parent = node, parents.get(node)
    while parent is not None:
        level: list[ast.expr] = []
        if isinstance(parent, (ast.If, ast.While, ast.IfExp)) and child is not parent.test:
            body = any(s is child for s in parent.body) if isinstance(parent.body, list) else child is parent.body
            level += _conjuncts(parent.test if body else negate_node(parent.test))
        elif isinstance(parent, ast.BoolOp):
            before = parent.values[:next(i for i, v in enumerate(parent.values) if v is child)]
            level += [c for v in before for c in (_conjuncts(v) if isinstance(parent.op, ast.And)
                                                   else _conjuncts(negate_node(v)))]
        for block in (getattr(parent, f, None) for f in ("body", "orelse", "finalbody")):
            if isinstance(block, list) and any(s is child for s in block):
                for stmt in block[:next(i for i, s in enumerate(block) if s is child)]:
                    if _exits(stmt):
                        level += _conjuncts(negate_node(stmt.test))
                    elif isinstance(stmt, ast.Assert):
                        level += _conjuncts(stmt.test)
        levels.append(level)
        if isinstance(parent, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda, ast.ClassDef)):
            break
        child, parent = parent, parents.get(parent)
    return [c for level in reversed(levels) for c in level]


def _numbers(node: ast.expr, consts: dict[str, list]) -> list | None:
    if isinstance(node, ast.Constant) and isinstance(node.value, (int, float)) and not isinstance(node.value, bool):
        return [node.value]
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub):
        inner = _numbers(node.operand, consts)
        return [-v for v in inner] if inner and len(inner) == 1 else None
    if isinstance(node, (ast.Tuple, ast.List, ast.Set)):
        values = [_numbers(e, consts) for e in node.elts]
        return sorted(v[0] for v in values if v) if values and all(v and len(v) == 1 for v in values) else None
    if isinstance(node, ast.Call) and getattr(node.func, "id", "") in ("frozenset", "set", "tuple", "list") \
            and len(node.args) == 1:
        return _numbers(node.args[0], consts)
    if isinstance(node, ast.Name):
        return consts.get(node.id)
    return None


def _dim_name(node: ast.expr) -> str | None:
    name = node.id if isinstance(node, ast.Name) else node.attr if isinstance(node, ast.Attribute) else None
    return name if name and _DIM.search(name) and name != "ndim" else None


def constraints(cond: ast.expr, consts: dict[str, list] | None = None, text: str | None = None) -> list[Constraint]:
    """Numeric tests on dimension names in a condition that holds (`not`, `and`, `or` followed)."""
    consts, text, out = consts or {}, text or ast.unparse(cond), []

    def visit(node: ast.expr, certain: bool, negated: bool) -> None:
        if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.Not):
            visit(node.operand, certain, not negated)
        elif isinstance(node, ast.BoolOp):
            both = isinstance(node.op, ast.And) != negated  # `a and b` holds, or `not (a or b)`
            for value in node.values:
                visit(value, certain and both, negated)
        elif isinstance(node, ast.Compare):
            left = node.left
            for op, right in zip(node.ops, node.comparators):
                found = _compare(left, _OPS.get(type(op)), right, consts)
                if found:
                    name, sym, values = found
                    out.append(Constraint(name, _NOT[sym] if negated else sym, values, text, certain))
                left = right

    visit(cond, True, False)
    return out


def _compare(left: ast.expr, op: str | None, right: ast.expr, consts: dict) -> tuple[str, str, list] | None:
    if op is None:
        return None
    if isinstance(left, ast.BinOp) and isinstance(left.op, ast.Mod) and _dim_name(left.left) \
            and _numbers(right, consts) == [0] and op in ("==", "!=") and _numbers(left.right, consts):
        return _dim_name(left.left), "multiple_of" if op == "==" else "not multiple_of", _numbers(left.right, consts)
    if _dim_name(left) and _numbers(right, consts) is not None:
        return _dim_name(left), op, _numbers(right, consts)
    if _dim_name(right) and op in _MIRROR and _numbers(left, consts) is not None:
        return _dim_name(right), _MIRROR[op], _numbers(left, consts)
    return None


def module_constants(module: ast.Module) -> dict[str, list]:
    out: dict[str, list] = {}
    for node in module.body:
        if isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name):
            values = _numbers(node.value, out)
            if values is not None:
                out[node.targets[0].id] = values
    return out


def requirements(fn: ast.FunctionDef | ast.AsyncFunctionDef, args: list[str]) -> list[tuple[ast.expr, ast.expr]]:
    """What must hold for a predicate function (`can_use_x(head_dim, dtype)`) to return true: its early
    `if C: return False` / `raise` guards negated, and a final boolean `return`. Each as written in the
    function, and in the caller's terms (its parameters replaced by the caller's argument texts)."""
    out: list[ast.expr] = []
    for stmt in fn.body:
        if isinstance(stmt, ast.If) and not stmt.orelse and stmt.body and (isinstance(stmt.body[-1], ast.Raise) or (
                isinstance(stmt.body[-1], ast.Return) and isinstance(stmt.body[-1].value, ast.Constant)
                and not stmt.body[-1].value.value)):
            out += _conjuncts(negate_node(stmt.test))
    last = fn.body[-1] if fn.body else None
    if isinstance(last, ast.Return) and isinstance(last.value, (ast.Compare, ast.BoolOp, ast.UnaryOp)):
        out += _conjuncts(last.value)
    params = [a.arg for a in fn.args.posonlyargs + fn.args.args]
    mapping = {}
    for param, arg in zip(params, args):
        try:
            mapping[param] = ast.parse(arg, mode="eval").body
        except SyntaxError:
            continue

    class Sub(ast.NodeTransformer):
        def visit_Name(self, node):
            return mapping.get(node.id, node)

    return [(cond, Sub().visit(copy.deepcopy(cond))) for cond in out]
