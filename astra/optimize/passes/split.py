"""split: a row's thread-strided loops spread over several CTAs, the launch's grid given a second dimension.

    __global__ void scale(T* out, const T* in, int n) {     __global__ void scale(T* out, const T* in, int n) {
      const int row = blockIdx.x;                              const int row = blockIdx.x;
      for (int i = threadIdx.x; i < n;                 ->      for (int i = (threadIdx.x) + blockIdx.y * (blockDim.x);
           i += blockDim.x)                                         i < n; i += (blockDim.x) * gridDim.y)
        out[row * n + i] = 2 * in[row * n + i];                  out[row * n + i] = 2 * in[row * n + i];
    }                                                        }
    LaunchKernel(rows, 128, stream)(scale<T>, ...);          LaunchKernel(dim3(rows, split_rows(rows)), 128, ...)(...);

The pattern: one CTA per row (token), its threads walking the row with a stride of their count. With few rows
(decode: 1 to 32 tokens on 132 SMs) most SMs stand idle, and a CTA walks its whole row alone. Split, CTA
`blockIdx.y` of a row takes iterations y, y + G, y + 2G, ... of every thread's loop (G = gridDim.y): for any
start `s` and stride `S` uniform across the CTA, the iterations `s + (y + mG) S` of the G CTAs are together
exactly the original's `s + kS`. The host's helper gives each row as many CTAs as make two per SM over the
whole grid, at most MAX_SPLIT and at least one, so a grid of thousands of rows launches as before (G = 1).
In a scan of SGLang 0.5.23's kernels, 22 are one CTA per row and elementwise like this (rotary embeddings,
KV-cache stores, MoE gate activations, n-gram tables); `astra passes split` measures where this pass applies.

What makes it safe, checked on the kernel (refused otherwise, with the reason):
- threads share nothing: no shared memory, barrier, warp shuffle or vote, inline assembly, cluster or
  cooperative group, in the kernel or in a function it calls (a call this file cannot see into that looks
  like one, `reduce` or `warp` in its name, is refused too); no 2-D or 3-D grid (`blockIdx.y`, `gridDim.z`), also in
  another kernel that calls a device function whose loop the split divides (its `blockIdx.y` would be read
  as a share of the row);
- every iteration stands alone: the loop's body assigns neither its counter nor any local declared outside
  it (a sum carried across iterations would be split into partial sums), and leaves the loop by no
  `break`, `return` or `goto`; its stride and bound are the same for every thread and every iteration;
- nothing outside those loops writes memory: the rest of the body declares locals, assigns them, tests and
  returns, loops serially (the same for every thread) around thread-strided loops, and waits on or releases
  a programmatic dependent launch. Each CTA of a row runs that code alike, so nothing is written twice.
- the kernel is launched from this file only, through SGLang's `LaunchKernel(grid, block, ...)(kernel, ...)` or
  `kernel<<<grid, block, ...>>>(...)` (passes.launches), its grid a size or a `dim3` variable (whose x the
  split keeps).
"""

from __future__ import annotations

import functools
import re

from astra.optimize.passes.base import ParsedPass, Refusal
from astra.optimize.passes.launches import launch_grids, qualifier
from astra.optimize.passes.syntax import (
    LOOPS,
    Unit,
    assignment,
    bare,
    body,
    callee,
    fresh_name,
    has_asm,
    operator,
    pointer_base,
    refers_to,
    splice,
    stores,
    walk,
    written,
)

MAX_SPLIT = 8  # CTAs per row at most: a decode row of a few thousand elements has no more loop trips to share
CTAS_PER_SM = 2
_SHARING = re.compile(r"__shared__|__syncthreads|__syncwarp|__shfl|__ballot|__any_sync|__all_sync|__match|"
                      r"\bcluster|cooperative_groups|grid_group|this_grid|blockIdx\s*\.\s*[yz]|gridDim\s*\.\s*[yz]|"
                      r"__cluster_dims__|extern\s+__shared__")
_SHARING_NAME = re.compile(r"reduce|warp|shfl|sync|cluster|smem|shared|block_(sum|max|min|scan)", re.I)
_PDL = re.compile(r"pdl|GridDependency|ProgrammaticLaunch|launch_dependents|wait_primary", re.I)
_THREAD = re.compile(r"\bthreadIdx\s*\.\s*x\b")
_HARMLESS = ("assert", "__assert_fail", "__trap", "__builtin_assume", "__builtin_expect", "__builtin_unreachable")


