"""A small, safe expression language for specs: shapes, byte formulas, template arguments.

Parsed with `ast` and evaluated by walking the tree: no builtins, no attribute access, no
subscripts, only the names and functions given. Errors name the expression and what went wrong.
"""

from __future__ import annotations

import ast
import math
import operator
import re
from functools import lru_cache

from astra.errors import AstraError
from astra.input_files import depth

DTYPE_BYTES = {
    "float64": 8, "float32": 4, "float16": 2, "bfloat16": 2, "float8_e4m3fn": 1, "float8_e5m2": 1,
    "int64": 8, "int32": 4, "int16": 2, "int8": 1, "uint8": 1, "bool": 1,
}
CPP_DTYPES = {
    "float64": "double", "float32": "fp32_t", "float16": "fp16_t", "bfloat16": "bf16_t",
    "float8_e4m3fn": "fp8_e4m3_t", "float8_e5m2": "fp8_e5m2_t", "int8": "int8_t", "int16": "int16_t",
    "int32": "int32_t", "int64": "int64_t", "uint8": "uint8_t", "bool": "bool",
}


class ExprError(AstraError, ValueError):
    """A spec expression that cannot be evaluated; a malformed spec when it escapes (exit 5)."""

    exit_code = 5


MAX_INT = 2**64  # magnitude bound of every integer result (checked before computing where it matters)
MAX_STR = 4096  # length bound of every string result
MAX_ITEMS = 4096  # length bound of every tuple result
MAX_EXPR = 4000  # characters of one expression
MAX_DEPTH = 100  # levels of nesting of one expression (a chain `a + b - c ...` is one level, however long)


def _elt(dtype: str) -> int:
    if dtype not in DTYPE_BYTES:
        raise ExprError(f"unknown dtype {dtype!r}; known: {', '.join(DTYPE_BYTES)}")
    return DTYPE_BYTES[dtype]


def _log2(value):
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ExprError(f"log2 needs a number, not {type(value).__name__}")
    if value <= 0:
        raise ExprError(f"log2({value}) is undefined (it needs a positive number)")
    return int(math.log2(value))


def _div_args(a, b, fn: str) -> None:
    for v in (a, b):
        if isinstance(v, bool) or not isinstance(v, (int, float)):
            raise ExprError(f"{fn} needs numbers, not {type(v).__name__}")
    if b == 0:
        raise ExprError(f"{fn}: division by zero (the divisor is 0)")


