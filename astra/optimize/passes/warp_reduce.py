"""warp_reduce: a block's shared-memory reduction done with warp shuffles, with fewer barriers.

Two shapes.

1. A shared-memory tree reduction run by a one-warp block becomes warp shuffles:

    for (int s = blockDim.x / 2; s > 0; s >>= 1) {        if (blockDim.x == 32) {  // one warp: shuffles
      if (tid < s) buf[tid] += buf[tid + s];       ->        auto value = buf[tid];
      __syncthreads();                                       for (int offset = 16; offset > 0; offset >>= 1)
    }                                                          value += __shfl_xor_sync(0xffffffffu, value, offset);
                                                             if (tid == 0) buf[0] = value;
                                                             __syncwarp();
                                                           } else {
                                                             <the original loop>
                                                           }

Applies to a loop `for (T s = H; s > 0; s >>= 1)` (or `s /= 2`) whose body is exactly a guarded
combine `if (tid < s) buf[tid] OP= buf[tid + s];` (`+=`, or `buf[tid] = max/fmaxf/min/fminf(buf[tid],
buf[tid + s])`) and a `__syncthreads()`, with `tid` the thread's index (`threadIdx.x` or a local
initialised to it) and `buf` one name. The result lands in `buf[0]` as the tree leaves it, written by
lane 0 and made visible to the warp by `__syncwarp()`; a block of any other size runs the original
loop (the check is at run time, on `blockDim.x`). Floating-point sums add in another order.

2. The final stage of a two-level block reduction (each warp's partial in `__shared__` memory, a
barrier, then warp 0 or thread 0 reduces the partials and broadcasts the result through shared memory
behind a second barrier) runs in every warp (every thread) instead; its result stays in registers and
the second barrier goes:

    __syncthreads();                                    __syncthreads();
    if (warp_id == 0) {                                 float red_tid;
      float v = tid < nw ? red[tid] : 0.0f;     ->      {
      v = warp::reduce_sum(v);                            float v = (tid % 32) < nw ? red[(tid % 32)] : 0.0f;
      red[tid] = rsqrtf(v / n + eps);                     v = warp::reduce_sum(v);
    }                                                     red_tid = rsqrtf(v / n + eps);
    __syncthreads();                                    }
    const float scale = red[warp_id];                   const float scale = red_tid;

Applies to an `if` standing between two `__syncthreads()` in a `__global__` kernel, outside any loop,
whose condition selects warp 0 (`warp_id == 0`, `threadIdx.x < 32`; the thread's index inside becomes
its lane, the warp's index 0) or thread 0 (`threadIdx.x == 0`; the stage must not read the thread's
index). The stage reads only `__shared__` variables, calls only pure functions (math, whole-warp
`warp::reduce_*`/`cooperative_groups::reduce`/`__shfl_xor_sync` butterflies, the file's own device
functions that write no memory), stores its results into `__shared__` slots written nowhere after it
(each becomes a register; every later read of a slot becomes that register: the same index, or any
warp's slot where warp 0's lanes all stored), and may store to global memory in a statement of its own
(kept under the original condition). Every value stored by a warp must be the same in all its lanes
(from a butterfly or lane-independent); a whole-warp shuffle must run in every warp before the stage
(so every warp is whole); no statement after it may use the partials before the next barrier. The
result is bitwise the original's: every warp does the same arithmetic warp 0 did.
"""

from __future__ import annotations

import re

from astra.optimize.passes.base import ParsedPass, Refusal
from astra.optimize.passes.syntax import (
    BARRIERS,
    Unit,
    attrs,
    bare,
    body,
    callee,
    fresh_name,
    has_asm,
    is_global,
    operator,
    parents,
    refers_to,
    splice,
    statement_parent,
    stores,
    walk,
    written,
)

