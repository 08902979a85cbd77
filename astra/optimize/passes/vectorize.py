"""vectorize: an element-wise loop over contiguous elements reads and writes 16 bytes at a time.

    for (int i = threadIdx.x; i < n; i += blockDim.x) {
      out[row * n + i] = f(in[row * n + i]);
    }
becomes, when both `&out[row * n]` and `&in[row * n]` are 16-byte aligned at run time, a loop over packs
of `kPack = 16 / sizeof(T)` elements (each pack loaded with one `uint4` load into an `alignas(16)`
array, the body run on each element, the written pack stored with one `uint4` store), then the scalar
loop over the tail the packs leave; otherwise the original loop, unchanged.

Applies to a `for` loop in a `__global__` or `__device__` function when:
- it is `for (T i = S; i < N; i += D)` with S = `off + P`: P the thread's place in the stride D
  (`threadIdx.x`, `threadIdx.x % W`, `blockIdx.x * blockDim.x + threadIdx.x`, or a local initialised
  with one), `off` anything else, D free of `i`; or `for (T i = S; i < N; ++i)` from any S (one thread
  walks the range). The packs cover [off, N) in the same layout: thread P takes packs P, P + D, ... as
  it took elements, and `off < N` joins the run-time check. That covers the same elements only where
  the places are every residue of D: so D is `blockDim.x` for `threadIdx.x` (or the compile-time number
  every launch of the kernel in the file gives as its 1-D block), `blockDim.x * gridDim.x` for the
  grid's index (a lane's place is refused), the loop is in a `__global__` kernel, and no
  condition or earlier jump its CTA's threads (for the grid's index, its CTAs) may disagree on keeps a
  thread from it;
- `i` appears only as the index of accesses `b[i]`, `b[B + i]` or `b[i + B]`, or through a `const`
  local of the body that renames it (`const int idx = row_offset + i;`, used only as such an index,
  and left out of the packed body), with one offset B per base, B and N and D unchanged in the loop;
  or as a value in arithmetic that a statement of the body stores through such an access
  (`out[i] = (i < n) ? i : -1;`: no call, load, local or pointer takes it), where the variable's type is
  spelled out: the packed body declares `i` as each element's own index;
- each indexed base `b` is a pointer that stays the same through the loop: a pointer variable, a
  pointer member of a struct (`params.x`, `p->x`) or an offset from one (`(p + k)`), none of its
  names declared or assigned in the loop and no struct member assigned there; a base that loads or
  calls (`rows[r][i]`), a register array or a vector's elements is refused;
- the elements are all of one type (`const` aside; not `void`), or of several types whose sizes
  libclang knows (not a template's `T`): then a pack is `kPack = 16 / sizeof(widest)` elements and
  each base moves its own `kPack * sizeof` bytes (16, 8, 4 or 2) in one access, its alignment checked
  against that width; an element of 16 bytes or more (or one whose size does not divide 16) is left;
- of a base written in the loop and any other base, one is a `__restrict__` parameter and the other is
  made of other parameters (or their members) alone; else they may overlap, and the packs reorder
  their accesses;
- a base written in the loop is written by a statement of the loop's body itself (not under a
  condition: the whole pack is stored), with a built-in assignment or a class's (`q[i] = x` on
  `__nv_bfloat16`): a defaulted copy or move writes the whole element, a class's own `operator=` may keep
  some of its bytes, so that base's pack is loaded before the body runs; no element is given to a call
  by non-`const` reference, has its address taken, or has a field or non-`const` method used;
- the body writes nothing but the elements it packs, the locals it declares (register arrays and struct
  fields included) and accumulators, and has no `break`, `continue`, `return`, barrier, atomic, inline
  assembly or lambda. An accumulator is a scalar local of the function, of an integer or floating type
  (not `__shared__`, `static`, a parameter, pointer, array, reference or class; its address never taken
  nor bound to a reference), that one statement of the body's own (not under a condition) updates as
  `x += e;`, `x -= e;`, `x *= e;`, `x = x + e;` (`x = e + x`, `x = x - e`, `x = x * e`, `x = e * x`) or
  `x = fmaxf(x, e);` (`fminf`, `fmax`, `fmin`, `max`, `min`, either order), `e` reading no accumulator and
  `x` read nowhere else in the loop: the per-thread partial of a block reduction (`sum += v * v;` of an
  RMS norm, `amax = fmaxf(amax, fabsf(v));` of a quantization scale).
  In a strided loop packs give each thread other elements, so a thread's partial changes: only the
  CTA's combination of the partials is the same. So the loop is a CTA's (`threadIdx.x`; the grid's index
  is refused: a combination over CTAs is not proven), the accumulator is declared inside every loop around
  it, and its first read after the loop is the argument of a call every thread of the CTA reaches that
  combines it over the CTA with its own kind: a call named a block reduction of it (`block` or `cta`,
  `reduce`, and `sum`/`add`, `max` or `min`: `sum = blockReduceSum(sum)`, `cta::reduce_max(m, smem)`; the
  name is trusted), or `atomicAdd`/`atomicMax`/`atomicMin` into a target made of `__shared__` variables,
  parameters and `blockIdx` alone. A serial loop (`++i`) keeps its elements on one thread.
The element order each thread visits changes (pack by pack), which an element-wise body cannot see. An
accumulator sees it only through the order of its updates: each thread still takes each of its elements
once and the threads together every element, so what the CTA's combination gathers is the same set, in
another grouping. That leaves an integer updated with integers (+, -, *, max and min wrap or
compare the same in any order) and a float by fmaxf/fminf/fmax/fmin (IEEE maxNum/minNum: order-free, NaNs
ignored) exact; a float sum or product rounds differently, and a float `max`/`min` that may not be IEEE's
may keep another NaN, so those ask the spec (`base.tolerated`, fast_math's rule: refused for a spec that
compares outputs exactly; without a spec the harness's tolerance decides), except in a serial loop
(`++i`), which visits its elements in the same order packed. An integer updated with a non-integer value
is refused (each step rounds).
"""

from __future__ import annotations

import re
from typing import Iterator

from astra.optimize.passes.base import ParsedPass, Refusal, Site, tolerated
from astra.optimize.passes.block_size import extents as block_extents
from astra.optimize.passes.block_size import launch_block as launch_bound
from astra.optimize.passes.block_size import value as block_value
from astra.optimize.passes.launches import QUERIES, uses
from astra.optimize.passes.syntax import (
    Unit,
    assignment,
    attrs,
    bare,
    body,
    callee,
    fresh_name,
    has_asm,
    operator,
    own_statement,
    parents,
    pointee,
    pointer_stem,
    pragmas_above,
    refers_to,
    stepped,
    walk,
    written,
)
from astra.optimize.passes.threads import Threads

