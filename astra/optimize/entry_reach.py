"""Which lines of a kernel file the spec's entry can reach, so the offline search does not spend
screenings on code another export runs.

One SGLang file often holds several exports: pos_enc.cuh has the rope of `rotary_embedding` and the
rope of `bf16_rope_scale_store`, each with its own launch and thread cap. A move in the other export's
host code or kernels builds and times exactly like the original, a wasted screening. libclang gives the
host functions and the kernels with their line extents; the entries of the spec
(`RotaryEmbeddingKernel::run`, `StoreKVCacheKernel<...>::run`) are reached, and through the names their
bodies use, the helpers and kernels they call. Lines of host functions and kernels not reached are
foreign; everything else (namespace-scope constants, device helpers, traits) stays in the space.
When the entry is not found or names no kernel, nothing is foreign: the space is never narrowed on a guess.
"""

from __future__ import annotations

import re

_TEMPLATE_ARGS = re.compile(r"<[^<>]*>")
_DEFINE = re.compile(r"^[ \t]*#[ \t]*define[ \t]+(?P<name>\w+)(?:[^\n]*\\\n)*[^\n]*", re.M)


def entry_path(entry: str) -> str:
    """`StoreKVCacheKernel<{row_bytes}, 8, true>::run` -> `StoreKVCacheKernel::run`."""
    previous = None
    while previous != entry:
        previous, entry = entry, _TEMPLATE_ARGS.sub("", entry)
    return entry.replace(" ", "").lstrip(":")


def _expanded(names: set[str], macros: dict[str, set[str]]) -> set[str]:
    """`names` with the words of every macro they use (`DISPATCH_DTYPE(...)` calls `launch_kernel<T>`)."""
    todo = [n for n in names if n in macros]
    while todo:
        for word in macros[todo.pop()] - names:
            names.add(word)
            if word in macros:
                todo.append(word)
    return names


def _matches(qualified_name: str, path: str) -> bool:
    name = qualified_name.replace(" ", "")
    return name == path or name.endswith("::" + path)


def foreign_lines(parsed, entries: list[str], text: str) -> set[int]:
    """Source lines (1-based) of `text` that belong to host functions and kernels the entries do not reach.

    Reaching is read from the text of what is reached, to a fixed point: a host function, kernel or
    class is reached when its name appears in the body of something reached (libclang's references miss
    calls inside templates, and SGLang launches through helpers such as `dispatch_by_dtype<...>(...)`)."""
    if parsed is None or not entries:
        return set()
    paths = {entry_path(e) for e in entries}
    # (the name that calls it by, first line, last line, is a kernel)
    items = [(cls or qualified.rsplit("::", 1)[-1], qualified, start, end, False)
             for qualified, cls, start, end in getattr(parsed, "host_functions", [])]
    items += [(k.name, k.qualified_name, k.start_line, k.end_line, True) for k in parsed.kernels]
    reached = [item for item in items if not item[4] and any(_matches(item[1], p) for p in paths)]
    lines = text.splitlines()
    macros = {m.group("name"): set(re.findall(r"\w+", m.group(0))) for m in _DEFINE.finditer(text)}
    todo = list(reached)
    while todo:
        _, _, start, end, _ = todo.pop()
        names = _expanded(set(re.findall(r"\w+", "\n".join(lines[start - 1: end]))), macros)
        for item in items:
            if item not in reached and item[0] in names:
                reached.append(item)
                todo.append(item)
    if not any(item[4] for item in reached):
        return set()
    foreign: set[int] = set()
    for item in items:
        if item not in reached:
            foreign.update(range(item[2], item[3] + 1))
    return foreign