class Split(ParsedPass):
    name = "split"
    family = "split"

    def rewrite(self, unit: Unit, spec: dict | None) -> tuple[str, str]:
        reasons: list[str] = []
        edits: list[tuple[int, int, str]] = []
        done: list[str] = []
        edited: set = set()  # loops already offset: a device function two split kernels call is edited once
        helper: tuple[object, str] | None = None  # (the kernel the helper stands before, its name)
        functions = unit.functions()
        taken = {f.spelling for f in functions}
        for kernel in unit.kernels():
            try:
                loops = _strided_loops(unit, kernel)
                launches = _launches(unit, kernel)
            except Refusal as refusal:
                reasons.append(f"{kernel.spelling}: {refusal}")
                continue
            if helper is None:
                helper = (kernel, fresh_name("split_rows", taken))
            for loop in loops:
                if loop.hash not in edited:
                    edited.add(loop.hash)
                    edits += _loop_edits(unit, loop)
            for outer, grid in launches:
                host = next((f for f in functions if unit.span(f)[0] <= unit.span(outer)[0] < unit.span(f)[1]), None)
                edits.append((*unit.span(grid), _split_grid(unit, grid, qualifier(helper[0], host) + helper[1])))
            done.append(f"{kernel.spelling} ({len(loops)} loop{'s' if len(loops) > 1 else ''})")
        if helper is None:
            raise Refusal(reasons[0] if reasons else "no __global__ kernel in the file")
        start = unit.line_start(unit.span(helper[0])[0])  # a template's extent starts at `template <...>`
        edits.append((start, start, _helper_text(helper[1])))
        return splice(unit, edits), (f"each row over up to {MAX_SPLIT} CTAs (grid.y), its thread-strided loops "
                                     f"divided among them: {', '.join(done)}")


def _helper_text(name: str) -> str:
    return (f"// CTAs each row of a split grid runs on: {CTAS_PER_SM} CTAs per SM over the whole grid, at most "
            f"{MAX_SPLIT}, at least 1\n"
            f"inline uint32_t {name}(uint32_t rows) {{\n"
            "  int device = 0, sms = 0;\n"
            "  cudaGetDevice(&device);\n"
            "  cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device);\n"
            f"  const uint32_t ctas = {CTAS_PER_SM}u * static_cast<uint32_t>(sms);\n"
            "  const uint32_t want = rows > 0 ? (ctas + rows - 1) / rows : 1u;\n"
            f"  return want < 1u ? 1u : (want > {MAX_SPLIT}u ? {MAX_SPLIT}u : want);\n"
            "}\n\n")


def _launches(unit: Unit, kernel) -> list[tuple[object, object]]:
    """[(the launch call, its grid argument)] of every launch of `kernel`, each grid a size or a dim3 variable."""
    found = launch_grids(unit, kernel, chevrons=True)
    if isinstance(found, str):
        raise Refusal(found)
    for _, grid in found:
        g = unit.code(grid)
        if not re.fullmatch(r"[\w.:]+", g.strip()) and (
                "dim3" in g or g.lstrip().startswith("{") or re.search(r"\+\+|--|[^=!<>]=[^=]|\(\s*\)", g)):
            raise Refusal(f"grid `{g}` is neither a plain 1-D size nor a dim3 variable")
    return found


def _split_grid(unit: Unit, grid, helper: str) -> str:
    """The launch's new grid: the original's x, the helper's split as y (a dim3 variable keeps its z; the kernel
    reads no blockIdx.y, so a y of the original's would only have repeated its work)."""
    g = unit.code(grid).strip()
    spelled = [n for n in walk(grid) if unit.span(n) == unit.span(grid)][-1].type.spelling  # under a conversion
    if "dim3" in spelled and re.fullmatch(r"[\w.:]+", g):
        return f"dim3({g}.x, {helper}({g}.x), {g}.z)"
    return f"dim3({g}, {helper}(static_cast<uint32_t>({g})))"


# ---------------------------------------------------------------- the kernel's loops