_SYNC = ("__syncthreads", "__syncwarp", "__threadfence")


class Vectorize(ParsedPass):
    name = "vectorize"
    family = "vectorize"

    def rewrite(self, unit: Unit, spec: dict | None) -> tuple[str, str]:
        return self.rewrite_each(unit, _loops(unit, spec), "16-byte packed loads/stores with a scalar fallback",
                                 "no for loop in device code")


def _loops(unit: Unit, spec: dict | None) -> Iterator[Site]:
    """Every `for` loop of the file's device code, outermost first."""
    for function in unit.device_functions():
        if body(function) is None:
            continue
        up = parents(function)
        taken = {t.spelling for t in function.get_tokens() if t.kind.name == "IDENTIFIER"}
        for loop in [n for n in walk(body(function)) if n.kind.name == "FOR_STMT" and unit.in_main(n)]:
            yield (f"{function.spelling} line {unit.line_of(unit.span(loop)[0])}", loop,
                   lambda loop=loop, up=up, taken=taken, function=function: _vectorize(
                       unit, function, loop, up, taken, spec))


class _Access:
    """One indexed base: a pointer variable, or a loop-invariant pointer expression (`params.x`, `(p + k)`)
    named by its text."""

    def __init__(self, base, text: str, offset: str, element: str, size: int):
        self.base, self.text, self.offset, self.element, self.size = base, text, offset, element, size
        self.read = self.write = False
        self.nodes: list = []

    @property
    def stem(self) -> str:
        words = re.findall(r"[A-Za-z_]\w*", self.text)
        return pointer_stem(words[-1]) if words else "p"


def _vectorize(unit: Unit, function, loop, up: dict, taken: set, spec: dict | None) -> tuple[int, int, str, str]:
    if not own_statement(unit, loop, up):
        raise Refusal("the loop is not a statement of its own")
    children = list(loop.get_children())
    if len(children) != 4:
        raise Refusal("not a `for (init; cond; step)` loop")
    init, cond, step, loop_body = children
    var, first = _induction(unit, init)
    bound = _bound(unit, cond, var)
    stride = _stride(unit, step, var)
    off, place = _split_start(unit, first, stride, up)
    if place != "0":
        _every_place(unit, function, loop, first, step, up)
    outside = _check_body(unit, loop_body, loop)
    accumulators = _accumulators(unit, function, loop_body, outside, up)
    note = ""
    if accumulators and place != "0":
        cta = _plain(_origin(unit, _place_node(unit, first))) == "threadIdx.x"
        for decl, (_, op) in accumulators.items():
            _combined(unit, function, loop, decl, op, cta, up)
    ordered = [(d, what) for d, (what, _) in accumulators.items() if what]
    if ordered and place != "0":  # a serial loop keeps its order: packs in turn, elements in turn, the tail
        decl, what = ordered[0]
        ok, why = tolerated(spec, "regrouping it")
        if not ok:
            how = ("whose rounding depends on which elements each thread takes" if what in ("sum", "product")
                   else f"through `{what}`, not fmaxf/fminf (its NaNs may depend on the order)")
            raise Refusal(f"{decl.spelling} accumulates a float {_WHAT.get(what, what)}, {how}: {why}")
        note = f"the float {what} into {decl.spelling} regrouped: {why}"
    aliases = _aliases(unit, loop_body, var, up)
    accesses, valued = _accesses(unit, loop_body, var, aliases, up, bool(accumulators))
    if valued and ("auto" in var.type.spelling or "dependent" in var.type.spelling):
        raise Refusal(f"{var.spelling} is used as a value and its type is deduced")
    sizes = {a.element: a.size for a in accesses.values()}
    if len(sizes) > 1 and not all(sizes.values()):
        unknown = sorted(e for e, size in sizes.items() if not size)
        raise Refusal(f"pointers of different element types, {unknown[0]} of a size unknown before instantiation")
    _own_writes(unit, loop_body, accesses, accumulators)
    _apart(unit, loop_body, accesses)
    return (*_emit(unit, loop, loop_body, var, (first, off, place, valued), bound, stride, accesses, aliases, taken),
            note)


def _own_writes(unit: Unit, loop_body, accesses: dict, accumulators: dict) -> None:
    """Refuses a body that writes anything but the elements it packs, its accumulators and the locals
    (register arrays, struct fields) it declares itself: a store to other memory or an element of an outer
    array or struct (`s[0] += x[i]`, `last[threadIdx.x] = x[i]`) accumulates or keeps the last value, and
    packs change which elements a thread sees last."""
    packed = {n for a in accesses.values() for n in a.nodes}
    _, made = written(unit, loop_body)
    for node in walk(loop_body):
        target = bare(next(node.get_children())) if assignment(unit, node) else stepped(unit, node)
        if target is None or target in packed or refers_to(target) in accumulators:
            continue
        base = target
        while base.kind.name in ("MEMBER_REF_EXPR", "ARRAY_SUBSCRIPT_EXPR") and "*" not in next(
                base.get_children()).type.spelling and "->" not in unit.code(base):
            base = bare(next(base.get_children()))
        if refers_to(base) not in made:
            text = re.sub(r"\s+", " ", unit.code(target)).strip()
            raise Refusal(f"the body writes {text}, neither an "
                          "element it packs nor a local of its own (packs change which elements a thread sees last)")


def _apart(unit: Unit, loop_body, accesses: dict) -> None:
    """Refuses a written base and other memory the body reaches that may overlap: a pack's loads run
    before the stores of the elements before them, and its stores after the loads after them (`out = in
    + 1` in a serial loop carries each element on; packed, it does not). Apart are a `__restrict__`
    parameter and a base made of other parameters (or their members) alone (memory reached through a
    restrict pointer is reached through nothing not derived from it), and a base of parameters and a
    local array. The other memory: every other indexed base, every other element or `*p` read, and no
    call given a pointer."""
    packed = {n for a in accesses.values() for n in a.nodes}
    others = [(a.text, a.base) for a in accesses.values()]
    for node in walk(loop_body):
        kind = node.kind.name
        if kind == "CALL_EXPR" and any(_pointer_like(a, packed) for a in node.get_arguments()):
            raise Refusal(f"the body gives {callee(node) or 'a call'} a pointer (it may reach the packed memory)")
        if (kind == "ARRAY_SUBSCRIPT_EXPR" and node not in packed) or (
                kind == "UNARY_OPERATOR" and operator(unit, node) == "*"):
            base = bare(next(node.get_children()))
            others.append((re.sub(r"\s+", " ", unit.code(base)).strip(), base))
    for stored in [a for a in accesses.values() if a.write]:
        for text, base in others:
            if text == stored.text:
                continue
            local_array = "[" in base.type.spelling and refers_to(base) is not None and (
                refers_to(base).kind.name == "VAR_DECL")
            if not (_restricts(stored.base, base) or _restricts(base, stored.base) or (
                    local_array and _parameters_only(stored.base, None))):
                raise Refusal(f"{stored.text} and {text} may overlap (neither a `__restrict__` parameter "
                              "apart from the other): packs reorder their accesses")