_COMBINE = re.compile(r"^if\s*\(\s*(?P<tid>\w+|threadIdx\.x)\s*<\s*(?P<s>\w+)\s*\)\s*\{?\s*"
                      r"(?P<buf>\w+)\s*\[\s*(?P=tid)\s*\]\s*(?:(?P<op>[+*])=\s*(?P=buf)\s*\[\s*(?P=tid)\s*\+\s*(?P=s)\s*\]|"
                      r"=\s*(?P<fn>max|min|fmaxf|fminf|::max|::min)\s*\(\s*(?P=buf)\s*\[\s*(?P=tid)\s*\]\s*,\s*"
                      r"(?P=buf)\s*\[\s*(?P=tid)\s*\+\s*(?P=s)\s*\]\s*\))\s*;?\s*\}?$", re.S)
_HALVING = re.compile(r"^(?P<s>\w+)\s*(?:>>=\s*1|/=\s*2)$")


class WarpReduce(ParsedPass):
    name = "warp_reduce"
    family = "warp_reduce"

    def rewrite(self, unit: Unit, spec: dict | None) -> tuple[str, str]:
        edits, done, refusals = [], [], []
        for function in unit.device_functions():
            if body(function) is None:
                continue
            up = parents(function)
            for loop in [n for n in walk(body(function)) if n.kind.name == "FOR_STMT" and unit.in_main(n)]:
                edit = _tree_loop(unit, loop, up)
                if edit is not None:
                    edits.append(edit)
                    done.append(f"tree reduction done with shuffles when the block is one warp: {function.spelling} "
                                f"line {unit.line_of(unit.span(loop)[0])}")
            for stage in [n for n in walk(body(function)) if n.kind.name == "IF_STMT" and unit.in_main(n)]:
                found = final_stage(unit, function, stage, up)
                if isinstance(found, str):
                    refusals.append(found)
                elif found is not None:
                    edits.extend(found)
                    done.append(f"a block reduction's final stage run by every thread, no broadcast barrier: "
                                f"{function.spelling} "
                                f"line {unit.line_of(unit.span(stage)[0])}")
        if not edits:
            raise Refusal(refusals[0] if refusals else
                          "no shared-memory tree reduction (`for (s = n / 2; s > 0; s >>= 1) { if (tid < s) buf[tid] "
                          "+= buf[tid + s]; __syncthreads(); }`) and no block reduction's final stage between two "
                          "barriers")
        return splice(unit, edits), "; ".join(done)


def _tree_loop(unit: Unit, loop, up: dict):
    children = list(loop.get_children())
    if len(children) != 4 or up.get(loop) is None or up[loop].kind.name != "COMPOUND_STMT":
        return None
    _, cond, step, loop_body = children
    halving = _HALVING.match(re.sub(r"\s+", " ", unit.code(step)).strip())
    if halving is None or not re.fullmatch(rf"{halving.group('s')}\s*>\s*0", unit.code(cond).strip()):
        return None
    statements = list(loop_body.get_children()) if loop_body.kind.name == "COMPOUND_STMT" else []
    if len(statements) != 2 or not re.fullmatch(r"__syncthreads\s*\(\s*\)", unit.code(statements[1]).strip()):
        return None
    combine = _COMBINE.match(unit.code(statements[0]).strip())
    if combine is None or combine.group("s") != halving.group("s"):
        return None
    tid = combine.group("tid")
    if tid != "threadIdx.x" and not _is_thread_index(unit, statements[0], tid):
        return None
    buf = combine.group("buf")
    start, end = unit.span(loop)
    ind, step_ = unit.indent(start), "  "
    fn = combine.group("fn")
    shuffled = "__shfl_xor_sync(0xffffffffu, value, offset)"
    update = f"value {combine.group('op')}= {shuffled};" if combine.group("op") else f"value = {fn}(value, {shuffled});"
    original = unit.code(loop)
    lines = ["if (blockDim.x == 32) {  // one warp: shuffles instead of shared memory and barriers",
             f"{ind}{step_}auto value = {buf}[{tid}];",
             f"{ind}{step_}for (int offset = 16; offset > 0; offset >>= 1) {{",
             f"{ind}{step_ * 2}{update}",
             f"{ind}{step_}}}",
             f"{ind}{step_}if ({tid} == 0) {buf}[0] = value;",
             f"{ind}{step_}__syncwarp();",
             f"{ind}}} else {{",
             *[(ind + step_ + line[len(ind):] if line.startswith(ind) else ind + step_ + line.lstrip()) if k else
               ind + step_ + line for k, line in enumerate(original.splitlines())],
             f"{ind}}}"]
    return start, end, "\n".join(lines)


