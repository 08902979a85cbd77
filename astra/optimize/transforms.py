"""Source transformations for the offline search agent, located in the kernel file by parsing.

Each transformation proposes whole-file variants (`Proposal`s) of the kernel source; none is assumed
to help or even to be correct: every proposal is built and verified by the harness like any other
candidate. The catalog covers the knobs that decide memory-bound kernels on Hopper: launch shape
(threads, vector width, tile constants), `__launch_bounds__`, unrolling, `__restrict__` aliasing
information, and an earlier PDL trigger where the kernel already uses programmatic dependent launch.
Fast-math intrinsics, packed loads and the other rewrites of code come from the rewrite passes
(astra.optimize.passes), which the offline agent proposes alongside this catalog.

Locations come from libclang's view of the file (the `__global__` kernels and their parameters,
through astra.cuda_parse) where the edit depends on C++ structure, and from token-level patterns
where it is purely lexical (a `constexpr` integer constant, a `for` statement, a math call).
"""

from __future__ import annotations

import re

from astra.cxx import decls
from astra.cxx.text import blank
from astra.optimize.loop import Proposal

# Integer compile-time constants that shape a launch or a tile (names as SGLang's kernels spell them).
_TUNABLE = re.compile(
    r"(?P<head>\b(?:static\s+)?(?:inline\s+)?constexpr\s+(?:auto|int|uint32_t|int32_t|int64_t|size_t|unsigned)\s+"
    r"(?P<name>k\w*(?:Threads|ThreadNum|BlockSize|BlockDim|NumWarps|Warps|VecSize|Vec|Unroll|Tile\w*|ItemsPerThread|"
    r"RowsPerBlock|LoopCount|Stages)\w*)\s*=\s*)(?P<value>\d+)(?P<tail>[uUlL]*\s*;)")
_FOR = re.compile(r"^(?P<indent>[ \t]*)for\s*\(", re.M)
_PRAGMA_BEFORE = re.compile(r"#pragma\s+unroll[^\n]*\n[ \t]*$")