def _pointer_like(arg, packed: set) -> bool:
    """Whether a call's argument is a pointer or an array, or, where a template leaves its type open, names
    a pointer (a packed element of such a type is no pointer)."""
    spelled = arg.type.spelling
    if "*" in spelled or "[" in spelled:
        return True
    if "dependent" not in spelled and spelled:
        return False
    if bare(arg) in packed:
        return False
    return any(refers_to(n) is not None and "*" in refers_to(n).type.spelling for n in walk(arg))


def _restricts(base, other) -> bool:
    """Whether `base` is a `__restrict__` parameter and `other` reads parameters (or their members) only,
    not that one."""
    target = refers_to(bare(base))
    if target is None or target.kind.name != "PARM_DECL" or not target.type.is_restrict_qualified():
        return False
    return _parameters_only(other, target)


def _parameters_only(expr, but) -> bool:
    """Whether an expression names parameters (and their members) alone, `but` not among them."""
    named = [refers_to(n) for n in walk(expr) if refers_to(n) is not None
             and refers_to(n).kind.name not in ("FIELD_DECL", "CXX_METHOD")]
    return bool(named) and all(r.kind.name == "PARM_DECL" and r != but for r in named)


def _induction(unit: Unit, init):
    decls = [n for n in walk(init) if n.kind.name == "VAR_DECL"]
    if init.kind.name != "DECL_STMT" or len(decls) != 1:
        raise Refusal("the loop does not declare one variable")
    var = decls[0]
    value = [c for c in var.get_children() if c.kind.name not in ("TYPE_REF", "NAMESPACE_REF")]
    if not value:
        raise Refusal("the loop variable has no initial value")
    return var, value[-1]


_PLACE = re.compile(r"threadIdx\.x(?:\s*[%&]\s*\w+)?|blockIdx\.x\s*\*\s*blockDim\.x\s*\+\s*threadIdx\.x|"
                    r"threadIdx\.x\s*\+\s*blockIdx\.x\s*\*\s*blockDim\.x")


def _split_start(unit: Unit, first, stride: str, up: dict) -> tuple[str, str]:
    """(offset, thread's place) of the loop's start: `off + threadIdx.x` is ("off", "threadIdx.x"), a
    serial loop from `start` is ("start", "0"); refused when the start is neither."""
    if stride == "1":
        text = unit.code(first).strip()
        return ("" if text == "0" else text), "0"
    if _is_place(unit, first):
        return "", unit.code(first).strip()
    node = bare(first)
    if node.kind.name == "BINARY_OPERATOR" and operator(unit, node) == "+":
        lhs, rhs = list(node.get_children())
        for place, off in ((lhs, rhs), (rhs, lhs)):
            if _is_place(unit, place) and "threadIdx" not in unit.code(off):
                return unit.code(off).strip(), unit.code(place).strip()
    raise Refusal(f"the loop does not start at the thread's place in its stride (starts at {unit.code(first)})")


def _every_place(unit: Unit, function, loop, first, step, up: dict) -> None:
    """Refuses a strided loop unless its threads' places are every residue of its stride: thread P then
    takes packs P, P + D, ... and the packs cover the elements the threads covered. So the stride is the
    number of places (`blockDim.x` for `threadIdx.x`, `blockDim.x * gridDim.x` for the grid's index), and
    every thread of the CTA reaches the loop: a `__global__` kernel, no condition or earlier jump the
    threads may disagree on around it (a loop under `if (threadIdx.x >= 64)` covers other elements per
    pack than per element), and, for the grid's index, none its CTAs may disagree on."""
    place = _plain(_origin(unit, _place_node(unit, first)))
    stride = _plain(_origin(unit, list(bare(step).get_children())[1]))
    wanted = {"threadIdx.x": ("blockDim.x",),
              "blockIdx.x*blockDim.x+threadIdx.x": ("blockDim.x*gridDim.x", "gridDim.x*blockDim.x"),
              "threadIdx.x+blockIdx.x*blockDim.x": ("blockDim.x*gridDim.x", "gridDim.x*blockDim.x")}
    if place not in wanted:
        raise Refusal(f"a lane's place (`{place}`): the block may hold fewer threads than the stride")
    if stride not in wanted[place] and not (place == "threadIdx.x" and _launched_with(
            unit, function, list(bare(step).get_children())[1])):
        raise Refusal(f"the stride `{stride}` is not known to be the number of places (`{wanted[place][0]}`, or "
                      "the one 1-D block size of every launch in the file)")
    why = Threads(unit, function).converged(loop, warp=False)
    if why:
        raise Refusal(f"not every thread of the CTA reaches the loop: {why}")
    if place != "threadIdx.x":
        start = unit.span(loop)[0]
        node = loop
        while node in up:
            node = up[node]
            head = [c for c in node.get_children() if unit.span(c)[0] < start and c.kind.name != "COMPOUND_STMT"]
            if node.kind.name != "COMPOUND_STMT" and any("blockIdx" in unit.code(c) for c in head):
                raise Refusal("the loop is under a condition on blockIdx: not every CTA takes its packs")
        if any(n.kind.name == "RETURN_STMT" and unit.span(n)[0] < start for n in walk(body(function))):
            raise Refusal("a return before the loop: not every CTA may take its packs")