def _ceil_div(a, b):
    _div_args(a, b, "ceil_div")
    return -(-a // b)


def _round_up(a, b):
    _div_args(a, b, "round_up")
    return -(-a // b) * b


def _cpp_dtype(dtype: str) -> str:
    if dtype not in CPP_DTYPES:
        raise ExprError(f"no C++ type for dtype {dtype!r}; known: {', '.join(CPP_DTYPES)}")
    return CPP_DTYPES[dtype]


FUNCTIONS = {
    "min": min, "max": max, "abs": abs,
    "ceil_div": _ceil_div,
    "round_up": _round_up,
    "log2": _log2,
    "elt": _elt, "cpp_dtype": _cpp_dtype,
    "cpp_bool": lambda v: "true" if v else "false",
}
_BINOPS = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul, ast.Div: operator.truediv,
           ast.FloorDiv: operator.floordiv, ast.Mod: operator.mod, ast.Pow: operator.pow,
           ast.BitAnd: operator.and_, ast.BitOr: operator.or_, ast.BitXor: operator.xor,
           ast.LShift: operator.lshift, ast.RShift: operator.rshift}
_BITOPS = (ast.BitAnd, ast.BitOr, ast.BitXor, ast.LShift, ast.RShift)
MAX_SHIFT = 63  # shift amounts are 0..63: a left shift stays O(1) work and within 2**64 from small operands
_CMPOPS = {ast.Eq: operator.eq, ast.NotEq: operator.ne, ast.Lt: operator.lt, ast.LtE: operator.le,
           ast.Gt: operator.gt, ast.GtE: operator.ge, ast.In: lambda a, b: a in b,
           ast.NotIn: lambda a, b: a not in b}


def evaluate(expr, names: dict):
    """Value of `expr` (a string expression, or a number passed through) given `names`.

    Every failure is an ExprError naming the expression; results are bounded (integers to 2**64 in
    magnitude, strings and tuples to 4096 items, shift amounts to 0..63), checked before the work is done."""
    if isinstance(expr, (int, float, bool)):
        return _bounded(expr, repr(expr))
    if not isinstance(expr, str):
        raise ExprError(f"expected an expression string, got {type(expr).__name__}: {_short(expr)}")
    body, used = _parse(expr)
    key = _result_key(expr, used, names)
    if key in _RESULTS:
        return _RESULTS[key]
    try:
        value = _Eval(expr, names).visit(body)
    except ExprError as err:
        msg = str(err)
        raise ExprError(msg if msg.startswith(_short(expr)) else f"{_short(expr)}: {msg}") from None
    except (ArithmeticError, TypeError, ValueError, RecursionError, MemoryError) as err:
        raise ExprError(f"{_short(expr)}: {type(err).__name__}: {err}") from None
    if key is not None:
        if len(_RESULTS) >= MAX_RESULTS:
            _RESULTS.clear()
        _RESULTS[key] = value
    return value


@lru_cache(maxsize=4096)
def _parse(expr: str) -> tuple[ast.expr, tuple[str, ...]]:
    """The syntax tree of an expression and the names it uses, parsed and bounded once (a spec evaluates the
    same expressions for every case)."""
    if len(expr) > MAX_EXPR:
        raise ExprError(f"{_short(expr)}: an expression longer than {MAX_EXPR} characters")
    try:
        tree = ast.parse(expr.strip(), mode="eval")
    except SyntaxError as err:
        raise ExprError(f"{_short(expr)}: not a valid expression ({err.msg})") from None
    except (ValueError, RecursionError, MemoryError) as err:
        raise ExprError(f"{_short(expr)}: not a valid expression ({type(err).__name__}: {err})") from None
    if depth(tree.body, _parts, MAX_DEPTH) > MAX_DEPTH:
        raise ExprError(f"{_short(expr)}: nested more than {MAX_DEPTH} levels deep (parentheses, calls, "
                        "conditionals inside each other); write it flatter or split it into `derived` names")
    return tree.body, tuple(sorted({n.id for n in ast.walk(tree) if isinstance(n, ast.Name)}))


_RESULTS: dict = {}  # (expression, the values of the names it uses) -> its value: evaluation is pure
MAX_RESULTS = 65536
_UNSET = object()


def _result_key(expr: str, used: tuple[str, ...], names: dict):
    """The key of a result in _RESULTS (None: not kept, for values whose type a plain key would blur)."""
    values = tuple(names.get(n, _UNSET) for n in used)
    if not all(v is _UNSET or type(v) in (int, float, str, bool) for v in values):
        return None
    return expr, tuple((type(v).__name__, v) for v in values)


def _chain(node: ast.BinOp) -> tuple[ast.expr, list[ast.BinOp]]:
    """A left-leaning chain of binary operators (`a + b - c * d ...` parses as ((a + b) - ...)): its leftmost
    operand and its operators from the innermost out. The chain is walked, not recursed into, so a long
    flat expression costs no stack."""
    ops = []
    while isinstance(node, ast.BinOp) and type(node.op) in _BINOPS:
        ops.append(node)
        node = node.left
    return node, ops[::-1]


def _parts(node: ast.AST) -> list[ast.AST]:
    """A node's children for the nesting count: a chain's operands are one level below the chain."""
    if isinstance(node, ast.BinOp) and type(node.op) in _BINOPS:
        first, ops = _chain(node)
        return [first] + [op.right for op in ops]
    return list(ast.iter_child_nodes(node))


def _short(value, limit: int = 80) -> str:
    text = repr(value)
    return text if len(text) <= limit else text[:limit] + "...'"


def _bounded(value, what: str):
    """`value` if it is within the bounds, else an ExprError."""
    if isinstance(value, bool) or value is None:
        return value
    if isinstance(value, int):
        if abs(value) > MAX_INT:
            raise ExprError(f"{what}: integer result larger than 2**64")
    elif isinstance(value, float):
        if not math.isfinite(value):
            raise ExprError(f"{what}: the result is not a finite number ({value})")
    elif isinstance(value, str):
        if len(value) > MAX_STR:
            raise ExprError(f"{what}: a string result longer than {MAX_STR} characters")
    elif isinstance(value, tuple):
        if len(value) > MAX_ITEMS:
            raise ExprError(f"{what}: a list longer than {MAX_ITEMS} items")
    elif not isinstance(value, (int, float, str, tuple)):
        raise ExprError(f"{what}: a result of type {type(value).__name__} (numbers, strings and lists only)")
    return value


def _precheck(op, left, right) -> str | None:
    """Why `left op right` would be too large, judged before computing it (None: fine). Float powers
    are O(1) and overflow with an error; integer powers are checked by the bits of the result."""
    if isinstance(op, _BITOPS):
        return _bit_precheck(op, left, right)
    if isinstance(op, ast.Pow) and isinstance(left, int) and isinstance(right, int):
        if right > 0 and abs(left) > 1 and right * math.log2(abs(left)) > 64:
            return "power too large (the result would exceed 2**64)"
        if right < 0 and left == 0:
            return "division by zero (0 to a negative power)"
    if isinstance(op, ast.Mult):
        for seq, count in ((left, right), (right, left)):
            if isinstance(seq, (str, tuple)) and isinstance(count, int):
                if len(seq) * max(count, 0) > MAX_STR:
                    return f"repetition too long (more than {MAX_STR} items)"
    return None


def _bit_precheck(op, left, right) -> str | None:
    """Bitwise operators take integers (`& | ^` also booleans); shifts take an amount in 0..MAX_SHIFT."""
    shift = isinstance(op, (ast.LShift, ast.RShift))
    for value in (left, right):
        if not isinstance(value, int) or (shift and isinstance(value, bool)):
            return f"bitwise operators need integers, not {type(value).__name__} ({value!r})"
    if shift and not 0 <= right <= MAX_SHIFT:
        return f"shift amount {right} is outside 0..{MAX_SHIFT}"
    return None


class _Eval:
    def __init__(self, text: str, names: dict):
        self.text, self.names = text, names

    def fail(self, why: str):
        raise ExprError(f"{_short(self.text)}: {why}")

    def _binop(self, op: ast.operator, left, right):
        too_big = _precheck(op, left, right)
        if too_big:
            self.fail(too_big)
        try:
            return _BINOPS[type(op)](left, right)
        except ZeroDivisionError:
            self.fail("division by zero")
        except OverflowError:
            self.fail("numeric overflow (the result is too large)")
        except (TypeError, ValueError) as err:
            self.fail(str(err))

    def visit(self, node):
        return _bounded(self._visit(node), repr(self.text))

    def _visit(self, node):
        if isinstance(node, ast.Constant) and isinstance(node.value, (int, float, str, bool)):
            return node.value
        if isinstance(node, ast.Name):
            if node.id in self.names:
                return self.names[node.id]
            if node.id in ("True", "False"):
                return node.id == "True"
            self.fail(f"unknown name {node.id!r} (known: {', '.join(sorted(self.names)) or 'none'})")
        if isinstance(node, ast.BinOp) and type(node.op) in _BINOPS:
            first, ops = _chain(node)
            value = self.visit(first)
            for op_node in ops[:-1]:
                value = _bounded(self._binop(op_node.op, value, self.visit(op_node.right)), repr(self.text))
            return self._binop(node.op, value, self.visit(node.right))
        if isinstance(node, ast.UnaryOp):
            value = self.visit(node.operand)
            try:
                if isinstance(node.op, ast.USub):
                    return -value
                if isinstance(node.op, ast.Not):
                    return not value
                if isinstance(node.op, ast.UAdd):
                    return +value
                if isinstance(node.op, ast.Invert):
                    if isinstance(value, bool) or not isinstance(value, int):
                        self.fail(f"~ needs an integer, not {type(value).__name__} ({value!r})")
                    return ~value
            except TypeError as err:
                self.fail(str(err))
        if isinstance(node, ast.BoolOp):
            values = [self.visit(v) for v in node.values]
            return all(values) if isinstance(node.op, ast.And) else any(values)
        if isinstance(node, ast.Compare):
            left = self.visit(node.left)
            for op, right_node in zip(node.ops, node.comparators):
                right = self.visit(right_node)
                if type(op) not in _CMPOPS:
                    self.fail(f"unsupported comparison {type(op).__name__}")
                try:
                    holds = _CMPOPS[type(op)](left, right)
                except TypeError as err:
                    self.fail(f"cannot compare {type(left).__name__} with {type(right).__name__} ({err})")
                if not holds:
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
            if any(isinstance(a, ast.Starred) for a in node.args):
                self.fail("unsupported syntax Starred")
            args = [self.visit(a) for a in node.args]
            try:
                return fn(*args)
            except ExprError as err:
                self.fail(str(err))
            except (TypeError, ValueError, ArithmeticError) as err:
                self.fail(f"{node.func.id}(): {type(err).__name__}: {err}")
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
