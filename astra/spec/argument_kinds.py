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
    firsts = [s[0] for n, s in others if s and s[0] not in own and s[0] != token_dim]
    high = (f"min({', '.join(dict.fromkeys(firsts))})" if len(set(firsts)) > 1 else firsts[0]) if firsts else None
    capacity = [f for f in firsts if (meanings.meaning_of(f) or meanings.MEANINGS[0]).key == "capacity"]
    if INDEX_NAMES.search(name) and high:
        if _SCATTER_NAMES.search(name) and capacity:  # distinct slots, below a pool larger than any sweep
            return {"dist": "perm", "high": capacity[0]}
        return {"dist": "randint", "low": 0, "high": high}
    if LEN_NAMES.search(name):
        return {"dist": "randint", "low": 1, "high": high or 64}
    return {"dist": "randint", "low": 0, "high": high or 64}

