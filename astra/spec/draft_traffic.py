"""What a drafted kernel moves, and which of its index tensors must hold distinct values.

`bytes_expr(arguments)` is the draft's `bytes`: each present tensor's size times its element size, an
`inout` (or an alias's target) twice (read and written), with exceptions that the floors depend on:
- an absent optional tensor (`present: false`) moves nothing: the call passes None; neither does a
  `scratch` workspace, nor an alias (it is its target's tensor);
- a tensor whose shape the extractor guessed (`counted: false`: no check of the entry gives it) is left
  out: the physical floor must be one no kernel beats, so it counts only what is known. Counting the
  guesses put moe_lora_align_block_size's floor at 424 us on an H100 where the original runs 379.6 us
  (every tensor but `topk_ids` guessed as [tokens, hidden]), and its candidates were refused as suspect;
- a table looked up by index (its leading dim is what an index tensor's values range below, e.g.
  `cos_sin_cache[rows, rot_dim]` read at `positions`, or a KV pool written at `loc`) moves at most the
  rows its indices name: `min(rows, numel of the indices) x row bytes`. Counting the whole table put
  the physical floor of SGLang's rotary_embedding above the original's own time (on an H100, 1.45 us
  against a 2.15 us floor for 256 tokens over a 32768-row cache).

`distinct_scatter_indices(arguments)`: an integer index whose values range over the rows of a tensor
the kernel writes is a scatter target (`loc`, `out_cache_loc`, slots): SGLang never writes two tokens
to one slot, and random indices with repeats make two threads race on a row, so the original disagrees
with itself between runs (set_mla_kv_concat_q_fp8 on an H100: 553 elements of `kv_buffer` differed at
batch 8 over 128 rows). Such an index is drawn as distinct values (`perm`).
"""

from __future__ import annotations

import re

from astra.spec.argument_kinds import INDEX_NAMES, LEN_NAMES
from astra.spec.expr import DTYPE_BYTES

_EXTRA_BYTES = {"uint64": 8, "uint32": 4, "uint16": 2}  # dtypes torch has that `elt` does not know
_WORD = re.compile(r"\w+")
# where a token's values go (not expert ids, which repeat; not `block`, `alloc`, `num_slots`)
_SCATTER = re.compile(r"(^|_)(locs?|slots?|slot_ids?|slot_mapping|dst|dst_idx|dst_ind(ex|ices)?)$", re.I)


def _present(a: dict) -> bool:
    return a.get("kind") == "tensor" and a.get("present", True) is not False


def _elt(dtype: str) -> str:
    if dtype == "{dtype}":
        return "elt(dtype)"
    return f"elt('{dtype}')" if dtype in DTYPE_BYTES else str(_EXTRA_BYTES.get(dtype, 8))


def _product(shape: list) -> str:
    return " * ".join(str(s) if _WORD.fullmatch(str(s)) else f"({s})" for s in shape) or "1"


def _index_high(a: dict) -> str | None:
    """The dim an integer index tensor's values range below (a dim name, not a number), else None."""
    init = a.get("init") or {}
    high = init.get("high")
    if (init.get("dist") in ("randint", "perm") and isinstance(high, str) and _WORD.fullmatch(high.strip())
            and not high.strip().isdigit()):
        return high.strip()
    return None


def lookups(arguments: list[dict]) -> dict[str, list[str]]:
    """{dim: numel expressions of the index tensors whose values range below it}: present `in` integer
    tensors named as indices (an int8 output or a length drawn below some size is not one)."""
    out: dict[str, list[str]] = {}
    for a in arguments:
        high = _index_high(a) if _present(a) and a.get("role", "in") == "in" else None
        if (high and not str(a.get("dtype", "")).startswith(("float", "bfloat", "{"))
                and INDEX_NAMES.search(a["name"]) and not LEN_NAMES.search(a["name"])):
            out.setdefault(high, []).append(_product(a.get("shape") or []))
    return out


def bytes_expr(arguments: list[dict]) -> str:
    """The draft's `bytes` expression (see the module)."""
    looked_up = lookups(arguments)
    targets = {a.get("alias") for a in arguments if a.get("alias")}
    terms = []
    for a in arguments:
        if not _present(a) or a.get("alias") or a.get("role") in ("scratch", "alias") or a.get("counted") is False:
            continue  # a workspace is not traffic the result needs; an alias is its target's tensor
        shape = [str(s) for s in a.get("shape") or []]
        indices = looked_up.get(shape[0]) if shape else None
        if indices and _index_high(a) != shape[0]:  # a table read or written at the rows its indices name
            rows = f"min({shape[0]}, {' + '.join(indices)})"
            size = " * ".join([rows] + [s if _WORD.fullmatch(s) else f"({s})" for s in shape[1:]])
        else:
            size = _product(shape)
        both = a.get("role") == "inout" or a["name"] in targets
        terms.append(f"{'2 * ' if both else ''}{size} * {_elt(str(a.get('dtype')))}")
    return " + ".join(terms) or "0"


def distinct_scatter_indices(arguments: list[dict], notes: list[str]) -> None:
    """Draw as `perm` each integer index whose values range over the rows of a tensor the kernel writes
    (see the module); its `numel <= rows` constraint comes from `index_constraints`."""
    written = {str(a["shape"][0]) for a in arguments
               if _present(a) and a.get("role") in ("out", "inout") and a.get("shape")}
    for a in arguments:
        init = a.get("init") or {}
        high = _index_high(a) if _present(a) else None
        if (high in written and init.get("dist") == "randint" and a.get("role") in ("in", None)
                and _SCATTER.search(a["name"]) and len(a.get("shape") or []) == 1 and high != str(a["shape"][0])
                and not str(a.get("dtype", "")).startswith(("float", "bfloat", "{", "bool"))):
            a["init"] = {"dist": "perm", "high": high}
            notes.append(f"tensor `{a['name']}`: indexes rows of a tensor the kernel writes ({high}): drawn "
                         f"distinct (a permutation), as SGLang never writes two tokens to one slot")