def _is_thread_index(unit: Unit, statement, name: str) -> bool:
    """Whether `name` in the statement is a local initialised with `threadIdx.x` alone."""
    ref = next((n for n in walk(statement) if refers_to(n) is not None and refers_to(n).spelling == name), None)
    if ref is None or refers_to(ref).kind.name != "VAR_DECL":
        return False
    value = [c for c in refers_to(ref).get_children() if c.kind.name not in ("TYPE_REF", "NAMESPACE_REF")]
    return bool(value) and re.fullmatch(r"threadIdx\.x", unit.code(bare(value[-1])).strip()) is not None


# --- the final stage of a two-level block reduction -------------------------------------------------

_BARRIER = re.compile(r"^__syncthreads\s*\(\s*\)$")
_WARP = r"(?:32|kWarpThreads|device::kWarpThreads|warpSize|WARP_SIZE|kWarpSize)"
_ROLE = {"tid": re.compile(r"^(?:threadIdx\.x|static_cast<\w+>\(threadIdx\.x\)|\(\w+\)\s*threadIdx\.x)$"),
         "lane": re.compile(rf"^(?P<t>\w+(?:\.x)?)\s*(?:%\s*{_WARP}|&\s*(?:31|0x1[fF]|\({_WARP}\s*-\s*1\)))$"),
         "warp": re.compile(rf"^(?P<t>\w+(?:\.x)?)\s*(?:/\s*{_WARP}|>>\s*5)$")}
# pure functions a final stage may call besides the file's own pure device functions
_PURE = re.compile(r"^(?:__)?(?:rsqrtf?|sqrtf?|fmaxf?|fminf?|max|min|fabsf?|abs|expf?|exp2f?|logf?|log2f?|"
                   r"f?add_rn|f?mul_rn|f?div_rn|fmaf?(?:_rn)?|fdividef|frcp_rn|fsqrt_rn|frsqrt_rn|ceil_div\w*|"
                   r"div_ceil|cast|reduce|reduce_sum|reduce_max|reduce_min|plus|greater|less|maximum|minimum|"
                   r"__shfl_xor_sync)$")
_BUTTERFLY = ("reduce", "reduce_sum", "reduce_max", "reduce_min")
_SHUFFLES = ("__shfl_sync", "__shfl_up_sync", "__shfl_down_sync", "__shfl_xor_sync", "__shfl_xor", "__shfl_down",
             "__shfl_up", "__shfl")


def final_stage(unit: Unit, function, stage, up: dict):
    """Edits that run a block reduction's final stage in every warp, or a one-line reason it cannot be
    (a string), or None where `stage` is not an `if` standing between two `__syncthreads()`."""
    block = statement_parent(stage, up)
    if block is None:
        return None
    siblings = list(block.get_children())
    at = siblings.index(stage)
    if at == 0 or at + 1 >= len(siblings) or not (_is_barrier(unit, siblings[at - 1]) and
                                                   _is_barrier(unit, siblings[at + 1])):
        return None
    children = list(stage.get_children())
    cond, then = children[0], children[1]
    if len(children) != 2:
        return "the final stage has an else branch"
    roles = _roles(unit, function)
    who = _who(unit, cond, roles)
    if who is None:
        return "the final stage's condition is not one warp (`warp_id == 0`, `threadIdx.x < 32`) or one thread"
    if not is_global(function):
        return f"the final stage is in the device helper {function.spelling} (its caller may reuse the buffers)"
    node = up.get(stage)
    while node is not None and node != function:
        if node.kind.name in ("FOR_STMT", "WHILE_STMT", "DO_STMT", "CXX_FOR_RANGE_STMT"):
            return "the final stage is inside a loop (a later round writes the partials another warp still reads)"
        node = up.get(node)
    stage_range = unit.span(stage)
    if who == "warp" and not _full_warps(unit, function, stage, up):
        return "no whole-warp shuffle runs in every warp before the final stage (a warp may be partial)"
    return _plan(unit, function, stage, then, cond, who, roles, siblings[at + 1], stage_range, up)


