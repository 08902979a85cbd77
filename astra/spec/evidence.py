"""The Python side's evidence for a draft, in the C++ entry's names: what the wrapper passes for each
argument of one export (astra.sglang.wrapper_facts) and the runtime's gates on dims
(astra.sglang.srt_gates).

The export call `module.run(out, x, eps)` lines the wrapper's names up with the entry's parameters
by position, so `x.shape[-1]` passed for `hidden` becomes "the last dim of the entry's `x`", an
output allocated `torch.empty_like(x)` gets `x`'s shape, `make_cpp_args(x.dtype)` says which tensor
carries the spec's dtype, and a docstring's "Supported dtypes" gives the dtypes to test.
"""

from __future__ import annotations

import ast
import re
from dataclasses import dataclass, field

from astra.errors import AstraError
from astra.spec.expr import DTYPE_BYTES


def _literal(text: str | None):
    if text is None:
        return None
    try:
        value = ast.literal_eval(text)
    except (ValueError, SyntaxError, TypeError, MemoryError, RecursionError):
        return None
    return value if isinstance(value, (bool, int, float, str)) else None


@dataclass
class WrapperEvidence:
    params: list[str]  # the C++ entry's parameters, in order
    args: list = field(default_factory=list)  # wrapper_scan.Value per export argument
    loader_args: dict = field(default_factory=dict)
    function: object = None  # wrapper_facts.FunctionFacts holding the call
    allocations: list = field(default_factory=list)
    where: str = ""

    def cpp_name(self, wrapper_name: str | None) -> str | None:
        """The entry parameter that the wrapper's `wrapper_name` is passed as."""
        if wrapper_name is None:
            return None
        for i, value in enumerate(self.args[: len(self.params)]):
            if wrapper_name in (value.param, value.expr):
                return self.params[i]
        return None

    def scalar(self, index: int, shapes: dict[str, list[str]]) -> object | None:
        """What the wrapper passes at position `index`: a dim expression (`x.shape[-1]`), a literal,
        or its parameter's default; None when unknown."""
        if index >= len(self.args):
            return None
        value = self.args[index]
        source = self.cpp_name(value.tensor)
        if value.attr in ("size", "shape") and value.dim is not None and source in shapes:
            shape = shapes[source]
            try:
                return shape[value.dim]
            except IndexError:
                return None
        for text in (value.expr, value.default):
            literal = _literal(text)
            if literal is not None:
                return literal
        return None

    def like(self, cpp_param: str) -> str | None:
        """The entry tensor whose shape the wrapper's allocation for `cpp_param` copies."""
        index = self.params.index(cpp_param) if cpp_param in self.params else None
        if index is None or index >= len(self.args):
            return None
        value = self.args[index]
        for alloc in self.allocations:
            if value.allocated and alloc.name in (value.param, value.expr) or alloc.call == value.expr:
                return self.cpp_name(alloc.like)
        match = re.match(r"torch\.(empty|zeros|ones)_like\((\w+)", value.expr or "")
        return self.cpp_name(match.group(2)) if match else None

    def dtype_tensor(self) -> str | None:
        """The entry tensor whose dtype feeds `make_cpp_args` (`x.dtype`)."""
        for value in self.loader_args.values():
            if value.attr == "dtype" and value.tensor:
                return self.cpp_name(value.tensor)
        return None

    def dtypes(self) -> list[str]:
        names = getattr(self.function, "dtypes", None) or []
        return [d for d in names if d in DTYPE_BYTES]

    def mutated(self) -> set[str]:
        names = getattr(self.function, "mutates_args", None) or []
        return {c for c in (self.cpp_name(n) for n in names) if c}


def wrapper_evidence(tree, site, export: str, params: list[str]) -> WrapperEvidence | None:
    """The wrapper's call of `export`, if the wrapper file has one."""
    from astra.sglang import wrapper_facts

    try:
        facts = wrapper_facts.facts(tree, site)
    except (AstraError, OSError, SyntaxError, ValueError) as err:  # a wrapper we cannot read: no evidence
        return WrapperEvidence(params, where=f"wrapper not read: {err}")
    for function in facts.functions:
        for call in function.calls:
            if call.export == export:
                return WrapperEvidence(params, list(call.args), dict(call.loader_args), function,
                                       list(function.allocations), f"{call.file}:{call.line}")
    return None


def runtime_constraints(tree, module) -> tuple[list[dict], str]:
    """(certain dim constraints from the runtime's gates, one-line reach verdict)."""
    from astra.sglang import srt_gates

    try:
        reach = srt_gates.reach(tree, module)
    except (AstraError, OSError, SyntaxError, ValueError) as err:
        return [], f"runtime call sites not read: {err}"
    found = [{"name": c.name, "op": c.op, "values": list(c.values)} for c in reach.constraints
             if getattr(c, "certain", True)]
    return found, reach.verdict


def satisfies(value: int, constraint: dict) -> bool:
    op, values = constraint["op"], constraint["values"]
    if not values:
        return True
    first = values[0]
    checks = {
        "in": lambda: value in values, "not in": lambda: value not in values,
        "==": lambda: value == first, "!=": lambda: value != first, "<": lambda: value < first,
        "<=": lambda: value <= first, ">": lambda: value > first, ">=": lambda: value >= first,
        "multiple_of": lambda: first and value % first == 0,
        "not multiple_of": lambda: not first or value % first != 0,
    }
    check = checks.get(op)
    return bool(check()) if check else True