def _strided_loops(unit: Unit, kernel) -> list:
    """The thread-strided loops a split of `kernel` divides (in it, or in this file's device functions it calls
    as statements of their own), once every rule of the module docstring holds."""
    block = body(kernel)
    if block is None:
        raise Refusal("no body")
    if _SHARING.search(unit.code(block)) or has_asm(unit, block):
        raise Refusal("its threads share data (shared memory, barriers, shuffles, clusters or inline assembly)")
    loops: list = []
    descended: dict = {kernel.hash: kernel}
    _statements(unit, block, _thread_dependent(unit, block), loops, descended)
    for function in list(descended.values()):
        _callees_share_nothing(unit, function, descended)
    if not loops:
        raise Refusal("no loop strided by the CTA's threads (`for (i = threadIdx.x ...; i < n; i += stride)`)")
    return loops


def _callees_share_nothing(unit: Unit, function, descended: dict, depth: int = 3) -> None:
    """Refuse where a function `function` calls (three calls deep; not one the split descended into, whose
    statements were checked) shares data between threads or reads the thread's index (a loop of its own over
    the thread's index is one the split cannot see); a call into code this file cannot see is judged by its
    name, and CUDA's own intrinsics (`__`) by whether they share data."""
    seen: set = set(descended)
    pending = [(function, 0)]
    while pending:
        current, level = pending.pop()
        for node in walk(current):
            if node.kind.name != "CALL_EXPR" or node == current:
                continue
            name = callee(node)
            if name.startswith("__") or name in _HARMLESS:
                if _SHARING.search(name) or _SHARING_NAME.search(name[2:]):
                    raise Refusal(f"calls {name}, which shares data between threads")
                continue
            target = _definition(unit, node)
            if target is None or target.hash in seen:
                if target is None and name and _SHARING_NAME.search(name) and not _PDL.search(name):
                    raise Refusal(f"calls {name}, which may share data between threads")
                continue
            seen.add(target.hash)
            words = " ".join(t.spelling for t in target.get_tokens())
            if (_SHARING.search(words) or _THREAD.search(words)) and not _PDL.search(name):
                raise Refusal(f"calls {name}, which reads the thread's index or shares data between threads")
            if level + 1 < depth:
                pending.append((target, level + 1))


def _definition(unit: Unit, call):
    """The function definition a call reaches: libclang's, else (a dependent call in a template) this file's
    only function of that name; None when neither is known."""
    target = call.referenced.get_definition() if call.referenced is not None else None
    if target is not None:
        return target
    named = _functions_by_name(unit).get(callee(call), [])
    return named[0] if len(named) == 1 else None


@functools.lru_cache(maxsize=4)
def _functions_by_name(unit: Unit) -> dict[str, list]:
    """This file's function definitions by name, read once per parsed unit (every call the pass checks asks)."""
    out: dict[str, list] = {}
    for function in unit.functions():
        out.setdefault(function.spelling, []).append(function)
    return out


def _thread_dependent(unit: Unit, block) -> set:
    """The locals whose value depends on the thread's index (`threadIdx.x`, or another such local)."""
    out: set = set()
    grew = True
    while grew:
        grew = False
        for decl in [n for n in walk(block) if n.kind.name == "VAR_DECL" and n not in out]:
            init = list(decl.get_children())
            if init and (_THREAD.search(unit.code(init[-1])) or _uses(init[-1], out)):
                out.add(decl)
                grew = True
    return out


def _uses(node, decls: set) -> bool:
    return any(refers_to(n) in decls for n in walk(node) if refers_to(n) is not None)


