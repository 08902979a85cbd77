"""A CTA's warp count where the kernel writes it as several literals that must move together.

Many of SGLang's one-warp-per-row kernels fix their CTA at four warps with plain literals:
`__launch_bounds__(128)` on the kernel, `LaunchKernel(tokens, 128, ...)` at the launch, and inside the
body `__shared__ T rows[4][kHeadDim]` (a slot per warp) and `for (h = warp; h < heads; h += 4)` (the
warps' stride over rows). Moving any one of them alone is wrong or wasted: more threads than the
bounds fail to launch, more warps than shared slots write out of bounds, a stride that disagrees with
the warp count skips or repeats rows. This finds such kernels and offers the thread count as one
`warps` parameter whose linked literals follow it (the launch's block literal, and each warp-count
literal of the body divided by 32).

A kernel qualifies only when every piece is found: literal launch bounds, a literal block size at each
launch of that kernel (a statement that names it and no other kernel; every use of its name outside its
definition is such a launch), and at least one warp-count literal in the body: a `__shared__` dimension
the body indexes with the warp, or a `+= W` step of a loop that starts at the warp index. A kernel that
takes a row per warp from `blockIdx.x * W` links that literal and the last argument of its grid's
`div_ceil(rows, W)`; without that grid it is left alone. Comments are blanked before anything is read.
Nothing else is assumed: the judge verifies each point on the GPU like any other.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from astra.cxx.brackets import closing
from astra.cxx.text import blank
from astra.optimize import cpp_args

WARP = 32
MAX_THREADS = 1024

_KERNEL = re.compile(r"__global__\s+(?:void\s+)?__launch_bounds__\s*\(\s*(?P<n>\d+)\s*\)\s*(?:void\s+)?(?P<name>\w+)\s*\(")
_LAUNCH = re.compile(r"\bLaunchKernel\s*\(|<<<")
_SHARED_DIM = r"__shared__[^;]*?\b(?P<name>\w+)\s*\[\s*(?P<w>{w})\s*\]"
# a loop that starts at the warp index itself (`h = warp`, `h = static_cast<int>(warp_id)`) and steps by W
_WARP_STEP = (r"\bfor\s*\([^;=]*=\s*(?:static_cast\s*<[^<>]*>\s*\(\s*)?warp\w*\s*\)?\s*;[^;]*;"
              r"[^)]*\+=\s*(?P<w>{w})\s*\)")
_ROW_BASE = r"\bblockIdx\.x\s*\*\s*(?P<w>{w})\b"  # a CTA's first row when each warp takes one
_DIV_CEIL = re.compile(r"\bdiv_ceil\s*\(")


@dataclass(frozen=True)
class WarpGeometry:
    kernel: str
    start: int  # the launch bounds' literal
    end: int
    threads: int
    links: tuple[tuple[int, int, int], ...]  # (start, end, divisor): other literals, written as threads // divisor
    where: str  # "launch at L441, 2 warp-count literal(s) at L229, L242"

    def choices(self) -> tuple[int, ...]:
        return tuple(t for t in (self.threads // 2, self.threads * 2, self.threads * 4)
                     if 2 * WARP <= t <= MAX_THREADS)


def _line(text: str, pos: int) -> int:
    return text.count("\n", 0, pos) + 1


def _body(text: str, open_paren: int) -> tuple[int, int] | None:
    """The span of the function body that follows a signature opened at `open_paren`."""
    brace = text.find("{", open_paren)
    if brace < 0 or ";" in text[text.find(")", open_paren): brace]:
        return None
    close = closing(text, brace)
    return (brace, close) if close is not None else None


def _grid_divisor(text: str, span: tuple[int, int], warps: int) -> tuple[int, int] | None:
    """The span of the literal `warps` as the last argument of the grid's outermost `div_ceil(...)`."""
    m = _DIV_CEIL.search(text, span[0], span[1])
    args = cpp_args.arguments(text, m.end()) if m else []
    if len(args) != 2:
        return None
    last = re.fullmatch(r"\s*(?P<w>\d+)\s*", text[args[1][0]:args[1][1]])
    if not last or int(last.group("w")) != warps:
        return None
    return args[1][0] + last.start("w"), args[1][0] + last.end("w")


