"""What a drafted argument is, read from its C++ and its name: a tensor's dtype (its `with_dtype`
check, else the pointer casts of its data), a scalar's dtype from its C++ type, and how a tensor is
filled (floats normal, scales positive, indices below the size of what they index, lengths positive).
"""

from __future__ import annotations

import re

from astra.spec import meanings
from astra.spec.expr import CPP_DTYPES

CPP_TO_DTYPE = {v: k for k, v in CPP_DTYPES.items()} | {
    "float": "float32", "half": "float16", "__half": "float16", "__nv_bfloat16": "bfloat16", "nv_bfloat16": "bfloat16",
    "int": "int32", "int32_t": "int32", "int64_t": "int64", "long": "int64", "uint32_t": "int32", "unsigned": "int32",
    "uint64_t": "uint64", "int8_t": "int8", "uint8_t": "uint8", "bool": "bool", "fp8_e4m3_t": "float8_e4m3fn",
    "__nv_fp8_e4m3": "float8_e4m3fn", "fp16_t": "float16", "bf16_t": "bfloat16", "fp32_t": "float32",
    "double": "float64", "int16_t": "int16"}
MAIN_DTYPES = ("bf16_t", "fp16_t", "fp32_t", "half", "nv_bfloat16")
_SCALAR_TYPES = {"float": "float32", "double": "float64", "int": "int32", "int32_t": "int32", "int64_t": "int64",
                 "uint32_t": "int64", "uint64_t": "int64", "bool": "bool", "size_t": "int64", "long": "int64"}
INDEX_NAMES = re.compile(r"ind|idx|loc|slot|pos|page|table|map|perm|ids?$|_id|offset|start|src|dst_?i|token_to|"
                         r"req_to|expert_?id|topk_?id|select", re.I)
LEN_NAMES = re.compile(r"len|count|num_|cnt|size", re.I)
_SCATTER_NAMES = re.compile(r"loc|slot|out_cache|dst_ind|indices", re.I)


_ALIAS = re.compile(r"^\s*using\s+(\w+)\s*=\s*(?:std::)?([\w:]+)\s*;|^\s*typedef\s+(?:std::)?([\w:]+)\s+(\w+)\s*;", re.M)


def type_aliases(text: str) -> dict[str, str]:
    """`using RID_T = int64_t;` / `typedef int32_t idx_t;` of a kernel file, for the element types a
    spec can name (a `with_dtype<RID_T>()` check then reads as int64)."""
    out = {}
    for m in _ALIAS.finditer(text):
        alias, target = (m.group(1), m.group(2)) if m.group(1) else (m.group(4), m.group(3))
        if target in CPP_TO_DTYPE and alias not in CPP_TO_DTYPE:
            out.setdefault(alias, target)
    return out


def tensor_dtype(fact, binding: dict[str, str]) -> tuple[str, bool]:
    """(dtype field, certain) of a tensor: `{dtype}` where its check names the main dtype param."""
    options = [binding.get(d, d) for d in fact.dtypes]
    for opt in options:
        if opt == "{dtype}":
            return "{dtype}", True
    for opt in options:
        name = CPP_TO_DTYPE.get(opt, opt if opt in CPP_DTYPES else None)
        if name:
            return name, True
    for elem in fact.elem_types:
        mapped = binding.get(elem, elem)
        if mapped == "uint64_t":  # a cast of the data, not a dtype check: torch passes int64 here
            return "int64", False
        if mapped == "{dtype}":
            return "{dtype}", False
        if mapped in CPP_TO_DTYPE:
            return CPP_TO_DTYPE[mapped], False
        if mapped in CPP_DTYPES:
            return mapped, False
    return "{dtype}", False


def scalar_dtype(ctype: str) -> str:
    return _SCALAR_TYPES.get(re.sub(r"\bconst\b|&", "", ctype).strip(), "float32")


def tensor_init(name: str, dtype: str, shape: list[str], others: list[tuple[str, list[str]]],
                token_dim: str | None) -> dict:
    """How to fill a tensor: floats normal (scales positive), integers as indices below the size of
    what they index, lengths positive, bools random."""
    if dtype == "{dtype}" or dtype.startswith(("float", "bfloat")):
        if re.search(r"scale|norm_?w|gamma|weight_scale|inv", name, re.I):
            return {"dist": "uniform", "low": 0.5, "high": 1.5}
        return {"dist": "normal", "mean": 0.0, "std": 1.0}
    if dtype == "bool":
        return {"dist": "randint", "low": 0, "high": 2}
    if dtype == "uint8":
        return {"dist": "randint", "low": 0, "high": 256}
    own = set(shape)
    firsts = [s[0] for n, s in others if s and s[0] not in own and s[0] != token_dim
              and not (str(s[0]).isdigit() and int(s[0]) <= 1)]  # a [1, ...] tensor is indexed by nothing
    high = (f"min({', '.join(dict.fromkeys(firsts))})" if len(set(firsts)) > 1 else firsts[0]) if firsts else None
    capacity = [f for f in firsts if (meanings.meaning_of(f) or meanings.MEANINGS[0]).key == "capacity"]
    if INDEX_NAMES.search(name) and high:
        if _SCATTER_NAMES.search(name) and capacity:  # distinct slots, below a pool larger than any sweep
            return {"dist": "perm", "high": capacity[0]}
        return {"dist": "randint", "low": 0, "high": high}
    if LEN_NAMES.search(name):
        return {"dist": "randint", "low": 1, "high": high or 64}
    return {"dist": "randint", "low": 0, "high": high or 64}


_PLUS_ONE = re.compile(r"\s*(?P<n>[A-Za-z_]\w*)\s*\+\s*1\s*")


def offsets_init(arguments: list[dict], derived: dict[str, str], token_dim: str) -> list[str]:
    """Offsets into the token dim (`cu_seqlens`, `qsl`, CSR `indptr`): a 1-D integer input of n + 1
    entries, by the host check `cu.size(0) == nseq + 1` or by its shape, is drawn as the offsets of n
    equal runs of tokens (0, t/n, 2t/n, ..., at most t): monotone and inside the tokens, where random
    indices would make runs that overlap, go backwards or end past the tokens. Returns review notes."""
    notes = []
    for arg in arguments:
        shape = arg.get("shape") or []
        if (arg.get("kind") != "tensor" or arg.get("role") not in ("in", None) or len(shape) != 1
                or str(arg.get("dtype")) not in ("int32", "int64")):
            continue
        found = _PLUS_ONE.fullmatch(str(derived.get(shape[0], shape[0])))
        if not found:
            continue
        n, runs_of = found.group("n"), token_dim
        if n == token_dim:  # offsets of the swept batch into another dim: the one its indices were bounded by
            bound = [w for w in re.findall(r"[A-Za-z_]\w*", str((arg.get("init") or {}).get("high", "")))
                     if w not in (n, "min", "max")]
            if not bound:
                continue
            runs_of = bound[0]
        arg["init"] = {"dist": "arange", "start": 0, "step": f"{runs_of} // max(1, {n})"}
        notes.append(f"tensor `{arg['name']}`: {n} + 1 integers, drawn as the offsets of {n} equal runs of "
                     f"`{runs_of}` (0, {runs_of} // {n}, ...)")
    return notes