def _launched_with(unit: Unit, kernel, stride) -> bool:
    """Whether every launch of the kernel in this file (and every occupancy query on it, passes.launches)
    gives the stride as its block, 1-D (or a `dim3` whose other extents are 1): the same compile-time
    number, or the same expression in the kernel's template parameters (`kWarps * 32` launched as
    `k<kWarps>` with `kWarps * 32` threads: passes.launch_bounds reads it)."""
    found = uses(unit, kernel)
    if isinstance(found, str) or not any(not use.query for use in found):
        return False
    want = block_value(unit, stride)
    xs = []
    for use in found:
        at = QUERIES[use.query] if use.query else 1
        if at is None:
            continue  # an attribute query: no block
        if len(use.args) <= at:
            return False
        extents = block_extents(use.args[at]) or [use.args[at]]
        if not extents or any(block_value(unit, e) != 1 for e in extents[1:]):
            return False
        xs.append(extents[0])
    if want is not None:
        return all(block_value(unit, x) == want for x in xs)
    bound = launch_bound(unit, kernel)
    return not bound.startswith("!") and _plain(bound) == _plain(unit.code(stride))


def _place_node(unit: Unit, first):
    """The thread's place in the loop's start (`threadIdx.x` of `off + threadIdx.x`)."""
    if _is_place(unit, first):
        return first
    lhs, rhs = list(bare(first).get_children())
    return lhs if _is_place(unit, lhs) else rhs


def _plain(text: str) -> str:
    """An index expression's text without casts, parentheses or spaces."""
    text = re.sub(r"static_cast<[^<>]*>|\(\s*(?:int|unsigned|uint32_t|int32_t|int64_t|size_t)\s*\)", "", text)
    return re.sub(r"[()\s]", "", text)


def _is_place(unit: Unit, node) -> bool:
    text = re.sub(r"static_cast<[^<>]*>|\(\s*(?:int|unsigned|uint32_t|int32_t|int64_t|size_t)\s*\)", "",
                  _origin(unit, node))
    text = re.sub(r"[()]", "", text).strip()
    return _PLACE.fullmatch(re.sub(r"\s+", " ", text)) is not None


def _origin(unit: Unit, first) -> str:
    """The start's text, through a local it names (`tid` of `const int tid = threadIdx.x;`)."""
    target = refers_to(bare(first))
    if target is not None and target.kind.name == "VAR_DECL":
        value = [c for c in target.get_children() if c.kind.name not in ("TYPE_REF", "NAMESPACE_REF")]
        if value:
            return re.sub(r"\s+", " ", unit.code(bare(value[-1]))).strip()
    return re.sub(r"\s+", " ", unit.code(bare(first))).strip()


def _bound(unit: Unit, cond, var) -> str:
    cond = bare(cond)
    if cond.kind.name != "BINARY_OPERATOR" or operator(unit, cond) != "<":
        raise Refusal("the loop condition is not `i < N`")
    lhs, rhs = list(cond.get_children())
    if refers_to(bare(lhs)) != var or any(refers_to(n) == var for n in walk(rhs)):
        raise Refusal("the loop condition is not `i < N`")
    return unit.code(rhs)


def _stride(unit: Unit, step, var) -> str:
    step = bare(step)
    if step.kind.name == "UNARY_OPERATOR" and operator(unit, step) == "++":
        return "1"
    if step.kind.name == "COMPOUND_ASSIGNMENT_OPERATOR" and operator(unit, step) == "+=":
        lhs, rhs = list(step.get_children())
        if refers_to(bare(lhs)) == var and not any(refers_to(n) == var for n in walk(rhs)):
            return unit.code(rhs)
    raise Refusal("the loop step is not `i += D` or `++i`")


def _check_body(unit: Unit, loop_body, loop) -> list:
    """Refuses a body that jumps, loops, synchronises or uses atomics or inline assembly; returns the
    variables declared outside the loop that it writes (each must be an accumulator: `_accumulators`)."""
    kinds = {n.kind.name for n in walk(loop_body)}
    if kinds & {"BREAK_STMT", "CONTINUE_STMT", "RETURN_STMT", "GOTO_STMT", "LAMBDA_EXPR", "FOR_STMT", "WHILE_STMT",
                "DO_STMT"}:
        raise Refusal("the body breaks, continues, returns, loops or holds a lambda")
    names = [callee(n) for n in walk(loop_body) if n.kind.name == "CALL_EXPR"]
    if has_asm(unit, loop_body) or any(n.startswith(("atomic", "__sync", "__threadfence")) or n in _SYNC
                                       for n in names):
        raise Refusal("the body synchronises, uses atomics or inline assembly")
    assigned, made = written(unit, loop_body)
    return sorted((d for d in assigned if d not in made), key=lambda d: unit.span(d)[0])


_INTEGERS = ("BOOL", "CHAR_U", "UCHAR", "CHAR16", "CHAR32", "USHORT", "UINT", "ULONG", "ULONGLONG", "UINT128",
             "CHAR_S", "SCHAR", "WCHAR", "SHORT", "INT", "LONG", "LONGLONG", "INT128")
_FLOATS = ("FLOAT", "DOUBLE", "LONGDOUBLE", "HALF", "FLOAT16", "FLOAT128", "BFLOAT16")
_IEEE_MAX_MIN = ("fmaxf", "fminf", "fmax", "fmin")  # IEEE maxNum/minNum: order-free, NaN-ignoring
_MAX_MIN = (*_IEEE_MAX_MIN, "max", "min")
_WHAT = {"+": "sum", "-": "sum", "*": "product", "max": "max", "min": "min"}