def _block_literals(text: str, kernel: str, threads: int, kernels: set[str], definition: int,
                    grid_warps: bool = False) -> list[tuple] | None:
    """The literal block size of every launch of `kernel` (a statement naming it, and no other kernel,
    with `LaunchKernel(` or `<<<`), as (start, end, divisor); None when one launch gives its block
    otherwise, when the name is used anywhere but its definition and such launches (`auto k = kernel;`,
    `cudaLaunchKernelEx`: a launch this cannot follow), or when there is no launch. `grid_warps`: the
    kernel takes a row per warp from `blockIdx.x * W`, so each launch's grid must divide by the warp
    count as a literal (`div_ceil(rows, W)`), which is linked too."""
    spans, statements = [], []
    others = [k for k in kernels if k != kernel]
    for m in _LAUNCH.finditer(text):
        statement_start = max(text.rfind(c, 0, m.start()) for c in ";{}") + 1
        statement_end = text.find(";", m.end())
        statement = text[statement_start:statement_end] if statement_end >= 0 else ""
        if not re.search(rf"\b{re.escape(kernel)}\b", statement):
            continue
        if any(re.search(rf"\b{re.escape(k)}\b", statement) for k in others):
            return None  # `LaunchKernel(...)(flag ? a : b, ...)`: whose block is it?
        args = cpp_args.arguments(text, m.end(), ">>>" if m.group(0) == "<<<" else ")")
        found = cpp_args.literal(text, args[1]) if len(args) >= 2 else None
        if not found or found[2] != threads:
            return None
        spans.append((found[0], found[1], 1))
        statements.append((statement_start, statement_end))
        if grid_warps:
            grid = _grid_divisor(text, args[0], threads // WARP)
            if not grid:
                return None
            spans.append((grid[0], grid[1], WARP))
    uses = [u.start() for u in re.finditer(rf"\b{re.escape(kernel)}\b", text) if u.start() != definition]
    if any(not any(a <= u < b for a, b in statements) for u in uses):
        return None
    return spans or None


def find(text: str) -> list[WarpGeometry]:
    """Every kernel of `text` whose warp count is written as linked literals (see the module docstring)."""
    text = blank(text)
    out = []
    kernels = list(_KERNEL.finditer(text))
    names = [m.group("name") for m in kernels]
    for m in kernels:
        threads = int(m.group("n"))
        if threads % WARP or threads // WARP < 2 or names.count(m.group("name")) > 1:  # overloads: which launch?
            continue
        body = _body(text, m.end() - 1)
        if not body:
            continue
        w, inside = str(threads // WARP), text[body[0]:body[1]]
        row_base = [body[0] + f.start("w") for f in re.finditer(_ROW_BASE.format(w=w), inside)]
        launches = _block_literals(text, m.group("name"), threads, set(names), m.start("name"),
                                   grid_warps=bool(row_base))
        if not launches:
            continue
        inner = {(start, start + len(w), WARP) for start in row_base}
        for found in re.finditer(_SHARED_DIM.format(w=w), inside):  # a slot per warp: indexed by the warp
            if re.search(rf"\b{re.escape(found.group('name'))}\s*\[\s*warp\w*\s*\]", inside):
                inner.add((body[0] + found.start("w"), body[0] + found.end("w"), WARP))
        for found in re.finditer(_WARP_STEP.format(w=w), inside):
            inner.add((body[0] + found.start("w"), body[0] + found.end("w"), WARP))
        if not inner:
            continue
        grids = [a for a, _, d in launches if d == WARP]
        where = (", ".join(f"launch at L{_line(text, a)}" for a, _, d in launches if d == 1)
                 + (" (its grid's div_ceil too)" if grids else "")
                 + f", {len(inner)} warp-count literal(s) at " + ", ".join(f"L{_line(text, a)}" for a, _, _ in sorted(inner)))
        out.append(WarpGeometry(m.group("name"), m.start("n"), m.end("n"), threads, tuple(launches + sorted(inner)), where))
    return out
