"""coarsen: each CTA handles several consecutive blocks' worth of work (rows, tokens), the grid shrinks.

    template <...>                                       constexpr uint32_t kScaleRowsPerBlock = 2;
    __global__ void scale(P p) {                         template <...>
      BODY (reads blockIdx.x, gridDim.x)         ->      __global__ void scale(P p, const uint32_t coarse_grid) {
    }                                                      for (uint32_t block_row = blockIdx.x * kScaleRowsPerBlock;
    LaunchKernel(grid, block, stream)(scale<...>, p);           block_row < (blockIdx.x + 1) * k... && block_row < coarse_grid;
                                                                ++block_row) {
                                                             [&] { BODY (block_row, coarse_grid) }();
                                                           }
                                                         }
                                                         LaunchKernel((grid + k - 1) / k, block, stream)(scale<...>, p,
                                                                                                         grid)

The original body runs once per original block index, inside a lambda (its `return`s end that row, not
the CTA), with `blockIdx.x` read as the row and `gridDim.x` as the original grid size, which the launch
now passes as a new last parameter. A `__syncthreads()` separates the rows, whatever the body reads: the
next row's writes to shared memory must not overtake this row's reads, and the body may reach shared memory
through a device function it calls (fast_topk's radix select, on an H100: without the barrier the
coarsened kernel gave 50 wrong indices of 2097152 on a 4096-row case). Every thread of the CTA runs the same
rows (the loop reads only blockIdx.x and the grid), so the barrier is reached by all of them. Small rows
leave most of a CTA's launch and prologue cost amortised over `k` rows (k = 2); where the grid is smaller
than the SM count, fewer CTAs only lower the parallelism (astra/data/planning_rules.yaml plans it for
thousands of tiny CTAs only).

Applies to a `__global__` kernel of this file that reads `blockIdx.x` and is launched from host code of
this file through SGLang's `LaunchKernel(grid, block, ...)(kernel, args...)` only (every reference to
it is such a launch, or an occupancy or attribute query; passes.launches), with a one-dimensional grid (not a `dim3`).
Refused: kernels using clusters, 2-D/3-D grids, grid-wide sync or cooperative groups; kernels that
call a device function of this file reading `blockIdx` or `gridDim` (it would see the CTA's index, not
the row's); and kernels that release their dependent launches (a programmatic dependent launch's trigger):
run once per row, the trigger would let a dependent kernel start after a CTA's first row, while its next row
still writes (fast_topk's coarsened candidate, wrong on 50 of 2,097,152 indices on 4 x H100, triggers so; that
this is the cause was not measured).
"""

from __future__ import annotations

import re

from astra.optimize.passes.base import ParsedPass, Refusal
from astra.optimize.passes.launches import launch_grids, qualifier
from astra.optimize.passes.syntax import Unit, body, callee, is_global, splice, walk

ROWS = 2
_TRIGGER = re.compile(r"PDLTriggerSecondary|launch_dependents|cudaTriggerProgrammaticLaunchCompletion")
_GRID_WIDE = ("cluster", "grid_group", "this_grid", "cooperative_groups", "__cluster_dims__", "gridDim.y",
              "gridDim.z")


class Coarsen(ParsedPass):
    name = "coarsen"
    family = "coarsen"

    def rewrite(self, unit: Unit, spec: dict | None) -> tuple[str, str]:
        functions = unit.functions()
        seeing = _grid_readers(unit)
        reasons: list[str] = []
        edits: list[tuple[int, int, str]] = []
        done: list[str] = []
        for kernel in unit.kernels():
            called = {callee(n) for n in walk(kernel) if n.kind.name == "CALL_EXPR"} & seeing
            why = (f"calls {sorted(called)[0]}, which reads blockIdx or gridDim: it would see the CTA, not the row"
                   if called else _coarsen(unit, kernel, functions, edits))
            if why:
                reasons.append(f"{kernel.spelling}: {why}")
            else:
                done.append(kernel.spelling)
        if not done:
            raise Refusal(reasons[0] if reasons else "no __global__ kernel in the file")
        return splice(unit, edits), (f"{ROWS} blocks' rows per CTA, grid divided by {ROWS}: {', '.join(done)}")


def _grid_readers(unit: Unit) -> set[str]:
    """Names of this file's device functions (not kernels) that read blockIdx or gridDim, directly or
    through another such function."""
    helpers = {f.spelling: f for f in unit.device_functions() if not is_global(f)}
    calls = {name: {callee(n) for n in walk(f) if n.kind.name == "CALL_EXPR"} for name, f in helpers.items()}
    out = {name for name, f in helpers.items() if re.search(r"\b(blockIdx|gridDim)\b", unit.code(f))}
    grew = True
    while grew:
        more = {name for name in helpers if name not in out and calls[name] & out}
        grew, out = bool(more), out | more
    return out