def _statements(unit: Unit, node, thread_locals: set, loops: list, descended: dict) -> None:
    """Check the statements of `node` (a block, or one statement) against the rules for code outside the
    thread-strided loops, collecting those loops into `loops`; a call of this file's device function as a
    statement of its own is checked by the same rules, its body descended into (`descended`: by hash)."""
    node = bare(node)
    kind = node.kind.name
    where = f"line {node.extent.start.line}"
    if kind == "COMPOUND_STMT":
        for child in node.get_children():
            _statements(unit, child, thread_locals, loops, descended)
    elif kind in ("NULL_STMT", "RETURN_STMT"):
        return
    elif kind == "UNEXPOSED_STMT":  # a loop a `#pragma unroll` stands above
        for child in node.get_children():
            _statements(unit, child, thread_locals, loops, descended)
    elif kind == "DECL_STMT":
        _no_writes(unit, node, where)
    elif kind == "IF_STMT":
        children = list(node.get_children())
        _no_writes(unit, children[0], where)
        for branch in children[1:]:
            _statements(unit, branch, thread_locals, loops, descended)
    elif kind == "FOR_STMT" and _strided(unit, node, thread_locals):
        loops.append(node)
    elif kind in LOOPS:
        parts = list(node.get_children())
        inner, header = (parts[0], parts[1:]) if kind == "DO_STMT" else (parts[-1], parts[:-1])
        if any(_THREAD.search(unit.code(part)) or _uses(part, thread_locals) for part in header):
            raise Refusal(f"{where}: a loop over the thread's index of a form the pass does not divide")
        for part in header:
            _no_writes(unit, part, where, locals_ok=True)
        _statements(unit, inner, thread_locals, loops, descended)
    elif assignment(unit, node) and _local_target(unit, node):
        _no_writes(unit, list(node.get_children())[-1], where)
    elif kind == "CALL_EXPR" and (target := _own_device_function(unit, node)) is not None:
        for argument in list(node.get_children())[1:]:
            _no_writes(unit, argument, where)
        if _two_d_callers(unit, target):
            raise Refusal(f"{where}: {target.spelling} is called by a kernel that reads blockIdx.y or gridDim.y too")
        if target.hash not in descended:
            descended[target.hash] = target
            inner = body(target)
            if _SHARING.search(unit.code(inner)) or has_asm(unit, inner):
                raise Refusal(f"{where}: calls {target.spelling}, whose threads share data")
            _statements(unit, inner, _thread_dependent(unit, inner), loops, descended)
    elif kind == "CALL_EXPR" and _harmless(unit, node):
        return
    elif re.match(r"assert\s*\(", unit.code(node)):  # the macro, expanded or not
        _no_writes(unit, node, where)
    else:
        raise Refusal(f"{where}: `{_clip(unit.code(node))}` outside a thread-strided loop: each CTA of a split row "
                      "would run it")


def _two_d_callers(unit: Unit, function) -> bool:
    """Whether a kernel of this file that reads a second grid dimension calls `function` (its split loops would
    then read that kernel's `blockIdx.y` as a share of the row)."""
    name = re.compile(rf"\b{re.escape(function.spelling)}\b")
    return any(name.search(unit.code(k)) and re.search(r"\b(blockIdx|gridDim)\s*\.\s*y\b", unit.code(k))
               for k in unit.kernels())


def _own_device_function(unit: Unit, call):
    """The device function of this file (not a kernel) a call reaches, or None."""
    target = _definition(unit, call)
    if target is None or not unit.in_main(target) or body(target) is None:
        return None
    kinds = {c.kind.name for c in target.get_children()}
    return target if "CUDADEVICE_ATTR" in kinds and "CUDAGLOBAL_ATTR" not in kinds else None


def _harmless(unit: Unit, call) -> bool:
    """A call that writes no memory another CTA could see: an assertion, a programmatic dependent launch's
    wait or release, or a load into a local object (`v.load(p, i)` on a register vector)."""
    name = callee(call)
    if name in _HARMLESS or _PDL.search(name):
        return True
    head = next(call.get_children(), None)
    if head is None or head.kind.name != "MEMBER_REF_EXPR" or not re.match(r"(load|fill|zero|clear)", name):
        return False
    owner = next(head.get_children(), None)
    decl = refers_to(bare(owner)) if owner is not None else None
    return decl is not None and decl.kind.name == "VAR_DECL" and "&" not in decl.type.spelling and "*" not in (
        decl.type.spelling)


def _local_target(unit: Unit, node) -> bool:
    """Whether an assignment's target is a plain local of the kernel (not a reference into memory)."""
    target = bare(next(node.get_children()))
    decl = refers_to(target)
    return decl is not None and decl.kind.name == "VAR_DECL" and "&" not in decl.type.spelling