def _full_warps(unit: Unit, function, stage, up: dict) -> bool:
    """Whether every warp runs a full-mask shuffle before `stage`, outside any run-time condition: then every
    warp is whole (as the original requires), and every warp may run the final stage's shuffles."""
    begin = unit.span(stage)[0]
    for call in [n for n in walk(function) if n.kind.name == "CALL_EXPR" and unit.span(n)[1] < begin]:
        if callee(call) not in _BUTTERFLY + ("__shfl_xor_sync",):
            continue
        node, guarded = up.get(call), False
        while node is not None and node != function:
            if node.kind.name in ("IF_STMT", "CONDITIONAL_OPERATOR", "WHILE_STMT", "DO_STMT", "SWITCH_STMT") and \
                    not unit.code(node).startswith("if constexpr"):
                guarded = True
            if node.kind.name == "FOR_STMT" and _butterfly_loop(unit, node) is None:
                guarded = True
            node = up.get(node)
        if not guarded:
            return True
    return False


def _is_barrier(unit: Unit, node) -> bool:
    return _BARRIER.match(re.sub(r"\s+", "", unit.code(node))) is not None


def _roles(unit: Unit, function) -> dict:
    """Each local that names the thread's index (`tid`), its lane (`lane`) or its warp (`warp`), never written
    after its initialisation."""
    out: dict = {}
    assigned, _ = written(unit, function)
    for _ in range(3):  # a lane may be defined from a tid defined from threadIdx.x
        for decl in [n for n in walk(function) if n.kind.name == "VAR_DECL" and n not in out and n not in assigned]:
            value = [c for c in decl.get_children() if c.kind.name not in ("TYPE_REF", "NAMESPACE_REF")]
            if not value:
                continue
            role = _role_of(unit, bare(value[-1]), out)
            if role is not None:
                out[decl] = role
    return out


def _role_of(unit: Unit, expr, roles: dict):
    text = re.sub(r"\s+", " ", unit.code(expr)).strip()
    names = {d.spelling: r for d, r in roles.items()}
    if _ROLE["tid"].match(text) or names.get(text) == "tid":
        return "tid"
    if text in names:
        return names[text]
    for role in ("lane", "warp"):
        match = _ROLE[role].match(text)
        if match and (match.group("t") == "threadIdx.x" or names.get(match.group("t")) == "tid"):
            return role
    return None


def _who(unit: Unit, cond, roles: dict):
    """'warp' where the condition selects warp 0, 'thread' where it selects thread 0, else None."""
    text = re.sub(r"\s+", " ", unit.code(cond)).strip().strip("()").strip()
    names = {d.spelling: r for d, r in roles.items()}
    match = re.fullmatch(r"(\w+(?:\.x)?) (==|<) (\w+(?:::\w+)*)", text)
    if match is None:
        return None
    left, op, right = match.groups()
    role = "tid" if left == "threadIdx.x" else names.get(left)
    if op == "==" and right in ("0", "0u") and role in ("tid", "warp"):
        return "thread" if role == "tid" else "warp"
    if op == "<" and role == "tid" and re.fullmatch(_WARP, right):
        return "warp"
    return None