def tunable_constants(text: str) -> list[Proposal]:
    """Halve and double each launch/tile constant that is a power of two (kept within 1..1024)."""
    out = []
    for m in _TUNABLE.finditer(text):
        value = int(m.group("value"))
        if value <= 0 or value & (value - 1):
            continue
        for new in (value * 2, value // 2):
            if not 1 <= new <= 1024 or new == value:
                continue
            source = text[: m.start("value")] + str(new) + text[m.end("value"):]
            out.append(Proposal(f"const:{m.group('name')}={new}", "launch",
                                f"{m.group('name')} {value} -> {new} (launch/tile shape)", source))
    return out


def unroll_loops(text: str) -> list[Proposal]:
    """Add `#pragma unroll` before device-side `for` loops that have none (one proposal per loop)."""
    out = []
    for i, m in enumerate(_FOR.finditer(text)):
        before = text[: m.start()]
        if _PRAGMA_BEFORE.search(before) or not _in_device_code(text, m.start()):
            continue
        line = text.count("\n", 0, m.start()) + 1
        source = before + f"{m.group('indent')}#pragma unroll\n" + text[m.start():]
        out.append(Proposal(f"unroll:line{line}", "unroll", f"#pragma unroll on the loop at line {line}", source))
    return out


def _in_device_code(text: str, pos: int) -> bool:
    """Whether `pos` lies in a function marked __device__ or __global__ (nearest enclosing signature)."""
    head = text[:pos]
    sig = max(head.rfind("__global__"), head.rfind("__device__"))
    host = max(head.rfind("static void run"), head.rfind("__host__ "))
    return sig > host


def restrict_pointers(text: str, kernels: list) -> list[Proposal]:
    """Mark every raw pointer parameter of each `__global__` kernel `__restrict__` (a single proposal):
    the compiler may then use the read-only path and reorder loads. Wrong if the caller aliases them
    (an in-place kernel): the harness's in-place cases catch that."""
    source = text
    changed = []
    for kernel in kernels:
        for param in kernel.params:  # clang spells `__restrict__` as `__restrict`
            if "*" in param.type and "__restrict" not in param.type and param.name:
                begin, end = _signature(source, kernel)
                pattern = re.compile(r"(\*)(\s*)(" + re.escape(param.name) + r")\b(?=\s*[,)])")
                head, n = pattern.subn(r"\1 __restrict__ \3", source[begin:end], count=1)
                if n:
                    source = source[:begin] + head + source[end:]
                    changed.append(f"{kernel.name}.{param.name}")
    if not changed:
        return []
    return [Proposal("restrict:all", "restrict", f"__restrict__ on {', '.join(changed[:6])}"
                     + (" ..." if len(changed) > 6 else ""), source)]


def _signature(text: str, kernel) -> tuple[int, int]:
    """The offsets of a kernel's declaration up to its body's `{` (from its first line), where its parameters
    are named; nothing of its body (`(*scale)` there is an expression, not a parameter)."""
    lines = text.splitlines(keepends=True)
    begin = sum(len(line) for line in lines[:max(kernel.start_line - 1, 0)])
    named = text.find(kernel.name, begin)
    brace = text.find("{", named if named >= 0 else begin)
    return begin, brace if brace >= 0 else len(text)


def launch_bounds(text: str, kernels: list) -> list[Proposal]:
    """`__launch_bounds__(N)` for N in 256, 512, 1024 on kernels that declare none. It is a hint for
    register allocation; a launch with more than N threads fails loudly, which the harness turns
    into a verdict, so a wrong N costs one rejected candidate and never a silent error."""
    out = []
    for n in (256, 512, 1024):
        source, count = re.subn(r"__global__(\s+)void\s+(?!__launch_bounds__)",
                                f"__global__\\1void __launch_bounds__({n}) ", text)
        if count:
            out.append(Proposal(f"bounds:{n}", "bounds", f"__launch_bounds__({n}) on {count} kernel(s)", source))
    return out if any(k for k in kernels) else []


_PDL_WAIT = re.compile(r"^[ \t]*(?:[\w:]+::)?(?:PDLWaitPrimary\s*<[^<>;]*>\s*\(\s*\)|"
                       r"cudaGridDependencySynchronize\s*\(\s*\))\s*;[ \t]*\n", re.M)
_PDL_TRIGGER = re.compile(r"^[ \t]*(?P<call>(?:[\w:]+::)?(?:PDLTriggerSecondary\s*<[^<>;]*>\s*\(\s*\)|"
                          r"cudaTriggerProgrammaticLaunchCompletion\s*\(\s*\)))\s*;[ \t]*\n", re.M)


def early_pdl_trigger(text: str) -> list[Proposal]:
    """In each `__global__` kernel that already waits for its primary (PDLWaitPrimary /
    cudaGridDependencySynchronize) and triggers its dependents later, trigger right after the wait
    instead (one proposal per kernel). The trigger only lets the next kernel in the stream launch; its
    own wait still orders memory on our completion, so the move is safe (SGLang's utils.cuh says as
    much) and buys the dependent a head start: launch latency hidden on small, decode-sized grids."""
    code = blank(text)
    out = []
    for chunk in decls.chunks(text):
        body = code[chunk.start:chunk.end]
        wait = _PDL_WAIT.search(body)
        triggers = list(_PDL_TRIGGER.finditer(body))
        if "__global__" not in body or wait is None or not triggers or triggers[0].start() < wait.end():
            continue
        if not all(_statement_starts(body, m.start()) for m in [wait, *triggers]):
            continue  # `if (x)` on the line before: removing or moving the call would change what it guards
        if body[wait.end():triggers[0].start()].strip() == "":
            continue  # already right after the wait
        at = chunk.start + wait.end()
        indent = re.match(r"[ \t]*", text[chunk.start + wait.start():]).group()
        call = re.sub(r"\s+", "", triggers[0].group("call"))
        edits = [(chunk.start + m.start(), chunk.start + m.end(), "") for m in triggers]
        edits.append((at, at, f"{indent}{call};  // trigger the dependent launch early: its wait orders memory\n"))
        source = text
        for start, end, new in sorted(edits, key=lambda e: (e[0], e[1]), reverse=True):
            source = source[:start] + new + source[end:]
        line = text.count("\n", 0, chunk.start) + 1
        out.append(Proposal(f"pdl:early-trigger:{chunk.name}", "pdl",
                            f"{chunk.name} (line {line}): PDL trigger moved up to just after its wait "
                            f"({len(triggers)} later trigger(s) removed)", source))
    return out


def _statement_starts(code: str, pos: int) -> bool:
    """Whether a statement starts at `pos` (the code before it ends one: `;`, `{` or `}`)."""
    before = code[:pos].rstrip()
    return not before or before[-1] in ";{}"


def rematerialize(text: str) -> list[Proposal]:
    """Per-thread arrays that only copy read-only memory, read from that memory instead (astra.optimize.remat):
    one proposal per array, and one for all of them when there are several."""
    from astra.optimize import remat

    found = remat.find(text)
    out = [Proposal(f"remat:{r.array}", "remat", f"per-thread copy {r.array}[] (line {r.line}) dropped: its reads load "
                    f"{r.src}[] directly (no registers or spills for the copy; only the elements read are loaded)",
                    r.source) for r in found]
    if len(found) > 1:
        source = text
        for _ in found:  # each pass removes one array; offsets change, so find again
            again = remat.find(source)
            if not again:
                break
            source = again[0].source
        out.append(Proposal("remat:all", "remat", "per-thread copies " + ", ".join(f"{r.array}[]" for r in found)
                            + " dropped: their reads load the source directly", source))
    return out


def catalog(text: str, kernels: list) -> list[Proposal]:
    """Every proposal for this source, in a fixed order (largest expected effect first)."""
    proposals = (rematerialize(text) + tunable_constants(text) + early_pdl_trigger(text) + restrict_pointers(text, kernels)
                 + launch_bounds(text, kernels) + unroll_loops(text))
    seen, unique = set(), []
    for p in proposals:
        if p.source != text and p.source not in seen:
            seen.add(p.source)
            unique.append(p)
    return unique
