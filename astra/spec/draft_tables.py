"""Shapes of a draft's tensors that no TensorMatcher states, read from what the entry does with them.

`table_shape`: a tensor the entry only reads sizes of through locals (`int rot_dim =
cos_sin_cache.size(1);`) takes those locals as its dims; when its name says it is a table looked up
by index (a cache, a pool: the `capacity` meaning), its first dim is a row count of its own (drawn
indices stay below it), not the token count. `lead_as_tokens`: when no TensorMatcher names a token
dim, the anonymous dim that leads the most tensors shaped from host checks (`query.size(0) ==
positions.size(0)`) is the token count.
"""

from __future__ import annotations

import re

from astra.spec import meanings
from astra.spec.draft_dims import Dims, ident
from astra.spec.draft_ranks import rename as _rename
from astra.spec.host_relations import Relations


def _sizes_read(facts, tensor: str) -> dict[int, str]:
    """index -> local name, for each local defined as `tensor.size(i)` (or `tensor.shape()[i]`)."""
    out: dict[int, str] = {}
    size = re.compile(rf"^(?:\(\s*\w+\s*\)\s*)?{re.escape(tensor)} \. (?:size \( (\d+) \)|shape \( \) \[ (\d+) \])$")
    for check in facts.checks:
        for local, text in check.locals.items():
            m = size.match(text.strip())
            if m:
                out.setdefault(int(m.group(1) or m.group(2)), local)
    return out


def table_shape(facts, tensor: str, fallback: list[str], dims: Dims) -> list[str] | None:
    """The shape of an unchecked tensor from the sizes its entry reads, or None (see the module)."""
    read = _sizes_read(facts, tensor)
    m = meanings.meaning_of(tensor)
    table = m is not None and m.key == "capacity"
    if not read and not table:
        return None
    rank = max(read) + 1 if read else len(fallback)
    shape = []
    for i in range(rank):
        if i in read:
            shape.append(dims.add_free(ident(read[i]), f"`{read[i]}` = {tensor}.size({i})"))
        elif i == 0 and table:
            shape.append(dims.add_free(f"{tensor}_rows", f"rows of {tensor} (a table looked up by index)"))
        elif i < len(fallback) and not (i == 0 and table):
            shape.append(fallback[i] if i else dims.add_free(f"{tensor}_d{i}", f"any size ({tensor} dim {i})"))
        else:
            shape.append(dims.add_free(f"{tensor}_d{i}", f"any size ({tensor} dim {i})"))
    return shape


def _root(d: str, dims: Dims) -> str:
    for _ in range(16):
        if d in dims.derived and re.fullmatch(r"\w+", dims.derived[d].strip()):
            d = dims.derived[d].strip()
        else:
            break
    return d


def lead_as_tokens(rel: Relations, dims: Dims, token_dim: str, notes: list[str]) -> None:
    """Rename the anonymous dim leading most reshaped tensors to `token_dim` (see the module)."""
    count: dict[str, int] = {}
    for shape in rel.reshaped.values():
        if shape:
            d = _root(shape[0], dims)
            if d in dims.free and d != token_dim and meanings.meaning_of(d) is None:
                count[d] = count.get(d, 0) + 1
    if not count:
        return
    lead = max(count, key=lambda d: count[d])
    table = {lead: token_dim}
    del dims.free[lead]
    dims.derived = {k: _rename(v, table) for k, v in dims.derived.items()}
    dims.by_cpp = {k: (token_dim if v == lead else v) for k, v in dims.by_cpp.items()}
    rel.constraints = [_rename(c, table) for c in rel.constraints]
    rel.reshaped = {t: [token_dim if d == lead else d for d in s] for t, s in rel.reshaped.items()}
    notes.append(f"dim `{lead}` leads the tensors shaped from host checks: taken as the token count `{token_dim}`")
