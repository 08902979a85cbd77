"""Rewrite passes: general source-to-source transformations of a kernel file, read with libclang.

Where the offline agent's catalog (astra.optimize.transforms, param_space) turns knobs a kernel already
has, a pass rewrites its code: packed 16-byte loads and stores (`vectorize`), loop-invariant loads
hoisted (`reuse`), a block's shared-memory reduction done with warp shuffles (`warp_reduce`), fast
intrinsics where the spec's tolerance allows (`fast_math`), several rows per CTA (`coarsen`), a row's
thread-strided loops over several CTAs (`split`), a loop
one thread runs spread over its CTA or warp (`parallelize`), the block size every launch uses
given to ptxas as `__launch_bounds__` (`launch_bounds`), an index's division by launch arguments as a
multiply-high and a shift (`fastdiv`), a launch after another launch of the op started under programmatic
dependent launch (`pdl_chain`), an unrolled loop's loads of every iteration issued before its first store
(`batch_loads`). One pass
per module of this package; each checks its preconditions on the parsed source and refuses with a
one-line reason when they do not hold. None is assumed to be faster or even correct: every output is
built and verified like any other candidate. Passes compose: each reads whatever source it is given.

`PASSES` is the default catalog (the passes whose candidates built for at least ten SGLang modules,
docs/results/passes-0.5.23.json); `all_passes()` every pass; `catalog(headers)` the same passes parsing
with a tree's headers.
"""

from __future__ import annotations

from astra.optimize.passes.base import ParsedPass, PassResult, Refusal, RewritePass
from astra.optimize.passes.syntax import Headers

__all__ = ["DEFAULT", "PASSES", "Headers", "ParsedPass", "PassResult", "Refusal", "RewritePass", "all_passes",
           "catalog"]


def catalog(headers: Headers | None = None, names: tuple[str, ...] | None = None) -> dict[str, RewritePass]:
    """The passes named (default: every pass), parsing with `headers`."""
    from astra.optimize.passes.batch_loads import BatchLoads
    from astra.optimize.passes.coarsen import Coarsen
    from astra.optimize.passes.fast_math import FastMath
    from astra.optimize.passes.fastdiv import FastDiv
    from astra.optimize.passes.launch_bounds import LaunchBounds
    from astra.optimize.passes.parallelize import Parallelize
    from astra.optimize.passes.pdl_chain import PdlChain
    from astra.optimize.passes.reuse import Reuse
    from astra.optimize.passes.split import Split
    from astra.optimize.passes.vectorize import Vectorize
    from astra.optimize.passes.warp_reduce import WarpReduce

    every = [Vectorize, Reuse, WarpReduce, FastMath, Coarsen, Split, Parallelize, LaunchBounds, FastDiv, PdlChain,
             BatchLoads]
    return {cls.name: cls(headers) for cls in every if names is None or cls.name in names}


# The passes whose candidates built for at least ten modules of SGLang 0.5.23 (`astra passes`,
# docs/results/passes-0.5.23.json; tests/astra/optimize/passes/test_catalog.py holds the two together).
# warp_reduce and parallelize find their patterns in a few modules only: SGLang's kernels reduce with warp
# shuffles already. reuse builds for ten, most of them by copying elements of a thread's own register arrays
# out of inner loops or by a reciprocal, since SGLang's kernels already hoist their global loads. split builds
# for twelve: one-CTA-per-row kernels whose rows are elementwise (rotary embeddings, activations, n-gram tables).
# fastdiv builds for ten: kernels that split a flat index into coordinates by run-time sizes (rotary embeddings
# of diffusion models, channel norms, MLA concatenations, MoE routing maps, n-gram and Mamba state tables).
# pdl_chain builds for seven: most ops launch one kernel, and SGLang chains its own multi-kernel ops by hand.
# batch_loads builds for four: most of SGLang's unrolled loops either load into register arrays first already or
# are not counted to a constant.
DEFAULT = ("fast_math", "coarsen", "launch_bounds", "vectorize", "reuse", "split", "fastdiv")


def all_passes() -> dict[str, RewritePass]:
    """Every pass, in the catalog or not."""
    return catalog()


PASSES: dict[str, RewritePass] = catalog(names=DEFAULT)