def _accumulators(unit: Unit, function, loop_body, outside: list, up: dict) -> dict:
    """The variables declared outside the loop that the body writes, each an accumulator: a scalar local of
    the function (integer or floating, not `__shared__`, `static`, a parameter, pointer, array, reference
    or class, its address never taken nor bound to a reference) that one statement of the body's own
    updates (`x += e;`, `x -= e;`, `x *= e;`, `x = x + e;`, `x = fmaxf(x, e);`, `fminf`, `fmax`, `fmin`,
    `max`, `min`, either order), `e` reading no accumulator and `x` read nowhere else in the loop. Each is
    mapped to ("" where the order its elements come in cannot change the result (an integer updated with an
    integer, a float by fmaxf/fminf/fmax/fmin), else what it accumulates ("sum", "product", "max" through a
    `max` that may not be IEEE's): a float the packs may round differently; the update's operator or
    function)."""
    if not outside:
        return {}
    statements = list(loop_body.get_children()) if loop_body.kind.name == "COMPOUND_STMT" else [loop_body]
    updates: dict = {}
    for decl in outside:
        name = decl.spelling
        _scalar_local(unit, function, decl, up)
        writes = [n for n in walk(loop_body) if _target(unit, n) == decl]
        if len(writes) > 1:
            raise Refusal(f"the body writes {name} (declared outside the loop) more than once: not one accumulator "
                          "update")
        mine = [s for s in statements if bare(s) == writes[0]]
        if not mine:
            raise Refusal(f"the body writes {name} (declared outside the loop) under a condition, in a nested "
                          "statement or inside an expression: not an accumulator update")
        found = _update(unit, writes[0], decl)
        if found is None:
            raise Refusal(f"the body writes {name} (declared outside the loop) other than as an accumulator update "
                          "(`x += e;`, `x -= e;`, `x *= e;`, `x = x + e;`, `x = fmaxf(x, e);`, min/max)")
        updates[decl] = found
    for decl, (op, own, value, whole) in updates.items():
        for node in walk(value):
            if refers_to(node) in updates:
                other = refers_to(node).spelling
                raise Refusal(f"the update of {decl.spelling} reads {other}" + (
                    "" if other == decl.spelling else ", another accumulator (its partial value differs per pack)"))
    out: dict = {}
    for decl, (op, own, value, whole) in updates.items():
        name = decl.spelling
        stray = [n for n in walk(loop_body) if refers_to(n) == decl and n not in own]
        if stray:
            raise Refusal(f"{name} is read elsewhere in the loop (its partial value differs per pack), not only "
                          "by its accumulator update")
        kind = decl.type.get_canonical().kind.name
        if kind in _INTEGERS:
            typed = [bare(whole).type.get_canonical().kind.name, bare(value).type.get_canonical().kind.name]
            if any(t not in _INTEGERS for t in typed):
                raise Refusal(f"{name} is an integer updated with a value of type {bare(value).type.spelling} "
                              "(each step rounds: the order matters)")
            out[decl] = ("", op)
        else:
            out[decl] = ("" if op in _IEEE_MAX_MIN else _WHAT.get(op, op), op)  # "sum", "product", "max" or "min"
    return out


_LOOPS = ("FOR_STMT", "WHILE_STMT", "DO_STMT", "CXX_FOR_RANGE_STMT")


def _combined(unit: Unit, function, loop, decl, op: str, cta: bool, up: dict) -> None:
    """Refuses an accumulator of a strided loop unless what reads it after the loop is a reduction over the
    CTA of the same kind: packs give each thread other elements, so one thread's partial changes and only
    the CTA's combination of them is the same. That is: a CTA's loop (`threadIdx.x`, not the grid's index:
    the combination over CTAs is not proven), the accumulator declared inside every loop around this one
    (no partial carried into the next round), and its first reference after the loop an argument of a call
    whose name says a block-wide reduction of its kind (`blockReduceSum(sum)`, `cta::reduce_max(m, smem)`:
    `block` or `cta`, `reduce`, and `sum`/`add`, `max` or `min`)."""
    name = decl.spelling
    if not cta:
        raise Refusal(f"{name} accumulates per thread of the grid: packs change each thread's partial, and their "
                      "combination over CTAs is not proven")
    node = loop
    while node in up:
        node = up[node]
        if node.kind.name in _LOOPS and unit.span(decl)[0] < unit.span(node)[0]:
            raise Refusal(f"{name} is declared outside a loop around this one: its per-thread partial carries on")
    end = unit.span(loop)[1]
    later = sorted((n for n in walk(body(function)) if refers_to(n) == decl and unit.span(n)[0] >= end),
                   key=lambda n: unit.span(n)[0])
    if not later:
        return  # never read again: its value is no result
    kind = {"+": "sum", "-": "sum", "*": "product"}.get(op, "max" if "max" in op else "min")
    words = {"sum": ("sum", "add"), "max": ("max",), "min": ("min",)}.get(kind, ())
    first = later[0]
    top = up.get(first)
    while top is not None and top.kind.name in ("UNEXPOSED_EXPR", "PAREN_EXPR"):
        top = up.get(top)
    if top is not None and assignment(unit, top) == "=" and bare(next(top.get_children())) == first and len(later) > 1:
        first = later[1]  # `x = blockReduceSum(x);`: its read is the call's argument
        if not unit.span(top)[0] <= unit.span(first)[0] < unit.span(top)[1]:
            first = later[0]
    call = up.get(first)
    while call is not None and call.kind.name in ("UNEXPOSED_EXPR", "PAREN_EXPR"):
        call = up.get(call)
    head = unit.data[unit.span(call)[0]:unit.span(first)[0]].decode().lower() if (
        call is not None and call.kind.name == "CALL_EXPR") else ""
    named = ("block" in head or "cta" in head) and "reduce" in head and any(w in head for w in words)
    if not (head and (named or _atomic_total(unit, call, first, kind))):
        raise Refusal(f"{name} is read after the loop other than by a block-wide {kind} reduction "
                      "(`blockReduceSum(x)`, `cta::reduce_max(x, smem)`, `atomicAdd(&total, x)`): packs change "
                      "each thread's partial")
    why = Threads(unit, function).converged(call, warp=False)
    if why:
        raise Refusal(f"not every thread of the CTA reaches the reduction of {name}: {why}")


def _atomic_total(unit: Unit, call, arg, kind: str) -> bool:
    """Whether `call` is `atomicAdd(target, arg)` (`atomicMax`, `atomicMin` for those kinds) into one place
    for every thread: a target of `__shared__` variables, parameters and `blockIdx` alone."""
    args = [bare(a) for a in call.get_arguments()]
    if callee(call) != {"sum": "atomicAdd", "max": "atomicMax", "min": "atomicMin"}.get(kind) or len(args) != 2 or (
            args[1] != arg):
        return False
    names = [refers_to(n) for n in walk(args[0]) if refers_to(n) is not None]
    return "threadIdx" not in unit.code(args[0]) and all(
        d.kind.name == "PARM_DECL" or "CUDASHARED_ATTR" in attrs(d) for d in names)


def _target(unit: Unit, node):
    """The declaration `node` assigns, increments or takes the address of, or None (as `written` sees it)."""
    target = bare(next(node.get_children())) if assignment(unit, node) else stepped(unit, node)
    return refers_to(target) if target is not None else None