def _plan(unit: Unit, function, stage, then, cond, who: str, roles: dict, barrier, stage_range, up: dict):
    start, end = stage_range
    inside = lambda n: start <= unit.span(n)[0] and unit.span(n)[1] <= end  # noqa: E731
    if has_asm(unit, then):
        return "the final stage has inline asm"
    kinds = {n.kind.name for n in walk(then)}
    if kinds & {"RETURN_STMT", "BREAK_STMT", "CONTINUE_STMT", "GOTO_STMT", "LAMBDA_EXPR"}:
        return "the final stage jumps (return, break, continue, goto) or holds a lambda"
    pure = _pure_functions(unit)
    for call in [n for n in walk(then) if n.kind.name == "CALL_EXPR"]:
        name = callee(call)
        if name in BARRIERS or name.startswith("atomic"):
            return f"the final stage calls {name}"
        if name in _SHUFFLES and (who == "thread" or name != "__shfl_xor_sync"):
            return f"the final stage shuffles with {name} (its result is not the same in every lane)"
        target = call.referenced
        if not (_PURE.match(name) or name in pure or (target is not None and target.kind.name == "CONSTRUCTOR")):
            return f"the final stage calls {name or 'an unnamed function'}, not known to be pure"
    role_refs = [n for n in walk(then) if _thread_ref(unit, n, roles) and not (
        refers_to(n) is not None and inside(refers_to(n)))]  # a local of the stage is rewritten where it is set
    if who == "thread" and role_refs:
        return "the one-thread final stage reads the thread's index"
    shared_reads, slots, others, outer = set(), {}, [], set()
    for store in stores(unit, then) + _scalar_stores(unit, then):
        target = bare(next(store.get_children()))
        base = _base_decl(target)
        if base is not None and _is_shared(base):
            if operator(unit, store) != "=":
                return f"the final stage updates {base.spelling} in place"
            index = _index(unit, target)
            if (base, index) in slots:
                return f"the final stage stores {base.spelling}{'[' + index + ']' if index else ''} twice"
            slots[(base, index)] = store
        elif base is not None and base.kind.name == "VAR_DECL" and not inside(base):
            if target.kind.name != "DECL_REF_EXPR":
                others.append(store)
            else:
                outer.add(base)
        elif base is not None and base.kind.name == "VAR_DECL":
            continue
        else:
            others.append(store)
    for node in walk(then):
        if node.kind.name == "ARRAY_SUBSCRIPT_EXPR" or (node.kind.name == "UNARY_OPERATOR" and operator(unit, node) == "*"):
            base = _base_decl(bare(next(node.get_children())))
            if base is not None and _is_shared(base):
                if not any(base == b for b, _ in slots):
                    shared_reads.add(base)
            elif not any(unit.span(node)[0] >= unit.span(s)[0] and unit.span(node)[1] <= unit.span(next(s.get_children()))[1]
                         for s in others):
                if base is None or base.kind.name != "VAR_DECL" or not inside(base):
                    return "the final stage reads memory other than shared memory"
    if not slots:
        return "the final stage stores no result in shared memory"
    for store in others:
        if up.get(store) != then and statement_parent(store, up) != then:
            return "the final stage writes global memory under a condition of its own"
    # every warp now runs the stage: its result must be the same in every lane
    if who == "warp":
        why = _uniform(unit, then, slots, roles)
        if why:
            return why
    after = unit.span(barrier)[1]
    for decl in outer:
        if any(refers_to(n) == decl and unit.span(n)[0] > after for n in walk(function)):
            return f"the final stage assigns {decl.spelling}, which is read after it"
    # reads of the broadcast slots after the stage become reads of registers
    names, reads = {}, []
    taken = {n.spelling for n in walk(function) if n.kind.name in ("VAR_DECL", "PARM_DECL")}
    for base, index in slots:
        names[(base, index)] = fresh_name(f"{base.spelling}_value" if index is None else f"{base.spelling}_{_slug(index)}",
                                      taken)
        for other in stores(unit, function) + _scalar_stores(unit, function):
            if _base_decl(bare(next(other.get_children()))) == base and unit.span(other)[0] > end:
                return f"{base.spelling} is written after the final stage"
        for ref in [n for n in walk(function) if refers_to(n) == base]:
            parent = up.get(ref)
            while parent is not None and parent.kind.name in ("UNEXPOSED_EXPR", "PAREN_EXPR"):
                parent = up.get(parent)
            if parent is not None and parent.kind.name == "UNARY_OPERATOR" and operator(unit, parent) == "&":
                return f"the address of {base.spelling} is taken"
    for base in {b for b, _ in slots}:
        for ref in [n for n in walk(function) if refers_to(n) == base and unit.span(n)[0] > start]:
            if inside(ref) and any(ref == _base_ref(next(s.get_children())) for s in slots.values()):
                continue
            first_store = min(unit.span(s)[1] for (b, _), s in slots.items() if b == base)
            if inside(ref) and unit.span(ref)[0] < first_store:
                continue  # the stage reads what was there before it stores (the partials)
            read = _read_of(unit, ref, up)
            index = _index(unit, read) if read.kind.name == "ARRAY_SUBSCRIPT_EXPR" else None
            slot = _slot_for(unit, base, index, slots, roles)
            if slot is None:
                return f"{unit.code(read)} is read after the final stage, not a slot it stores"
            if not inside(ref) and not _in(unit, ref, up.get(stage)):
                return f"{base.spelling} is read outside the block of the final stage"
            reads.append((read, names[slot]))
    # the partials: nothing may write them after the stage until a barrier
    hazard = _later_write(unit, function, stage, barrier, shared_reads, up)
    if hazard:
        return hazard
    return _edits(unit, stage, then, cond, who, roles, barrier, slots, names, reads, others, role_refs)


