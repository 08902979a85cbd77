"""launch_bounds: a kernel always launched with one compile-time block size says so to ptxas.

    constexpr uint32_t kBlockSize = 256;                 constexpr uint32_t kBlockSize = 256;
    template <typename T>                                template <typename T>
    __global__ void scale(T* p) { ... }          ->      __global__ void __launch_bounds__(256) scale(T* p) { ... }
    LaunchKernel(grid, kBlockSize, stream)(scale<T>, p); LaunchKernel(grid, kBlockSize, stream)(scale<T>, p);

Without a bound, ptxas allocates registers for any block of up to 1024 threads; with one it may give each
thread more (fewer spills) or fit more CTAs per SM. A launch with more threads than the bound fails, so
the bound is added only where every launch of the kernel in the file is readable and uses one block size
known at compile time (passes.block_size reads it):
- the launches are SGLang's `LaunchKernel(grid, block, ...)(kernel, ...)`, the kernel named directly or
  through a variable initialised with it (passes.launches); occupancy queries that take a block size
  (`get_blocks_per_sm`, `cudaOccupancyMaxActiveBlocksPerMultiprocessor`) count as launches;
- a block size is an integer literal, a `const`/`constexpr` variable (local, namespace or class member)
  whose initialiser is one, arithmetic (`+ - * / % << >>`) and casts of those, or a `dim3` of such
  extents (the bound is their product). Where every launch gives one number the bound is that number;
  where the size rests on a template parameter of the launching code, the bound is written in the
  kernel's template parameters bound at each launch to the same value (`k<T, kThreads>` launched with
  `kThreads` threads gets `__launch_bounds__(kThreadsOfTheKernel)`), and every launch must give the
  same expression.
Refused: a run-time block size, a reference to the kernel other than launches and queries, a query
that chooses the block size (`cudaOccupancyMaxPotentialBlockSize`), launches that disagree, a bound
outside 1..1024, a kernel that already has `__launch_bounds__` or `__maxnreg__` or is declared twice.
Results do not change; only the registers a thread may use and ptxas's choices do.
"""

from __future__ import annotations

from astra.optimize.passes.base import ParsedPass, Refusal
from astra.optimize.passes.block_size import launch_block
from astra.optimize.passes.syntax import Unit


class LaunchBounds(ParsedPass):
    name = "launch_bounds"
    family = "launch"

    def rewrite(self, unit: Unit, spec: dict | None) -> tuple[str, str]:
        sites = [(kernel.spelling, kernel, lambda kernel=kernel: _edit(unit, kernel)) for kernel in unit.kernels()]
        return self.rewrite_each(unit, sites, "__launch_bounds__ of the one block size every launch uses",
                                 "no __global__ kernel in the file", every_reason=True)


def _edit(unit: Unit, kernel) -> tuple[int, int, str, str]:
    bound = launch_block(unit, kernel)
    if bound.startswith("!"):
        raise Refusal(bound[1:])
    at = kernel.location.offset
    return at, at, f"__launch_bounds__({bound}) ", bound