def _scalar_local(unit: Unit, function, decl, up: dict) -> None:
    """Refuses a variable written in the loop that is not an integer or floating local of the function whose
    address is never taken nor bound to a reference (so the loop reaches it by its name alone)."""
    name = decl.spelling
    if decl.kind.name == "PARM_DECL":
        raise Refusal(f"the body writes {name}, a parameter (only a local scalar may accumulate)")
    f0, f1 = unit.span(function)
    if decl.kind.name != "VAR_DECL" or not f0 <= unit.span(decl)[0] < f1:
        raise Refusal(f"the body writes {name}, declared outside the function (only a local scalar may accumulate)")
    if "CUDASHARED_ATTR" in attrs(decl) or decl.storage_class.name == "STATIC":
        raise Refusal(f"the body writes {name}, `__shared__` or `static` memory (only a thread's own scalar may "
                      "accumulate)")
    kind = decl.type.get_canonical().kind.name
    if kind not in _INTEGERS + _FLOATS or kind == "BOOL":
        what = {"POINTER": "a pointer", "LVALUEREFERENCE": "a reference", "RVALUEREFERENCE": "a reference",
                "CONSTANTARRAY": "an array", "INCOMPLETEARRAY": "an array", "RECORD": "a class or struct"}.get(
                    kind, f"of type {decl.type.spelling}")
        raise Refusal(f"the body writes {name}, declared outside the loop and {what}: not an integer or floating "
                      "scalar accumulator")
    for node in walk(body(function)):
        if refers_to(node) != decl:
            continue
        parent = up.get(node)
        while parent is not None and parent.kind.name in ("UNEXPOSED_EXPR", "PAREN_EXPR"):
            parent = up.get(parent)
        if parent is not None and ((parent.kind.name == "UNARY_OPERATOR" and operator(unit, parent) == "&") or (
                parent.kind.name == "VAR_DECL" and "REFERENCE" in parent.type.get_canonical().kind.name)):
            raise Refusal(f"{name}'s address is taken or a reference is bound to it: the loop may reach it "
                          "otherwise than by its name")


def _update(unit: Unit, node, decl):
    """(operator or function, the accumulator's own references, `e`, the whole value assigned) of an
    accumulator update of `decl` (`x += e`, `x = x * e`, `x = fmaxf(e, x)`, ...), or None."""
    op = assignment(unit, node)
    if node.kind.name not in ("BINARY_OPERATOR", "COMPOUND_ASSIGNMENT_OPERATOR") or not op:
        return None
    lhs, rhs = list(node.get_children())
    target = bare(lhs)
    if op in ("+=", "-=", "*="):
        return op[0], {target}, rhs, rhs
    if op != "=":
        return None
    value = bare(rhs)
    if value.kind.name == "BINARY_OPERATOR" and operator(unit, value) in ("+", "-", "*"):
        pair = [bare(c) for c in value.get_children()]
        how = operator(unit, value)
    elif value.kind.name == "CALL_EXPR" and callee(value) in _MAX_MIN and len(list(value.get_arguments())) == 2:
        pair = [bare(a) for a in value.get_arguments()]
        how = callee(value)
    else:
        return None
    for mine, other in [pair] if how == "-" else [pair, pair[::-1]]:
        if refers_to(mine) == decl:
            return how, {target, mine}, other, rhs
    return None


def _aliases(unit: Unit, loop_body, var, up: dict) -> dict:
    """The `const` integer locals of the body that only rename the loop variable plus an offset
    (`const int idx = row_offset + i;`): each declaration mapped to its offset ("" for `= i`)."""
    out: dict = {}
    for decl in [n for n in walk(loop_body) if n.kind.name == "VAR_DECL"]:
        statement = up.get(decl)
        if statement is None or statement.kind.name != "DECL_STMT" or up.get(statement) != loop_body:
            continue
        if len(list(statement.get_children())) != 1 or not decl.type.is_const_qualified():
            continue
        value = [c for c in decl.get_children() if c.kind.name not in ("TYPE_REF", "NAMESPACE_REF")]
        if len(value) != 1:
            continue
        init = bare(value[0])
        if refers_to(init) == var:
            out[decl] = ""
        elif init.kind.name == "BINARY_OPERATOR" and operator(unit, init) == "+":
            lhs, rhs = list(init.get_children())
            for mine, other in ((lhs, rhs), (rhs, lhs)):
                if refers_to(bare(mine)) == var and not any(refers_to(n) == var for n in walk(other)):
                    out[decl] = unit.code(other)
    return out


def _accesses(unit: Unit, loop_body, var, aliases: dict, up: dict, accumulates: bool) -> tuple[dict, bool]:
    """Each base the loop variable indexes (directly or through an alias): its offset, element type,
    whether read and written; and whether the variable is also used as a value (`(i < n) ? i : -1`)."""
    out: dict = {}
    valued = False
    alias_inits = {n for decl in aliases for n in walk(decl)}
    for ref in [n for n in walk(loop_body) if refers_to(n) == var or refers_to(n) in aliases]:
        if ref in alias_inits:
            continue
        node = ref
        while up.get(node) is not None and up[node].kind.name in ("UNEXPOSED_EXPR", "PAREN_EXPR"):
            node = up[node]
        parent = up.get(node)
        offset = aliases.get(refers_to(ref), "")
        if parent is not None and parent.kind.name == "BINARY_OPERATOR" and operator(unit, parent) == "+":
            other = [c for c in parent.get_children() if c != node][0]
            if offset or any(refers_to(n) == var or refers_to(n) in aliases for n in walk(other)):
                raise Refusal("the loop variable appears twice in one index")
            offset = unit.code(other)
            node, parent = parent, up.get(parent)
            while parent is not None and parent.kind.name in ("UNEXPOSED_EXPR", "PAREN_EXPR"):
                node, parent = parent, up.get(parent)
        if parent is None or parent.kind.name != "ARRAY_SUBSCRIPT_EXPR" or list(parent.get_children())[1] != node:
            if refers_to(ref) == var and _stored_value(unit, ref, var, aliases, up):
                valued = True
                continue
            raise Refusal(f"{ref.spelling} is used other than as a pointer's index")
        base = bare(list(parent.get_children())[0])
        text = _base_text(unit, base, loop_body, var, aliases)
        element = pointee(base.type.spelling)
        if "volatile" in base.type.spelling:
            raise Refusal(f"{text} is volatile: each element is read or written on its own")
        if element is None:
            raise Refusal(f"{text} has no element type to pack ({base.type.spelling})")
        size = _element_size(base)
        if size and (size >= 16 or 16 % size):
            raise Refusal(f"{text} has {size}-byte elements: no 16-byte pack of them")
        access = out.setdefault(text, _Access(base, text, offset, element, size))
        if access.offset != offset:
            raise Refusal(f"{text} is indexed at two offsets")
        access.nodes.append(parent)
        role = _role(unit, parent, up, loop_body)
        access.read |= role in ("read", "update")
        access.write |= role in ("write", "update")
    if not out:
        raise Refusal("the loop indexes no pointer with its variable")
    if not accumulates and not any(a.write for a in out.values()):
        raise Refusal("the loop stores nothing through the pointers it indexes")
    return out, valued