def _thread_ref(unit: Unit, node, roles: dict) -> bool:
    if node.kind.name == "MEMBER_REF_EXPR" and re.sub(r"\s+", "", unit.code(node)) == "threadIdx.x":
        return True
    return refers_to(node) is not None and roles.get(refers_to(node)) in ("tid", "warp")


def _pure_functions(unit: Unit) -> set[str]:
    """This file's device functions that write no memory and have no barrier, atomic, shuffle or asm."""
    out = set()
    for function in unit.device_functions():
        if is_global(function) or body(function) is None or has_asm(unit, function) or stores(unit, function):
            continue
        names = {callee(n) for n in walk(function) if n.kind.name == "CALL_EXPR"}
        if not any(n in BARRIERS or n.startswith("atomic") or n in _SHUFFLES for n in names):
            out.add(function.spelling)
    return out


def _scalar_stores(unit: Unit, root) -> list:
    """Assignments under `root` to a plain variable (`s = ...`)."""
    return [n for n in walk(root) if n.kind.name in ("BINARY_OPERATOR", "COMPOUND_ASSIGNMENT_OPERATOR")
            and operator(unit, n) in ("=", "+=", "-=", "*=", "/=", "%=", "&=", "|=", "^=", "<<=", ">>=") and refers_to(bare(next(n.get_children()))) is not None]


def _base_ref(target):
    node = bare(target)
    while node.kind.name == "ARRAY_SUBSCRIPT_EXPR":
        node = bare(next(node.get_children()))
    return node


def _base_decl(target):
    return refers_to(_base_ref(target))


def _is_shared(decl) -> bool:
    return decl.kind.name == "VAR_DECL" and "CUDASHARED_ATTR" in attrs(decl)


def _index(unit: Unit, target):
    """The index text of `b[i]` (whitespace folded), None for a plain variable; `b[i][j]` gives `i][j`."""
    node = bare(target)
    if node.kind.name != "ARRAY_SUBSCRIPT_EXPR":
        return None
    code = re.sub(r"\s+", "", unit.code(node))
    return code[code.index("[") + 1:-1]


def _slug(index: str) -> str:
    return re.sub(r"\W+", "_", index).strip("_") or "slot"


def _read_of(unit: Unit, ref, up: dict):
    """The outermost subscript over `ref` (`b[i][j]`), or the reference itself."""
    node, parent = ref, up.get(ref)
    while parent is not None and parent.kind.name in ("UNEXPOSED_EXPR", "PAREN_EXPR", "ARRAY_SUBSCRIPT_EXPR"):
        if parent.kind.name == "ARRAY_SUBSCRIPT_EXPR" and bare(next(parent.get_children())) != bare(node) and \
                _base_ref(next(parent.get_children())) != ref:
            break
        if parent.kind.name == "ARRAY_SUBSCRIPT_EXPR":
            node = parent
        parent = up.get(parent)
    return node


def _slot_for(unit: Unit, base, index, slots: dict, roles: dict):
    """The stored slot a read of `base[index]` sees: the same index, or any warp's slot where every lane of
    warp 0 stored the same value (`b[lane] = v` read as `b[warp_id]`)."""
    if (base, index) in slots:
        return (base, index)
    names = {d.spelling: r for d, r in roles.items()}
    read_role = _text_role(index, names) if index is not None else None
    for (b, i), _ in slots.items():
        if b == base and i is not None and _text_role(i, names) in ("tid", "lane") and read_role == "warp":
            return (b, i)
    return None


