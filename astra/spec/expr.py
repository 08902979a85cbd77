"""A small, safe expression language for specs: shapes, byte formulas, template arguments.

Parsed with `ast` and evaluated by walking the tree: no builtins, no attribute access, no
subscripts, only the names and functions given. Errors name the expression and what went wrong.
"""

from __future__ import annotations

import ast
import math
import operator
import re

DTYPE_BYTES = {
    "float64": 8, "float32": 4, "float16": 2, "bfloat16": 2, "float8_e4m3fn": 1, "float8_e5m2": 1,
    "int64": 8, "int32": 4, "int16": 2, "int8": 1, "uint8": 1, "bool": 1,
}
CPP_DTYPES = {
    "float64": "double", "float32": "fp32_t", "float16": "fp16_t", "bfloat16": "bf16_t",
    "float8_e4m3fn": "fp8_e4m3_t", "float8_e5m2": "fp8_e5m2_t", "int8": "int8_t", "int16": "int16_t",
    "int32": "int32_t", "int64": "int64_t", "uint8": "uint8_t", "bool": "bool",
}


class ExprError(ValueError):
    pass


def _elt(dtype: str) -> int:
    if dtype not in DTYPE_BYTES:
        raise ExprError(f"unknown dtype {dtype!r}; known: {', '.join(DTYPE_BYTES)}")
    return DTYPE_BYTES[dtype]


def _cpp_dtype(dtype: str) -> str:
    if dtype not in CPP_DTYPES:
        raise ExprError(f"no C++ type for dtype {dtype!r}; known: {', '.join(CPP_DTYPES)}")
    return CPP_DTYPES[dtype]


FUNCTIONS = {
    "min": min, "max": max, "abs": abs,
    "ceil_div": lambda a, b: -(-a // b),
    "round_up": lambda a, b: -(-a // b) * b,
    "log2": lambda a: int(math.log2(a)),
    "elt": _elt, "cpp_dtype": _cpp_dtype,
    "cpp_bool": lambda v: "true" if v else "false",
}
_BINOPS = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul, ast.Div: operator.truediv,
           ast.FloorDiv: operator.floordiv, ast.Mod: operator.mod, ast.Pow: operator.pow}
_CMPOPS = {ast.Eq: operator.eq, ast.NotEq: operator.ne, ast.Lt: operator.lt, ast.LtE: operator.le,
           ast.Gt: operator.gt, ast.GtE: operator.ge, ast.In: lambda a, b: a in b,
           ast.NotIn: lambda a, b: a not in b}


def evaluate(expr, names: dict):
    """Value of `expr` (a string expression, or a number passed through) given `names`."""
    if isinstance(expr, (int, float, bool)):
        return expr
    if not isinstance(expr, str):
        raise ExprError(f"expected an expression string, got {type(expr).__name__}: {expr!r}")
    try:
        tree = ast.parse(expr.strip(), mode="eval")
    except SyntaxError as err:
        raise ExprError(f"{expr!r}: not a valid expression ({err.msg})") from None
    return _Eval(expr, names).visit(tree.body)


class _Eval:
    def __init__(self, text: str, names: dict):
        self.text, self.names = text, names

    def fail(self, why: str):
        raise ExprError(f"{self.text!r}: {why}")

    def visit(self, node):
        if isinstance(node, ast.Constant) and isinstance(node.value, (int, float, str, bool)):
            return node.value
        if isinstance(node, ast.Name):
            if node.id in self.names:
                return self.names[node.id]
            if node.id in ("True", "False"):
                return node.id == "True"
            self.fail(f"unknown name {node.id!r} (known: {', '.join(sorted(self.names)) or 'none'})")
        if isinstance(node, ast.BinOp) and type(node.op) in _BINOPS:
            try:
                return _BINOPS[type(node.op)](self.visit(node.left), self.visit(node.right))
            except (ZeroDivisionError, TypeError) as err:
                self.fail(str(err))
        if isinstance(node, ast.UnaryOp):
            value = self.visit(node.operand)
            if isinstance(node.op, ast.USub):
                return -value
            if isinstance(node.op, ast.Not):
                return not value
            if isinstance(node.op, ast.UAdd):
                return value
        if isinstance(node, ast.BoolOp):
            values = [self.visit(v) for v in node.values]
            return all(values) if isinstance(node.op, ast.And) else any(values)
        if isinstance(node, ast.Compare):
            left = self.visit(node.left)
            for op, right_node in zip(node.ops, node.comparators):
                right = self.visit(right_node)
                if not _CMPOPS[type(op)](left, right):
                    return False
                left = right
            return True
        if isinstance(node, ast.IfExp):
            return self.visit(node.body) if self.visit(node.test) else self.visit(node.orelse)
        if isinstance(node, (ast.Tuple, ast.List)):
            return tuple(self.visit(e) for e in node.elts)
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and not node.keywords:
            fn = FUNCTIONS.get(node.func.id)
            if fn is None:
                self.fail(f"unknown function {node.func.id!r} (known: {', '.join(FUNCTIONS)})")
            return fn(*[self.visit(a) for a in node.args])
        self.fail(f"unsupported syntax {type(node).__name__}")


_HOLE = re.compile(r"\{([^{}]+)\}")


def render(template: str, names: dict) -> str:
    """Fill every `{expr}` hole of a template; booleans render as C++ `true`/`false`."""
    def fill(match):
        value = evaluate(match.group(1), names)
        if isinstance(value, bool):
            return "true" if value else "false"
        return str(value)
    return _HOLE.sub(fill, template)


def names_in(expr: str) -> set[str]:
    try:
        tree = ast.parse(str(expr).strip(), mode="eval")
    except SyntaxError:
        return set()
    return {n.id for n in ast.walk(tree) if isinstance(n, ast.Name)} - set(FUNCTIONS) - {"True", "False"}