_ARITHMETIC = ("UNEXPOSED_EXPR", "PAREN_EXPR", "BINARY_OPERATOR", "UNARY_OPERATOR", "CONDITIONAL_OPERATOR",
               "CSTYLE_CAST_EXPR", "CXX_STATIC_CAST_EXPR", "CXX_FUNCTIONAL_CAST_EXPR", "INTEGER_LITERAL")


def _stored_value(unit: Unit, ref, var, aliases: dict, up: dict) -> bool:
    """Whether a use of the loop variable is arithmetic on its value that ends in what a statement of the
    body stores through an index of the loop (`out[i] = (i < n) ? i : -1;`): no call, load, local or
    pointer takes it, so the packed body computes it from the element's index alone."""
    node, parent = ref, up.get(ref)
    while parent is not None and parent.kind.name in _ARITHMETIC and not assignment(unit, parent):
        if "*" in parent.type.spelling or "[" in parent.type.spelling or stepped(unit, parent) is not None:
            return False
        node, parent = parent, up.get(parent)
    if parent is None or not assignment(unit, parent) or list(parent.get_children())[-1] != node:
        return False
    target = bare(next(parent.get_children()))
    return target.kind.name == "ARRAY_SUBSCRIPT_EXPR" and any(
        refers_to(n) == var or refers_to(n) in aliases for n in walk(list(target.get_children())[1]))


_BASE_NODES = ("DECL_REF_EXPR", "MEMBER_REF_EXPR", "PAREN_EXPR", "UNEXPOSED_EXPR", "BINARY_OPERATOR",
               "INTEGER_LITERAL", "CXX_STATIC_CAST_EXPR", "TYPE_REF", "NAMESPACE_REF")


def _base_text(unit: Unit, base, loop_body, var, aliases: dict) -> str:
    """The text of an indexed base that stays the same through the loop: a pointer variable, a pointer
    member of a struct (`params.x`, `p->x`) or pointer arithmetic on them (`(p + k)`), none of its names
    declared or assigned in the loop. Refused: anything that loads, calls or is not a pointer."""
    if "*" not in base.type.spelling:
        raise Refusal("an indexed base is not a pointer (a register array or a vector's element)")
    assigned, made = written(unit, loop_body)
    for node in walk(base):
        kind = node.kind.name
        if kind not in _BASE_NODES or (kind == "BINARY_OPERATOR" and operator(unit, node) not in ("+", "-")):
            raise Refusal("an indexed base loads or calls (not a pointer, a member pointer or an offset from one)")
        target = refers_to(node)
        if target is not None and (target == var or target in aliases or target in assigned or target in made):
            raise Refusal(f"an indexed base changes in the loop ({target.spelling})")
    if base.kind.name == "MEMBER_REF_EXPR" or any(n.kind.name == "MEMBER_REF_EXPR" for n in walk(base)):
        members = [bare(next(n.get_children())) for n in walk(loop_body) if assignment(unit, n)]
        if any(m.kind.name == "MEMBER_REF_EXPR" for m in members):
            raise Refusal("the body assigns a struct member (an indexed member pointer may change)")
    return re.sub(r"\s+", " ", unit.code(base)).strip()


def _element_size(base) -> int:
    """The size in bytes of what a pointer points to, as libclang knows it (0 in a template before
    instantiation)."""
    size = base.type.get_canonical().get_pointee().get_size()  # negative: dependent, incomplete or not a pointer
    return size if size > 0 else 0


def _role(unit: Unit, subscript, up: dict, loop_body) -> str:
    """How the body uses one element: "read", "write" (a built-in `=` or a class's defaulted copy or move:
    the pack is only stored) or "update" (read, then stored: a compound assignment, or a class's own
    `operator=`, which may keep some of the element's bytes). Refused: a use that may write the element
    other than as a statement of the body's own."""
    node, parent = subscript, up.get(subscript)
    while parent is not None and parent.kind.name in ("UNEXPOSED_EXPR", "PAREN_EXPR"):
        node, parent = parent, up.get(parent)
    if parent is None:
        return "read"
    op = assignment(unit, parent)
    if op and next(parent.get_children()) == node:
        whole, statement = parent, up.get(parent)
        while statement is not None and statement.kind.name == "UNEXPOSED_EXPR":  # a class's temporaries' cleanup
            whole, statement = statement, up.get(statement)
        if statement != loop_body and not (loop_body.kind.name != "COMPOUND_STMT" and whole == loop_body):
            raise Refusal("a store sits under a condition or inside an expression (the whole pack is stored)")
        return "write" if op == "=" and (parent.kind.name != "CALL_EXPR" or _whole(parent.referenced)) else "update"
    if stepped(unit, parent) is not None:
        raise Refusal("an element's address is taken or incremented")
    if parent.kind.name == "MEMBER_REF_EXPR" and not (
            parent.referenced is not None and parent.referenced.kind.name in ("CXX_METHOD", "CONVERSION_FUNCTION")
            and parent.referenced.is_const_method()):
        raise Refusal("an element's field or non-`const` method is used (it may be written)")
    if parent.kind.name == "CALL_EXPR" and _by_reference(parent, node):
        raise Refusal("an element is given by reference to a call that may write it")
    return "read"


def _whole(function) -> bool:
    """Whether a class's assignment operator writes every member: a defaulted (or implicit) copy or move."""
    return function is not None and function.is_default_method() and (
        function.is_copy_assignment_operator_method() or function.is_move_assignment_operator_method())


def _by_reference(call, arg) -> bool:
    """Whether a call may write its argument `arg`: a non-`const` reference parameter (or the object of a
    non-`const` member operator), or a call libclang cannot resolve (in a template) that may take one."""
    function = call.referenced
    args = list(call.get_arguments())
    if function is None:
        return True  # unresolved in a template: the callee may take a reference
    if arg not in args:
        return False
    at = args.index(arg)
    member = function.kind.name == "CXX_METHOD"
    if member and call.spelling.startswith("operator"):
        if at == 0:
            return not function.is_const_method()
        at -= 1
    params = [a.type for a in function.get_arguments()]
    if at >= len(params):
        return False
    kind = params[at].get_canonical().kind.name
    return kind in ("LVALUEREFERENCE", "RVALUEREFERENCE") and not params[at].get_pointee().is_const_qualified()