def _text_role(text: str, names: dict):
    if text == "threadIdx.x" or names.get(text) == "tid":
        return "tid"
    if text in names:
        return names[text]
    for role in ("lane", "warp"):
        match = _ROLE[role].match(text.replace(" ", ""))
        if match is None:
            match = _ROLE[role].match(re.sub(r"([/%&]|>>)", r" \1 ", text))
        if match and (match.group("t") == "threadIdx.x" or names.get(match.group("t")) == "tid"):
            return role
    return None


def _in(unit: Unit, node, block) -> bool:
    a, b = unit.span(block)
    return a <= unit.span(node)[0] and unit.span(node)[1] <= b


def _uniform(unit: Unit, then, slots: dict, roles: dict) -> str:
    """Why a value the warp stores may differ between its lanes ("" when every stored value comes from a
    whole-warp butterfly reduction or from lane-independent values)."""
    varying = set()

    def depends(expr) -> bool:
        for n in walk(expr):
            if _thread_ref(unit, n, roles) or (refers_to(n) is not None and (
                    roles.get(refers_to(n)) == "lane" or refers_to(n) in varying)):
                return True
        return False

    def reduced(expr) -> bool:
        expr = bare(expr)
        if expr.kind.name != "CALL_EXPR" or callee(expr) not in _BUTTERFLY:
            return False
        code = re.sub(r"\s+", "", unit.code(expr))
        head = code[:code.index("(")]
        args = list(expr.get_arguments()) if hasattr(expr, "get_arguments") else []
        if callee(expr) == "reduce" and args and "thread_block_tile<32" not in args[0].type.spelling:
            return "<" in head and re.search(rf"<\w+::\w+,{_WARP}(,1)?>|<ReductionOp::\w+>", head) is not None
        return "<" not in head or re.fullmatch(rf".*<{_WARP}(,1)?>", head) is not None

    for node in walk(then):
        if node.kind.name == "VAR_DECL":
            value = [c for c in node.get_children() if c.kind.name not in ("TYPE_REF", "NAMESPACE_REF")]
            if value and not reduced(value[-1]) and depends(value[-1]):
                varying.add(node)
        elif node.kind.name in ("BINARY_OPERATOR", "COMPOUND_ASSIGNMENT_OPERATOR") and operator(unit, node) in (
                "=", "+=", "-=", "*=") and refers_to(bare(next(node.get_children()))) is not None:
            target, value = [bare(c) for c in node.get_children()]
            decl = refers_to(target)
            if reduced(value):
                varying.discard(decl)
            elif _butterfly_step(unit, node, decl):
                continue
            elif depends(value):
                varying.add(decl)
        elif node.kind.name == "FOR_STMT":
            decl = _butterfly_loop(unit, node)
            if decl is not None:
                varying.discard(decl)
    for (base, _), store in slots.items():
        value = list(store.get_children())[1]
        if depends(value) and not reduced(value):
            return f"the value stored in {base.spelling} may differ between the lanes of the warp"
    return ""


def _butterfly_step(unit: Unit, node, decl) -> bool:
    code = re.sub(r"\s+", "", unit.code(node))
    return re.search(rf"__shfl_xor_sync\(\w+\(?-?\w*\)?,{re.escape(decl.spelling)},\w+\)", code) is not None


def _butterfly_loop(unit: Unit, loop):
    """The variable a full-warp `for (offset = 16; offset > 0; offset >>= 1) v OP= __shfl_xor_sync(m, v,
    offset)` loop reduces, or None."""
    children = list(loop.get_children())
    if len(children) != 4:
        return None
    init, cond, step, loop_body = children
    head = re.sub(r"\s+", "", unit.code(init).rstrip(";") + ";" + unit.code(cond) + ";" + unit.code(step))
    match = re.fullmatch(r"(?:int|unsigned|uint32_t|auto|unsignedint)(\w+)=(?:16|kWarpThreads/2|32/2);"
                         r"\1(?:>0|>=1|);\1(?:>>=1|/=2)", head)
    if match is None:
        return None
    statements = list(loop_body.get_children()) if loop_body.kind.name == "COMPOUND_STMT" else [loop_body]
    if len(statements) != 1:
        return None
    update = statements[0]
    target = refers_to(bare(next(update.get_children()))) if list(update.get_children()) else None
    if target is None:
        return None
    code = re.sub(r"\s+", "", unit.code(update))
    if re.search(rf"__shfl_xor_sync\([^,]+,{re.escape(target.spelling)},{match.group(1)}\)", code) is None:
        return None
    return target


