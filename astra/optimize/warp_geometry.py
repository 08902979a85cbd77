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
launch of that kernel, and at least one warp-count literal in the body (a `__shared__` dimension or a
`+= W` step of a loop that starts at the warp index). Nothing else is assumed: the judge verifies each
point on the GPU like any other, and the grid is left alone (a per-row kernel's grid does not depend
on its warp count; one that does is caught as incorrect).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

WARP = 32
MAX_THREADS = 1024

_KERNEL = re.compile(r"__global__\s+(?:void\s+)?__launch_bounds__\s*\(\s*(?P<n>\d+)\s*\)\s*(?:void\s+)?(?P<name>\w+)\s*\(")
_LAUNCH = re.compile(r"\bLaunchKernel\s*\(|<<<")
_SHARED_DIM = r"__shared__[^;]*?\w+\s*\[\s*(?P<w>{w})\s*\]"
_WARP_STEP = r"\bfor\s*\([^;]*\bwarp\w*[^;]*;[^;]*;[^)]*\+=\s*(?P<w>{w})\s*\)"
_ROW_BASE = r"\bblockIdx\.x\s*\*\s*(?P<w>{w})\b"  # a CTA's first row when each warp takes one
_GRID_DIV = r"\bdiv_ceil\s*\([^;]*?,\s*(?P<w>{w})\s*\)"  # the grid that matches: rows / warps per CTA


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
    depth = 0
    for i in range(brace, len(text)):
        if text[i] == "{":
            depth += 1
        elif text[i] == "}":
            depth -= 1
            if depth == 0:
                return brace, i
    return None


def _block_literals(text: str, kernel: str, threads: int, grid_warps: bool = False) -> list[tuple] | None:
    """The literal block size of every launch of `kernel` (a statement naming it with `LaunchKernel(`
    or `<<<`), as (start, end, divisor); None when one launch gives its block otherwise or there is no
    launch. `grid_warps`: the kernel takes a row per warp from `blockIdx.x * W`, so each launch's grid
    must divide by the warp count as a literal (`div_ceil(rows, W)`), which is linked too."""
    from astra.optimize.param_space import _arguments, _literal

    spans = []
    for m in _LAUNCH.finditer(text):
        statement_start = max(text.rfind(c, 0, m.start()) for c in ";{}") + 1
        statement_end = text.find(";", m.end())
        if statement_end < 0 or not re.search(rf"\b{re.escape(kernel)}\b", text[statement_start:statement_end]):
            continue
        args = _arguments(text, m.end(), ">>>" if m.group(0) == "<<<" else ")")
        found = _literal(text, args[1]) if len(args) >= 2 else None
        if not found or found[2] != threads:
            return None
        spans.append((found[0], found[1], 1))
        if grid_warps:
            grid = re.search(_GRID_DIV.format(w=threads // WARP), text[args[0][0]:args[0][1]])
            if not grid:
                return None
            spans.append((args[0][0] + grid.start("w"), args[0][0] + grid.end("w"), WARP))
    return spans or None


def find(text: str, comments: list[tuple[int, int]] = ()) -> list[WarpGeometry]:
    out = []
    kernels = list(_KERNEL.finditer(text))
    names = [m.group("name") for m in kernels]
    for m in kernels:
        threads = int(m.group("n"))
        if (threads % WARP or threads // WARP < 2 or names.count(m.group("name")) > 1  # overloads: which launch?
                or any(a <= m.start() < b for a, b in comments)):
            continue
        body = _body(text, m.end() - 1)
        if not body:
            continue
        w = str(threads // WARP)
        row_base = [body[0] + f.start("w") for f in re.finditer(_ROW_BASE.format(w=w), text[body[0]:body[1]])]
        launches = _block_literals(text, m.group("name"), threads, grid_warps=bool(row_base))
        if not launches:
            continue
        inner = [(start, start + len(w), WARP) for start in row_base]
        for pattern in (_SHARED_DIM, _WARP_STEP):
            for found in re.finditer(pattern.format(w=w), text[body[0]:body[1]]):
                start = body[0] + found.start("w")
                if not any(a <= start < b for a, b in comments):
                    inner.append((start, start + len(w), WARP))
        if not inner:
            continue
        links = tuple(launches + sorted(set(inner)))
        where = (", ".join(f"launch at L{_line(text, a)}" for a, _, d in launches if d == 1)
                 + f", {len(inner)} warp-count literal(s) at " + ", ".join(f"L{_line(text, a)}" for a, _, _ in sorted(set(inner))))
        out.append(WarpGeometry(m.group("name"), m.start("n"), m.end("n"), threads, links, where))
    return out
