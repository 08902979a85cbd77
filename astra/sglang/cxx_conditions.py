"""C++ host-check conditions as Python expressions over a draft's names.

`to_python` turns one C++ condition into a Python expression (`&&` -> `and`, `/` -> `//`, `a ? b : c`
-> `(b if a else c)`, casts dropped) whose names a `CondEnv` supplies: SymbolicSize values
(`N.unwrap()`), tensor sizes (`x.size(1)`, `x.shape()[1]`, `x.numel()`, `x.ndim()`), template
parameters, constants, scalars and `sizeof(T)`. Anything it cannot name becomes `_unknown_`;
`conjuncts` splits the result at its top-level `and` and keeps the parts free of `_unknown_`.
A tensor of unknown shape has its sizes stand as placeholders (`shape_placeholder`).
"""

from __future__ import annotations

import ast
import re
from dataclasses import dataclass, field

from astra.cxx.brackets import closing
from astra.sglang.cxx_tokens import tokenize

UNKNOWN = "_unknown_"
_INT_TYPES = {"int", "int32_t", "int64_t", "uint32_t", "uint64_t", "size_t", "long", "unsigned", "int16_t",
              "uint16_t", "int8_t", "uint8_t", "bool", "float", "double", "auto", "ssize_t", "ptrdiff_t",
              "index_t", "uintptr_t", "intptr_t"}
_BYTES = {"float": 4, "double": 8, "fp32_t": 4, "fp16_t": 2, "bf16_t": 2, "half": 2, "__half": 2,
          "nv_bfloat16": 2, "__nv_bfloat16": 2, "fp8_e4m3_t": 1, "__nv_fp8_e4m3": 1, "fp8_e5m2_t": 1,
          "int8_t": 1, "uint8_t": 1, "int16_t": 2, "uint16_t": 2, "int": 4, "int32_t": 4, "uint32_t": 4,
          "int64_t": 8, "uint64_t": 8, "size_t": 8, "long": 8, "bool": 1, "int4": 16, "uint4": 16, "float4": 16,
          "float2": 8, "int2": 8, "uint2": 8}
_BINARY = [("||",), ("&&",), ("|",), ("^",), ("&",), ("==", "!="), ("<", "<=", ">", ">="), ("<<", ">>"),
           ("+", "-"), ("*", "/", "%")]
_PY_OP = {"||": "or", "&&": "and", "/": "//"}


@dataclass
class CondEnv:
    """What names mean when a condition is read (each value a Python expression over spec names)."""

    sizes: dict[str, str] = field(default_factory=dict)  # SymbolicSize var -> its value (`N.unwrap()`)
    names: dict[str, str] = field(default_factory=dict)  # template params, scalars -> value
    cxx: dict[str, str] = field(default_factory=dict)  # names defined by C++ text (constants, locals)
    shapes: dict[str, list[str]] = field(default_factory=dict)  # tensor -> its dims
    unshaped: set[str] = field(default_factory=set)  # tensors whose dims are unknown: sizes as placeholders
    types: dict[str, str] = field(default_factory=dict)  # C++ type (template param) -> bytes expression
    present: dict[str, bool] = field(default_factory=dict)  # optional tensor -> passed in the draft


def shape_placeholder(tensor: str, what: str) -> str:
    """The name standing for `what` (an index, `numel`, `ndim`) of a tensor of unknown shape."""
    return f"_t_{tensor}__{what}"


def to_python(cond: str, env: CondEnv, depth: int = 0) -> str:
    """The C++ condition `cond` as a Python expression over `env`'s names (see the module docstring)."""
    parser = _Parser(tokenize(cond), env, depth)
    try:
        out = parser.expr()
    except (IndexError, _Unreadable):
        return UNKNOWN
    return out if parser.i >= len(parser.toks) else UNKNOWN