_WORDS = {16: "uint4", 8: "uint2", 4: "unsigned int", 2: "unsigned short", 1: "unsigned char"}


def _emit(unit: Unit, loop, loop_body, var, origin: tuple, bound: str, stride: str, accesses: dict, aliases: dict,
          taken: set) -> tuple[int, int, str]:
    first, off, place, valued = origin
    start, end = unit.span(loop)
    ind = unit.indent(start)
    step = "  "
    i = var.spelling
    index_type = "auto" if "auto" in var.type.spelling or "dependent" in var.type.spelling else var.type.spelling
    pack, packs, lane, head = (fresh_name(n, taken) for n in ("kPack", f"{i}_pack", "lane", f"{i}_first"))
    names = {t: fresh_name(f"{a.stem}_pack", taken) for t, a in accesses.items()}
    widest = max(accesses.values(), key=lambda a: a.size)
    mixed = len({a.element for a in accesses.values()}) > 1
    # one element type: each pack is 16 bytes; several (sizes known): kPack elements of the widest make 16
    # bytes, and each base moves kPack of its own elements (16, 8, 4, 2 or 1 bytes) in one access
    word = {t: _WORDS[16 // widest.size * a.size] if mixed else "uint4" for t, a in accesses.items()}
    width = {t: 16 // widest.size * a.size if mixed else 16 for t, a in accesses.items()}

    def at(t, where: str = "") -> str:
        base = " + ".join(x for x in (accesses[t].offset, off, where) if x)
        return f"&{t}[{base or 0}]"

    count = f"(({bound}) - ({off}))" if off else f"({bound})"
    advance = f"++{packs}" if stride == "1" else f"{packs} += {stride}"
    resume = " + ".join(x for x in (off, f"{count} / {pack} * {pack}", place if place != "0" else "") if x)

    # the body, each access replaced by its pack's element and the aliases of the loop variable dropped
    b0, b1 = unit.span(loop_body)
    text = unit.data[b0:b1]
    repl = [(*unit.span(n), f"{names[t]}[{lane}]") for t, a in accesses.items() for n in a.nodes]
    for decl in aliases:
        statement = next(n for n in loop_body.get_children() if decl in list(n.get_children()))
        s0, s1 = unit.span(statement)
        line0, line1 = unit.line_start(s0), unit.data.find(b"\n", s1)
        alone = not unit.data[line0:s0].strip() and not unit.data[s1:line1].strip(b" \t;")
        repl.append((line0, line1 + 1, "") if alone and line0 > b0 and line1 < b1 else (s0, s1 + 1, ""))
    for a, b, new in sorted(repl, reverse=True):
        text = text[:a - b0] + new.encode() + text[b - b0:]
    inner = text.decode()
    if loop_body.kind.name == "COMPOUND_STMT":
        inner = inner[1:-1].strip("\n").rstrip()
        inner_lines = _reindent(inner, unit.indent(b0) + step, ind + step * 4)
    else:
        inner_lines = [ind + step * 4 + inner.strip() + ("" if inner.strip().endswith(";") else ";")]
    checks = " &&\n".join(([f"{ind}{step * 4}({off}) < ({bound})"] if off else [])
                          + [f"{ind}{step * 4}reinterpret_cast<uintptr_t>({at(t)}) % {width[t]} == 0"
                             for t in accesses]).lstrip()
    lines = [
        f"{ind}{{  // 16-byte packed loads and stores where every pointer is aligned; the scalar loop does the rest",
        f"{ind}{step}constexpr int {pack} = 16 / sizeof({widest.element});",
        f"{ind}{step}if ({checks}) {{",
        f"{ind}{step * 2}for ({index_type} {packs} = {place}; {packs} < {count} / {pack}; {advance}) {{",
        f"{ind}{step * 3}const {index_type} {head} = {packs} * {pack};",
    ]
    for t, a in accesses.items():
        lines.append(f"{ind}{step * 3}alignas({width[t]}) {a.element} {names[t]}[{pack}];")
        if a.read:
            lines.append(f"{ind}{step * 3}*reinterpret_cast<{word[t]}*>({names[t]}) = "
                         f"*reinterpret_cast<const {word[t]}*>({at(t, head)});")
    value = ([f"{ind}{step * 4}const {index_type} {i} = {' + '.join(x for x in (off, head, lane) if x)};"]
             if valued else [])  # the element's index, where the body uses it as a value
    lines += [f"{ind}{step * 3}#pragma unroll",
              f"{ind}{step * 3}for (int {lane} = 0; {lane} < {pack}; ++{lane}) {{",
              *value,
              *inner_lines,
              f"{ind}{step * 3}}}"]
    for t, a in accesses.items():
        if a.write:
            lines.append(f"{ind}{step * 3}*reinterpret_cast<{word[t]}*>({at(t, head)}) = "
                         f"*reinterpret_cast<const {word[t]}*>({names[t]});")
    above = pragmas_above(unit, start)
    pragmas = [line.strip() for line in unit.data[above:unit.line_start(start)].decode().splitlines() if line.strip()]
    original = unit.code(loop)
    if loop_body.kind.name != "COMPOUND_STMT" and not original.endswith(";"):  # `for (...) x;`: the `;` is not in it
        semicolon = unit.data.find(b";", end)
        if semicolon >= 0 and not unit.data[end:semicolon].strip():
            end, original = semicolon + 1, original + ";"
    f0, f1 = (x - start for x in unit.span(first))
    tail = original[:f0] + resume + original[f1:]
    lines += [f"{ind}{step * 2}}}",
              *[ind + step * 2 + p for p in pragmas],
              *_reindent(tail, ind, ind + step * 2),
              f"{ind}{step}}} else {{",
              *[ind + step * 2 + p for p in pragmas],
              *_reindent(original, ind, ind + step * 2),
              f"{ind}{step}}}",
              f"{ind}}}"]
    return above, end, "\n".join(lines)


def _reindent(text: str, old: str, new: str) -> list[str]:
    """`text`'s lines moved from indent `old` to `new` (its first line carries no indent of its own)."""
    out = []
    for k, line in enumerate(text.splitlines()):
        if not line.strip():
            out.append("")
        elif k == 0 and not line.startswith(old):
            out.append(new + line.lstrip())
        else:
            out.append(new + (line[len(old):] if line.startswith(old) else line.lstrip()))
    return out