def _no_writes(unit: Unit, node, where: str, locals_ok: bool = False) -> None:
    """Refuse where `node` stores into memory or calls an atomic (`locals_ok`: a loop header's own counter)."""
    if stores(unit, node) or any("atomic" in callee(n).lower() for n in walk(node) if n.kind.name == "CALL_EXPR"):
        raise Refusal(f"{where}: writes memory outside a thread-strided loop: each CTA of a split row would write it")
    if not locals_ok:
        for n in walk(node):
            if assignment(unit, n) and not _local_target(unit, n):
                raise Refusal(f"{where}: writes memory outside a thread-strided loop")


def _strided(unit: Unit, loop, thread_locals: set) -> bool:
    """Whether `loop` is `for (T i = <thread-dependent>; i < <bound>; i += <stride>)` whose iterations stand
    alone (see the module docstring); a loop of that header whose body breaks a rule is refused, not skipped."""
    children = list(loop.get_children())
    if len(children) != 4 or children[0].kind.name != "DECL_STMT":
        return False
    decls = [c for c in children[0].get_children() if c.kind.name == "VAR_DECL"]
    if len(decls) != 1:
        return False
    counter, cond, step, inner = decls[0], bare(children[1]), children[2], children[3]
    init = list(counter.get_children())
    if not init or not (_THREAD.search(unit.code(init[-1])) or _uses(init[-1], thread_locals)):
        return False
    where = f"line {loop.extent.start.line}"
    if cond.kind.name != "BINARY_OPERATOR" or operator(unit, cond) != "<" or refers_to(
            bare(next(cond.get_children()))) != counter:
        return False
    if assignment(unit, step) != "+=" or refers_to(bare(next(step.get_children()))) != counter:
        return False
    stride = list(step.get_children())[-1]
    bound = list(cond.get_children())[-1]
    changed, made = written(unit, inner)
    for part, what in ((stride, "stride"), (bound, "bound")):
        if _THREAD.search(unit.code(part)) or _uses(part, thread_locals | {counter}):
            raise Refusal(f"{where}: the loop's {what} differs between threads")
        if _uses(part, changed):
            raise Refusal(f"{where}: the loop's {what} changes inside the loop")
    arrays = {_stored_into(n) for n in stores(unit, inner)}
    carried = sorted(d.spelling for d in (changed - made) | {d for d in arrays - made if d is not None and d.kind.name
                                                             == "VAR_DECL" and "[" in d.type.spelling})
    if carried:
        raise Refusal(f"{where}: the loop carries `{carried[0]}` from one iteration to the next")
    if _leaves(inner):
        raise Refusal(f"{where}: the loop can end early (break, return or goto)")
    return True


def _stored_into(store):
    """The declaration a store's target is indexed from (`acc` of `acc[j] = ...`, `p` of `*p = ...`), or None."""
    target = bare(next(store.get_children()))
    if target.kind.name in ("ARRAY_SUBSCRIPT_EXPR", "UNARY_OPERATOR"):
        return pointer_base(next(target.get_children()))
    return None


def _leaves(node, nested: bool = False) -> bool:
    """Whether `node` holds a `return` or `goto`, or a `break` of the loop itself (not of a loop or switch
    nested in it)."""
    for child in node.get_children():
        kind = child.kind.name
        if kind in ("RETURN_STMT", "GOTO_STMT") or (kind == "BREAK_STMT" and not nested):
            return True
        if _leaves(child, nested or kind in (*LOOPS, "SWITCH_STMT")):
            return True
    return False


def _loop_edits(unit: Unit, loop) -> list[tuple[int, int, str]]:
    """The start offset by this CTA's share of the row, the stride multiplied by the row's CTAs."""
    children = list(loop.get_children())
    init = list([c for c in children[0].get_children() if c.kind.name == "VAR_DECL"][0].get_children())[-1]
    stride = list(children[2].get_children())[-1]
    s = unit.code(stride)
    a, b = unit.span(init)
    c, d = unit.span(stride)
    return [(a, b, f"({unit.code(init)}) + blockIdx.y * ({s})"), (c, d, f"({s}) * gridDim.y")]


def _clip(text: str, limit: int = 60) -> str:
    text = " ".join(text.split())
    return text if len(text) <= limit else text[:limit - 3] + "..."