def _later_write(unit: Unit, function, stage, barrier, partials: set, up: dict) -> str:
    """Why a statement after the stage may write a partials buffer before every warp has read it ("" when a
    barrier comes first, or nothing touches the buffers)."""
    node = barrier
    while node is not None and node != function:
        block = statement_parent(node, up) if node.kind.name != "COMPOUND_STMT" else None
        if block is None:
            node = up.get(node)
            continue
        siblings = list(block.get_children())
        for statement in siblings[siblings.index(node) + 1:]:
            if _is_barrier(unit, statement):
                return ""
            touched = {refers_to(n) for n in walk(statement)} & partials
            if touched:
                return f"{sorted(d.spelling for d in touched)[0]} is used again after the final stage before a barrier"
        node = block
    return ""


def _edits(unit: Unit, stage, then, cond, who, roles, barrier, slots, names, reads, others, role_refs):
    start, end = unit.span(stage)
    ind = unit.indent(start)
    inner: list[tuple[int, int, str]] = []
    for (base, index), store in slots.items():
        target = next(store.get_children())
        inner.append((*unit.span(target), names[(base, index)]))
    for read, name in reads:
        if start <= unit.span(read)[0] < end:
            inner.append((*unit.span(read), name))
    guard = re.sub(r"\s+", " ", unit.code(cond)).strip()
    for store in others:
        a, b = unit.span(store)
        inner.append((a, a, f"if ({guard}) "))
    for ref in role_refs:  # warp 0's thread index is its lane; its warp index is 0
        a, b = unit.span(ref)
        if any(x <= a and b <= y for x, y in [unit.span(next(s.get_children())) for s in slots.values()]):
            continue
        role = roles.get(refers_to(ref)) if refers_to(ref) is not None else "tid"
        inner.append((a, b, "0" if role == "warp" else f"({unit.code(ref)} % 32)"))
    text = _apply(unit, *unit.span(then), inner)
    decls = [f"{_slot_type(base)} {names[(base, index)]};" for base, index in slots]
    what = "every warp" if who == "warp" else "every thread"
    new = "\n".join([f"// final stage run by {what}: the result stays in registers, no broadcast barrier",
                     *[f"{ind}{d}" for d in decls], f"{ind}{text}"])
    edits = [(start, end, new)]
    b0, b1 = unit.span(barrier)
    semi = unit.data.index(b";", b1) + 1
    line = unit.line_start(b0)
    newline = unit.data.find(b"\n", semi)
    if not unit.data[line:b0].strip() and not unit.data[semi:newline if newline >= 0 else len(unit.data)].strip():
        edits.append((line - 1, semi, ""))
    else:
        edits.append((b0, semi, ""))
    for read, name in reads:
        if not start <= unit.span(read)[0] < end:
            edits.append((*unit.span(read), name))
    return edits


def _apply(unit: Unit, start: int, end: int, edits: list) -> str:
    data = unit.data[start:end]
    last = len(data) + 1
    for a, b, new in sorted(edits, key=lambda e: (e[0], e[1]), reverse=True):
        if b - start > last:
            raise ValueError(f"overlapping edits at byte {a}")
        data = data[:a - start] + new.encode() + data[b - start:]
        last = a - start
    return data.decode()


def _slot_type(decl) -> str:
    kind = decl.type.kind.name
    spelled = decl.type.element_type.spelling if kind.endswith("ARRAY") else decl.type.spelling
    if kind.endswith("ARRAY") and decl.type.element_type.kind.name.endswith("ARRAY"):
        spelled = decl.type.element_type.element_type.spelling
    return re.sub(r"^(volatile |const )+", "", spelled)
