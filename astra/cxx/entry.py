"""A wrapper's C++ entry as the spec writes it (`entry:`), read as text: `ns::Kernel<4, {dtype}>::run`,
`fn<T, 4>`, `&ns::Cls<a, b>::run<c>`.

`segments(entry)` cuts the entry at its top-level `::` into the names it qualifies, each with its
template argument list when it has one: the arguments as written (split at top-level commas, so
`Kernel<std::pair<int, int>, (a < b)>` has two) and the span of the list's text in the entry, for
callers that write new arguments back (astra.spec.template_args). `entry_parts(entry)` is the usual
question: which class and which function, with which arguments. Placeholders (`{dtype}`) are kept as
written; a leading `&` (a function's address) is not part of any name.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from astra.cxx.brackets import closing, spans, split_top


@dataclass(frozen=True)
class Segment:
    name: str  # `Kernel` (as written before its `<`)
    args: tuple[str, ...] | None  # its template arguments; None when it has no list
    start: int = -1  # the span in the entry of the text between `<` and `>` (-1: no list)
    end: int = -1


def segments(entry: str) -> list[Segment]:
    """The `::`-separated names of `entry` in order, each with its template argument list (see the
    module docstring); `ns::Cls<a, b>::run` -> ns, Cls <a, b>, run."""
    lead = len(entry) - len(entry.lstrip().lstrip("&"))
    out = []
    for begin, end in spans(entry, lead, sep="::"):
        lt = entry.find("<", begin, end)
        gt = closing(entry, lt, end) if lt >= 0 else None
        if gt is None:
            out.append(Segment(entry[begin:end].strip(), None))
            continue
        out.append(Segment(entry[begin:lt].strip(), tuple(split_top(entry[lt + 1:gt])), lt + 1, gt))
    return out


def entry_parts(entry: str) -> tuple[str | None, str, list[str], list[str]]:
    """(class, function, class's template arguments, function's) of an entry: `ns::Cls<a, b>::run<c>` ->
    ("Cls", "run", ["a", "b"], ["c"]); a free function (`ns::fn<4>`) has no class (None, "fn", [], ["4"])."""
    parts = segments(entry)
    fn = parts[-1] if parts else Segment("", None)
    if len(parts) >= 2:
        cls = parts[-2]
        return cls.name, fn.name, list(cls.args or ()), list(fn.args or ())
    return None, fn.name, [], list(fn.args or ())


def owner_names(entry: str) -> list[str]:
    """The plain names the entry qualifies, in order (`ns::Cls<a>::run` -> ns, Cls, run): the names
    that may be templates whose argument list the entry lacks."""
    return [s.name for s in segments(entry) if re.fullmatch(r"\w+", s.name)]