def conjuncts(expr: str) -> list[str]:
    """The top-level `and` parts of a Python expression that name nothing unknown, unparsed."""
    try:
        tree = ast.parse(expr, mode="eval").body
    except SyntaxError:
        return []
    parts: list[ast.expr] = []

    def flatten(node: ast.expr) -> None:
        if isinstance(node, ast.BoolOp) and isinstance(node.op, ast.And):
            for v in node.values:
                flatten(v)
        else:
            parts.append(node)

    flatten(tree)
    out = []
    for p in parts:
        if any(isinstance(n, ast.Name) and n.id == UNKNOWN for n in ast.walk(p)):
            continue
        out.append(ast.unparse(p))
    return out


class _Unreadable(Exception):
    pass


class _Parser:
    """Precedence climbing over C++ tokens, writing a fully parenthesized Python expression."""

    def __init__(self, toks: list[str], env: CondEnv, depth: int):
        self.toks, self.env, self.depth, self.i = toks, env, depth, 0

    def peek(self, k: int = 0) -> str:
        return self.toks[self.i + k] if self.i + k < len(self.toks) else ""

    def take(self, expected: str | None = None) -> str:
        tok = self.toks[self.i]
        if expected is not None and tok != expected:
            raise _Unreadable(f"expected {expected!r}, got {tok!r}")
        self.i += 1
        return tok

    def expr(self) -> str:
        cond = self.binary(0)
        if self.peek() == "?":
            self.take()
            yes = self.expr()
            self.take(":")
            no = self.expr()
            return f"({yes} if {cond} else {no})"
        return cond

    def binary(self, level: int) -> str:
        if level == len(_BINARY):
            return self.unary()
        left = self.binary(level + 1)
        while self.peek() in _BINARY[level]:
            op = self.take()
            right = self.binary(level + 1)
            left = f"({left} {_PY_OP.get(op, op)} {right})"
        return left

    def unary(self) -> str:
        tok = self.peek()
        if tok == "!":
            self.take()
            return f"(not {self.unary()})"
        if tok in ("-", "~", "+"):
            self.take()
            return f"({tok}{self.unary()})"
        if tok == "(" and self._is_cast():
            self.i = self._close(self.i) + 1
            return self.unary()
        return self.postfix(self.primary())

    def _close(self, at: int) -> int:
        """The index of the bracket closing the one at `at`; the last token when none does."""
        return closing(self.toks, at) or len(self.toks) - 1

    def _is_cast(self) -> bool:
        close = self._close(self.i)
        inner = [t for t in self.toks[self.i + 1:close] if t not in ("const", "unsigned", "signed", "long", "::",
                                                                      "std", "*")]
        return close > self.i + 1 and len(inner) <= 1 and (not inner or inner[0] in _INT_TYPES) \
            and self.toks[close + 1:close + 2] not in ([")"], [""], [], ["?"], [":"])

    def primary(self) -> str:
        tok = self.take()
        if tok == "(":
            inner = self.expr()
            self.take(")")
            return f"({inner})"
        if re.fullmatch(r"0[xX][0-9a-fA-F]+[uUlLzZ]*", tok):
            return str(int(tok.rstrip("uUlLzZ"), 16))
        if re.fullmatch(r"\d+[uUlLzZ]*", tok):
            return tok.rstrip("uUlLzZ")
        if re.fullmatch(r"\d[\w.+-]*", tok):
            return tok.rstrip("fF")
        if tok in ("true", "false"):
            return "True" if tok == "true" else "False"
        if tok.startswith(('"', "'")):
            raise _Unreadable("string")
        if not re.fullmatch(r"[A-Za-z_]\w*", tok):
            raise _Unreadable(tok)
        if tok in ("static_cast", "reinterpret_cast", "int64_t", "int32_t", "uint32_t", "uint64_t", "int",
                   "size_t", "bool", "long"):
            if self.peek() == "<":
                while self.take() != ">":
                    pass
            if self.peek() != "(":
                raise _Unreadable(tok)
            self.take("(")
            inner = self.expr()
            self.take(")")
            return f"({inner})"
        if tok == "sizeof":
            self.take("(")
            close = self._close(self.i - 1)
            name = [t for t in self.toks[self.i:close] if t not in ("const", "::")]
            self.i = close + 1
            return self._sizeof(name[-1] if name else "")
        names = [tok]
        while self.peek() == "::":
            self.take()
            names.append(self.take())
            if self.peek() == "<":  # `C::template f<...>`: not a value we can read
                raise _Unreadable("template")
        name = names[-1]
        if self.peek() == "(":
            return self.call(names)
        if self.peek() in (".", "->"):
            return self.member(name)
        return self.name(name)

    def _sizeof(self, name: str) -> str:
        if name in self.env.types:
            return self.env.types[name]
        if name in _BYTES:
            return str(_BYTES[name])
        return UNKNOWN

    def call(self, names: list[str]) -> str:
        name = names[-1]
        self.take("(")
        args = []
        while self.peek() != ")":
            args.append(self.expr())
            if self.peek() == ",":
                self.take()
        self.take(")")
        if name in ("min", "max") and args:
            return f"{name}({', '.join(args)})"
        if name in ("div_ceil", "ceil_div") and len(args) == 2:
            return f"ceil_div({args[0]}, {args[1]})"
        if name == "has_single_bit" and len(args) == 1:
            return f"(({args[0]}) > 0 and (({args[0]}) & (({args[0]}) - 1)) == 0)"
        if name == "dtype_bytes" and "dtype" in self.env.types:
            return self.env.types["dtype"]
        if name in _INT_TYPES and len(args) == 1:
            return f"({args[0]})"
        return UNKNOWN

    def member(self, name: str) -> str:
        """`x.size(i)`, `x.shape()[i]`, `x.numel()`, `x.ndim()`, `N.unwrap()`; `.value()` skipped."""
        chain = []
        while self.peek() in (".", "->"):
            self.take()
            method = self.take()
            args = []
            if self.peek() == "(":
                self.take()
                while self.peek() != ")":
                    args.append(self.expr())
                    if self.peek() == ",":
                        self.take()
                self.take(")")
            if method != "value":
                chain.append((method, args))
        index = None
        if self.peek() == "[" and chain and chain[-1][0] in ("shape", "sizes", "size") and not chain[-1][1]:
            self.take()
            index = self.expr()
            self.take("]")
        if len(chain) != 1:
            return UNKNOWN
        method, args = chain[0]
        if method == "has_value" and name in self.env.present:
            return str(self.env.present[name])
        if method == "unwrap" and name in self.env.sizes:
            return self.env.sizes[name]
        if name in self.env.unshaped and method in ("size", "shape", "numel", "ndim", "dim"):
            what = "numel" if method == "numel" else "ndim" if method in ("ndim", "dim") else (
                args[0] if args else index)
            if what is None or not re.fullmatch(r"-?\d+|numel|ndim", what.strip("()")):
                return UNKNOWN
            return shape_placeholder(name, what.strip("()").replace("-", "m"))
        shape = self.env.shapes.get(name)
        if shape is None:
            return UNKNOWN
        if method == "numel" and not args:
            return "(" + " * ".join(f"({d})" for d in shape) + ")" if shape else "1"
        if method in ("ndim", "dim") and not args:
            return str(len(shape))
        if method in ("size", "shape", "sizes"):
            pos = args[0] if args else index
            try:
                k = int(ast.literal_eval(pos)) if pos is not None else None
            except (ValueError, SyntaxError):
                return UNKNOWN
            if k is None or not -len(shape) <= k < len(shape):
                return UNKNOWN
            return f"({shape[k]})"
        return UNKNOWN

    def name(self, name: str) -> str:
        if name in self.env.names:
            return f"({self.env.names[name]})"
        if name in self.env.cxx and self.depth < 8:
            value = to_python(self.env.cxx[name], self.env, self.depth + 1)
            return f"({value})" if value != UNKNOWN else UNKNOWN
        return UNKNOWN

    def postfix(self, value: str) -> str:
        if self.peek() in ("[", "(", ".", "->"):
            raise _Unreadable("postfix")
        return value
