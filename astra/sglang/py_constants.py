"""Integer constants of a Python module, read with ast (never imported): the values SGLang's loaders give
`make_cpp_args` through module-level names."""

from __future__ import annotations

import ast

_INT_OPS = {ast.Add: lambda a, b: a + b, ast.Sub: lambda a, b: a - b, ast.Mult: lambda a, b: a * b,
            ast.FloorDiv: lambda a, b: a // b, ast.LShift: lambda a, b: a << b, ast.RShift: lambda a, b: a >> b,
            ast.Pow: lambda a, b: a ** b if 0 <= b <= 64 else None}


def int_constants(assigns: dict[str, list[tuple[int, ast.expr]]]) -> dict[str, str]:
    """Names assigned once (`assigns`: name -> [(line, value)]) to an integer expression of literals and
    other such names: `_WARPS = 8`, `TMA_STAGE_BYTES = 32 * 1024`, `_N = 1 << _SHIFT`."""

    def value(node: ast.expr, depth: int = 0) -> int | None:
        if depth > 8:
            return None
        if isinstance(node, ast.Constant) and type(node.value) is int:
            return node.value
        if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub):
            inner = value(node.operand, depth + 1)
            return None if inner is None else -inner
        if isinstance(node, ast.BinOp) and type(node.op) in _INT_OPS:
            left, right = value(node.left, depth + 1), value(node.right, depth + 1)
            if left is None or right is None or (isinstance(node.op, ast.FloorDiv) and right == 0):
                return None
            return _INT_OPS[type(node.op)](left, right)
        if isinstance(node, ast.Name) and len(assigns.get(node.id, [])) == 1:
            return value(assigns[node.id][0][1], depth + 1)
        return None

    out = {}
    for name, found_at in assigns.items():
        found = value(found_at[0][1]) if len(found_at) == 1 else None
        if found is not None and abs(found) < 2**63:
            out[name] = str(found)
    return out