def _coarsen(unit: Unit, kernel, functions: list, edits: list) -> str:
    """Add the kernel's and its launches' edits to `edits`; '' when done, else why not."""
    block = body(kernel)
    if block is None:
        return "no body"
    text = unit.code(block)
    if any(word in text for word in _GRID_WIDE):
        return "uses clusters, a 2-D/3-D grid or grid-wide sync"
    if _TRIGGER.search(text):
        return ("releases its dependent launches (PDL): with several rows per CTA it would release them after the "
                "first row, while the next one still writes")
    rows = [n for n in walk(block) if n.kind.name == "MEMBER_REF_EXPR" and re.fullmatch(r"blockIdx\s*\.\s*x",
                                                                                          unit.code(n))]
    if not rows:
        return "does not read blockIdx.x"
    launches = launch_grids(unit, kernel)
    if isinstance(launches, str):
        return launches
    params = [c for c in kernel.get_children() if c.kind.name == "PARM_DECL"]
    if not params or any(c.spelling == "coarse_grid" for c in params):
        return "no parameters to extend"
    staged = []
    for outer, grid in launches:
        g = unit.code(grid)
        written = [n for n in walk(grid) if unit.span(n) == unit.span(grid)][-1]  # under the conversion to dim3
        if "dim3" in g or "dim3" in written.type.spelling or g.lstrip().startswith("{") or re.search(r"\+\+|--|[^=!<>]=[^=]", g):
            return f"grid `{g}` is not a plain 1-D size"
        staged.append((outer, grid, g))
    const = _constant_name(kernel.spelling)
    start = unit.line_start(unit.span(kernel)[0])
    edits.append((start, start, f"constexpr uint32_t {const} = {ROWS};  // rows (blocks of the original grid) per CTA\n"))
    edits.append(_new_parameter(unit, params))
    edits.append(_body_edit(unit, block, rows, const))
    for outer, grid, g in staged:
        host = next((f for f in functions if unit.span(f)[0] <= unit.span(outer)[0] < unit.span(f)[1]), None)
        qualified = qualifier(kernel, host) + const  # the launch may stand in another namespace than the kernel
        a, b = unit.span(grid)
        edits.append((a, b, f"({g} + {qualified} - 1) / {qualified}"))
        close = unit.span(outer)[1] - 1  # the `)` of the launch's argument list
        added = f"static_cast<uint32_t>({g})"
        line = unit.data[unit.line_start(close):unit.data.find(b"\n", close)]
        same_line = unit.line_start(unit.span(grid)[0]) == unit.line_start(close)
        grown = len(line) + len(added) + 2 + (len(f"({g} + {qualified} - 1) / {qualified}") - len(g) if same_line else 0)
        wrap = f",\n{unit.indent(close)}    " if grown > 120 else ", "
        edits.append((close, close, wrap + added))
    return ""


def _new_parameter(unit: Unit, params: list) -> tuple[int, int, str]:
    """`, const uint32_t coarse_grid` after the last parameter; on a line of its own, aligned with the
    first parameter, where the signature's line would pass 120 columns."""
    at = unit.span(params[-1])[1]
    line_end = unit.data.find(b"\n", at)
    added = ", const uint32_t coarse_grid"
    if at - unit.line_start(at) + len(added) + (line_end - at) <= 120:
        return at, at, added
    first = unit.span(params[0])[0]
    column = first - unit.line_start(first)
    return at, at, ",\n" + " " * column + "const uint32_t coarse_grid"


def _constant_name(kernel: str) -> str:
    return "k" + "".join(part[:1].upper() + part[1:] for part in kernel.split("_") if part) + "RowsPerBlock"


def _body_edit(unit: Unit, block, rows: list, const: str) -> tuple[int, int, str]:
    """The kernel's new body: the old one in a lambda, run once per row of this CTA."""
    start, end = unit.span(block)
    inner = [(a - start, b - start, new) for a, b, new in
             [(*unit.span(n), "block_row") for n in rows]
             + [(*unit.span(n), "coarse_grid") for n in walk(block) if n.kind.name == "MEMBER_REF_EXPR"
                and re.fullmatch(r"gridDim\s*\.\s*x", unit.code(n))]]
    text = unit.data[start:end]
    for a, b, new in sorted(inner, reverse=True):
        text = text[:a] + new.encode() + text[b:]
    old = text.decode()[1:-1].strip("\n")
    indent = unit.indent(unit.span(block)[0]) or ""
    step = "  "
    lines = [(step * 2 + line) if line.strip() else "" for line in old.splitlines()]
    sync = f"{indent}{step * 2}__syncthreads();  // the next row's shared-memory writes wait for this row's reads\n"
    new = (f"{{\n{indent}{step}for (uint32_t block_row = blockIdx.x * {const};\n"
           f"{indent}{step}     block_row < (blockIdx.x + 1) * {const} && block_row < coarse_grid; ++block_row) {{\n"
           f"{indent}{step * 2}[&] {{\n" + "\n".join(lines) + f"\n{indent}{step * 2}}}();\n{sync}"
           f"{indent}{step}}}\n{indent}}}")
    return start, end, new
