"""The arguments of a drafted spec, in call order: each tensor's shape, dtype, role (`in`, `out`,
`inout`, `scratch`) and fill, each scalar's value (the wrapper's, a dim it names, or a guess), the
dtypes the case sweep takes, what making the inputs needs of the dims (`index_constraints`) and the
spec's `bytes` expression.
"""

from __future__ import annotations

import re

from astra.spec import draft_traffic, meanings
from astra.spec.argument_kinds import INDEX_NAMES, LEN_NAMES, scalar_dtype, tensor_dtype, tensor_init
from astra.spec.draft_dims import ident

_EPS = re.compile(r"eps|epsilon", re.I)


def index_constraints(arguments: list[dict]) -> list[str]:
    """What making the inputs needs: a `perm` index draws numel distinct values below its high, a
    `randint` needs high above low."""
    out = []
    for a in arguments:
        if a["kind"] != "tensor" or a.get("present", True) is False:
            continue
        init = a.get("init") or {}
        high = init.get("high")
        if init.get("dist") == "perm" and high is not None:
            numel = " * ".join(f"({s})" for s in a["shape"]) or "1"
            out.append(f"{numel} <= {high}")
        elif init.get("dist") == "randint" and isinstance(high, str):
            out.append(f"{high} > {init.get('low', 0)}")
    return list(dict.fromkeys(out))


def main_dtypes(ev) -> list[str]:
    """The dtypes the case sweep takes: the wrapper's docstring list, else ints when the tensor that
    carries the dtype is an index or a length, else none (bf16 and fp16)."""
    if ev is None:
        return []
    if ev.dtypes():
        listed = ev.dtypes()
        return [d for d in listed if d in ("bfloat16", "float16", "float32")] or listed
    carrier = ev.dtype_tensor()
    if carrier and (INDEX_NAMES.search(carrier) or LEN_NAMES.search(carrier)):
        return ["int64", "int32"]
    return []


def build_arguments(facts, binding, shapes, token_dim, ev, notes, int_main: bool = False, guessed: set | None = None,
                    promoted: dict[str, str] | None = None) -> tuple[list[dict], bool]:
    """The arguments in call order; `guessed` collects the scalars whose value is a guess, `promoted`
    gives scalars that became dims."""
    arguments: list[dict] = []
    dtype_used = False
    tensor_shapes = [(n, shapes[n]) for n in facts.tensors]
    all_dims = {d for _, s in tensor_shapes for d in s}
    for name, ctype in facts.params:
        if name in facts.tensors:
            fact = facts.tensors[name]
            dtype, certain = tensor_dtype(fact, binding)
            dtype_used |= dtype == "{dtype}"
            if not certain:
                notes.append(f"tensor `{name}`: dtype {dtype} taken from pointer casts or by default")
            others = [(n, s) for n, s in tensor_shapes if n != name]
            role = "out" if fact.mutable_cast and not fact.const_cast else "in"
            if ev and name in ev.mutated():
                role = "scratch" if re.search(r"workspace|scratch|tmp|buffer", name) else "inout"
            init_dtype = "int64" if int_main and dtype == "{dtype}" else dtype
            arg = {"name": name, "kind": "tensor", "shape": shapes[name], "dtype": dtype, "role": role,
                   "init": tensor_init(name, init_dtype, shapes[name], others, token_dim)}
            if fact.optional:
                arg["present"] = bool(fact.shapes)
                if fact.shapes:
                    notes.append(f"tensor `{name}` is optional (None allowed); drafted as present")
            arguments.append(arg)
        else:
            if promoted and name in promoted:
                arguments.append({"name": name, "kind": "scalar", "dtype": scalar_dtype(ctype),
                                  "value": int(promoted[name]) if promoted[name].isdigit() else promoted[name]})
                continue
            index = [p for p, _ in facts.params].index(name)
            passed = ev.scalar(index, shapes) if ev else None
            before = len(notes)
            arguments.append(_scalar(name, ctype, all_dims, passed, notes))
            if guessed is not None and len(notes) > before and "a guess" in notes[-1]:
                guessed.add(name)
    return arguments, dtype_used


def _scalar(name: str, ctype: str, all_dims: set[str], default, notes: list[str]) -> dict:
    if re.search(r"string|String|char\s*\*", ctype):
        value = default if isinstance(default, str) else "silu"
        if not isinstance(default, str):
            notes.append(f"string `{name}` ({ctype}) = {value!r}: a guess; check the value SGLang passes")
        return {"name": name, "kind": "string", "value": value}
    if isinstance(default, str) and not re.fullmatch(r"[A-Za-z_][\w ()*+/-]*", default):
        default = None  # a string literal where a number is expected: not evidence
    dtype = scalar_dtype(ctype)
    if isinstance(default, str) or (default is not None and not dtype.startswith("int")):
        value = bool(default) if dtype == "bool" else default
        return {"name": name, "kind": "scalar", "dtype": dtype, "value": value}
    own = ident(name)
    target = own if own in all_dims else None
    if target is None:
        m = meanings.meaning_of(name)
        target = next((d for d in all_dims if m and meanings.meaning_of(d) == m), None)
    if target is not None and dtype.startswith("int"):
        return {"name": name, "kind": "scalar", "dtype": dtype, "value": target}
    if default is not None:
        return {"name": name, "kind": "scalar", "dtype": dtype, "value": default}
    if dtype == "bool":
        value = False
    elif _EPS.search(name):
        value = 1.0e-6
    elif dtype.startswith("float"):
        value = 1.0
    else:
        value = 0 if re.search(r"pad|offset|start|layer|id$", name) else 1
    notes.append(f"scalar `{name}` ({ctype}) = {value}: a guess; check the value SGLang passes")
    return {"name": name, "kind": "scalar", "dtype": dtype, "value": value}


def bytes_expr(arguments: list[dict]) -> str:
    """The draft's `bytes` expression (astra.spec.draft_traffic: absent tensors move nothing, a table
    looked up by index moves the rows its indices name)."""
    return draft_traffic.bytes_expr(arguments)


