"""parallelize: a loop one thread runs while the rest of its CTA (or warp) waits is spread over all of them.

    if (renormalize && threadIdx.x == 0) {             __shared__ float inv_shared;
      const float inv = 1.f / row_sum;                 if (renormalize && threadIdx.x == 0) {
      for (int k = 0; k < top_k; ++k) {                  const float inv = 1.f / row_sum;
        out[row * top_k + k] *= inv;           ->        inv_shared = inv;
      }                                                }
    }                                                  __syncthreads();
                                                       if (renormalize) {
                                                         const float inv = inv_shared;
                                                         for (int k = threadIdx.x; k < top_k; k += blockDim.x) {
                                                           out[row * top_k + k] *= inv;
                                                         }
                                                       }
                                                       __syncthreads();

The guard is `if (C)` with C a conjunction of one thread test and conditions every thread of the CTA
agrees on (kernel parameters, template parameters, `blockIdx`, constants, locals computed from those).
The thread test picks one thread of the CTA (`threadIdx.x == 0`, `tid == 0` with `tid` a local equal to
`threadIdx.x`, or `warp == 0 && lane == 0` with `warp = tid / W`, `lane = tid % W`) or one lane of each
warp (`lane == 0` with `lane = threadIdx.x % 32` or `& 31`). The guarded block is: statements without
loops (kept on the guard's thread), the first loop, then anything (kept on the guard's thread, after a
second barrier). The loop `for (T i = A; i < B; ++i)` becomes `for (T i = A + P; i < B; i += S)` with
P the thread's place (`threadIdx.x`, or the lane) and S the group's size (`blockDim.x`, or the warp's
width). Every value the loop reads that the other threads may not hold (a local computed by the guard's
thread, or one the CTA does not provably agree on) is the guard thread's, handed over after the
statements before the loop: through a `__shared__` variable for the CTA (a `__syncthreads()` between),
with `__shfl_sync` from lane 0 for a warp (a `__syncwarp()` before). A barrier after the loop makes its
stores visible to whoever reads them next, as the single thread's were to itself (left out where the
guard ends the kernel).

Sound only where the iterations are independent, so the pass refuses when:
- the loop writes a variable declared outside it (a loop-carried value, a reduction), breaks,
  continues, returns, synchronises, shuffles, uses atomics, inline assembly or a lambda, or calls a
  function not known to be free of side effects;
- a store is not `p[e]` with one subscript the loop variable plus a loop-invariant offset (directly or
  through a local of the body), so two iterations might write one element; the loop reads an element
  of memory it writes at another subscript; it writes two pointers of one element type that may alias
  (not both `__restrict__`), or reads through a third pointer that may alias one it writes;
- it reads or writes a local array (the guard thread's registers), or hands over a value whose type
  cannot live in shared memory or a shuffle (not a scalar);
- the guard is not the whole CTA's (or warp's) to reach: it is in a `__device__` function (its callers'
  threads are not known here), under a condition, loop or earlier jump the CTA's threads may disagree
  on, or the kernel uses `threadIdx.y`/`.z` (a 2-D block: the thread test picks a row of threads);
- the statements after the loop use a local declared before it (they move to a block of their own).
Floating-point results do not change: each element is computed as before, by another thread.
"""

from __future__ import annotations

import re
from typing import Iterator

from astra.optimize.passes.base import ParsedPass, Refusal, Site
from astra.optimize.passes.syntax import (
    LOOPS,
    Unit,
    bare,
    body,
    callee,
    fresh_name,
    has_asm,
    operator,
    pragmas_above,
    refers_to,
    statement_parent,
    walk,
    written,
)
from astra.optimize.passes.threads import JUMPS, PURE, Group, Threads, initializer, is_shared

_SCALARS = ("BOOL", "CHAR_S", "CHAR_U", "SCHAR", "UCHAR", "SHORT", "USHORT", "INT", "UINT", "LONG", "ULONG",
            "LONGLONG", "ULONGLONG", "FLOAT", "DOUBLE", "ENUM")
_ASSIGNMENTS = ("=", "+=", "-=", "*=", "/=", "%=", "&=", "|=", "^=", "<<=", ">>=")
_SHUFFLED = ("INT", "UINT", "LONG", "ULONG", "LONGLONG", "ULONGLONG", "FLOAT", "DOUBLE")


class Parallelize(ParsedPass):
    name = "parallelize"
    family = "parallelize"

    def rewrite(self, unit: Unit, spec: dict | None) -> tuple[str, str]:
        return self.rewrite_each(unit, _guards(unit), "a single thread's loop spread over its group",
                                 "no loop run by one thread of a CTA or warp "
                                 "(`if (threadIdx.x == 0) { for (...) ... }`, `if (lane == 0) { ... }`)")


def _guards(unit: Unit) -> Iterator[Site]:
    """Every `if` of the file's device code that picks one thread of its CTA or warp and holds a loop."""
    for function in unit.device_functions():
        if body(function) is None:
            continue
        threads = Threads(unit, function)
        for guard in [n for n in walk(body(function)) if n.kind.name == "IF_STMT" and unit.in_main(n)]:
            group = threads.single_thread(guard)
            if group is None or not _has_loop(guard):
                continue
            yield (f"{function.spelling} line {unit.line_of(unit.span(guard)[0])}", guard,
                   lambda function=function, guard=guard, group=group, threads=threads: (
                       *_Spread(unit, function, threads, guard, group).rewrite(), group.name))


def _has_loop(guard) -> bool:
    then = list(guard.get_children())[1]
    return any(n.kind.name in LOOPS for n in walk(then))



class _Spread:
    """The rewrite of one guard: its checks, then its text."""

    def __init__(self, unit: Unit, function, threads: Threads, guard, group: Group):
        self.unit, self.function, self.threads, self.guard, self.group = unit, function, threads, guard, group
        self.up = threads.up
        self.taken = {t.spelling for t in function.get_tokens() if t.kind.name == "IDENTIFIER"}

    def rewrite(self) -> tuple[int, int, str]:
        why = self.threads.converged(self.guard, self.group.warp)
        if why:
            raise Refusal(why)
        then = list(self.guard.get_children())[1]
        statements = list(then.get_children()) if then.kind.name == "COMPOUND_STMT" else [then]
        at = next((k for k, s in enumerate(statements) if any(n.kind.name in LOOPS for n in walk(s))), None)
        if at is None:
            raise Refusal("the guarded loop is not a statement of the guarded block")
        loop = statements[at]
        while loop.kind.name == "UNEXPOSED_STMT" and len(list(loop.get_children())) == 1:  # `#pragma unroll`
            loop = next(loop.get_children())
        if loop.kind.name != "FOR_STMT":
            raise Refusal("the guarded loop is not a `for` loop directly in the guarded block")
        before, after = statements[:at], statements[at + 1:]
        if any(n.kind.name in JUMPS + ("LAMBDA_EXPR",) for s in before for n in walk(s)):
            raise Refusal("the guarded statements before the loop jump or hold a lambda")
        var, start, bound, step = self._header(loop)
        loop_body = list(loop.get_children())[-1]
        self._independent(loop, loop_body, var)
        self._after_uses_before(before, after)
        handed = self._handed_over(loop, var, before)
        return self._emit(statements, before, after, loop, handed, start, step)

    def _header(self, loop):
        parts = list(loop.get_children())
        if len(parts) != 4 or parts[0].kind.name != "DECL_STMT" or len(list(parts[0].get_children())) != 1:
            raise Refusal("the loop is not `for (T i = A; i < B; ++i)`")
        init, cond, step, _ = parts
        var = next(init.get_children())
        start = initializer(var)
        cond = bare(cond)
        if start is None or cond.kind.name != "BINARY_OPERATOR" or operator(self.unit, cond) not in ("<", "<="):
            raise Refusal("the loop is not `for (T i = A; i < B; ++i)`")
        lhs, rhs = [bare(c) for c in cond.get_children()]
        if refers_to(lhs) != var or any(refers_to(n) == var for n in walk(rhs)):
            raise Refusal("the loop condition is not `i < B`")
        text = re.sub(r"\s+", "", self.unit.code(step))
        if text not in (f"++{var.spelling}", f"{var.spelling}++", f"{var.spelling}+=1"):
            raise Refusal("the loop step is not `++i`")
        for expr, what in ((start, "start"), (rhs, "bound")):
            if any(n.kind.name in ("ARRAY_SUBSCRIPT_EXPR", "CALL_EXPR") or (
                    n.kind.name == "UNARY_OPERATOR" and operator(self.unit, n) == "*") for n in walk(expr)):
                raise Refusal(f"the loop's {what} reads memory or calls a function")
        assigned = written(self.unit, list(loop.get_children())[-1])[0]
        if any(refers_to(n) in assigned for n in walk(rhs)):
            raise Refusal("the loop bound changes in the loop")
        return var, start, rhs, step

    def _independent(self, loop, loop_body, var) -> None:
        """Refuse unless the iterations are independent: no carried value, each store its own element."""
        unit = self.unit
        kinds = {n.kind.name for n in walk(loop_body)}
        if kinds & {"BREAK_STMT", "CONTINUE_STMT", "RETURN_STMT", "GOTO_STMT", "LAMBDA_EXPR"}:
            raise Refusal("the loop breaks, continues, returns or holds a lambda")
        if has_asm(unit, loop_body):
            raise Refusal("the loop holds inline assembly")
        for call in [n for n in walk(loop_body) if n.kind.name == "CALL_EXPR"]:
            name = callee(call)
            if call.referenced is not None and call.referenced.kind.name == "CONSTRUCTOR":
                continue
            spelled = _operator_call(unit, call)
            if spelled in _ASSIGNMENTS:
                raise Refusal(f"the loop assigns with `{spelled}` on a type the template leaves open")
            if spelled:
                continue  # arithmetic or a comparison on a type the template leaves open
            if name.startswith(("atomic", "__sync", "__shfl", "__ballot", "__any", "__all", "__threadfence")):
                raise Refusal(f"the loop synchronises or talks to other threads ({name})")
            if name not in PURE and not _pure_operator(name):
                raise Refusal(f"the loop calls {name or 'a function'}, which may have side effects")
        assigned, made = written(unit, loop_body)
        outside = sorted(d.spelling for d in assigned if d not in made)
        if outside:
            raise Refusal(f"the loop writes {outside[0]}, declared outside it (a loop-carried value)")
        for node in walk(loop_body):
            if node.kind.name == "UNARY_OPERATOR" and operator(unit, node) in ("++", "--"):
                target = bare(next(node.get_children()))
                if target.kind.name in ("ARRAY_SUBSCRIPT_EXPR", "UNARY_OPERATOR"):
                    raise Refusal("the loop increments an element of memory")
        for store in _stores(unit, loop_body, registers=True):
            head = refers_to(bare(next(bare(next(store.get_children())).get_children())))
            if head is not None and head not in made:
                raise Refusal(f"the loop writes {head.spelling}, declared outside it (a loop-carried value)")
        # the body's own locals, never changed after their declaration: a subscript may read through them
        locals_ = {d: initializer(d) for d in made if d.kind.name == "VAR_DECL" and d not in assigned}
        writes: dict = {}  # base declaration -> subscripts written
        for store in _stores(unit, loop_body):
            target = bare(next(store.get_children()))
            base, subscript = self._element(target, var, locals_)
            writes.setdefault(base, set()).add(subscript)
        if not writes:
            raise Refusal("the loop stores nothing to memory")
        for base in writes:
            if _is_local_array(base):
                raise Refusal(f"the loop writes {base.spelling}, a local array (the guard thread's registers)")
        self._no_alias(writes)
        for access in [n for n in walk(loop_body) if n.kind.name == "ARRAY_SUBSCRIPT_EXPR"]:
            if self.up.get(access) is not None and self.up[access].kind.name == "ARRAY_SUBSCRIPT_EXPR" and list(
                    self.up[access].get_children())[0] == access:
                continue  # the inner part of `a[i][j]`
            base = _base(access)
            if base is None:
                raise Refusal("the loop indexes something other than a named array or pointer")
            if _is_local_array(base) and base not in made:
                raise Refusal(f"the loop reads {base.spelling}, a local array (the guard thread's registers)")
            if base in writes:
                if self._subscripts(access, locals_) not in writes[base]:
                    raise Refusal(f"the loop reads {base.spelling} at another element than it writes "
                                  "(a loop-carried dependence)")
            elif not _read_only(base) and any(_may_alias(base, w) for w in writes):
                raise Refusal(f"the loop reads {base.spelling}, which may alias "
                              f"{next(w for w in writes if _may_alias(base, w)).spelling} it writes")

    def _element(self, target, var, locals_):
        """(base declaration, subscripts text) of a store's target; refuses unless one subscript is the
        loop variable plus an offset the loop does not change and the others are loop-invariant."""
        if target.kind.name != "ARRAY_SUBSCRIPT_EXPR":
            raise Refusal("a store is not `p[e]` (a store through `*p` may write one element twice)")
        base = _base(target)
        if base is None:
            raise Refusal("a store indexes something other than a named array or pointer")
        node, per_iteration = target, 0
        while node.kind.name == "ARRAY_SUBSCRIPT_EXPR":
            inner, index = list(node.get_children())
            step = _steps_by_one(self.unit, index, var, locals_)
            if step is None:
                raise Refusal(f"{base.spelling}'s subscript is not the loop variable plus a loop-invariant offset")
            per_iteration += step
            node = bare(inner)
        if per_iteration != 1:
            raise Refusal(f"{base.spelling}'s subscript is not the loop variable plus a loop-invariant offset")
        return base, self._subscripts(target, locals_)

    def _subscripts(self, access, locals_) -> str:
        out = []
        node = access
        while node.kind.name == "ARRAY_SUBSCRIPT_EXPR":
            inner, index = list(node.get_children())
            out.append(_expanded(self.unit, index, locals_))
            node = bare(inner)
        return "][".join(reversed(out))

    def _no_alias(self, writes: dict) -> None:
        bases = list(writes)
        for k, a in enumerate(bases):
            for b in bases[k + 1:]:
                if _may_alias(a, b):
                    raise Refusal(f"the loop writes {a.spelling} and {b.spelling}, which may alias")

    def _after_uses_before(self, before: list, after: list) -> None:
        declared = {d for s in before for d in walk(s) if d.kind.name == "VAR_DECL"}
        used = next((refers_to(n) for s in after for n in walk(s) if refers_to(n) in declared), None)
        if used is not None:
            raise Refusal(f"the statements after the loop use {used.spelling}, declared before it")

    def _handed_over(self, loop, var, before: list) -> list:
        """The locals the loop reads that the other threads may not hold: the guard thread's, handed over."""
        made = written(self.unit, loop)[1]
        declared_before = {d for s in before for d in walk(s) if d.kind.name == "VAR_DECL"}
        out = []
        for node in walk(loop):
            decl = refers_to(node)
            if decl is None or decl == var or decl in made or decl in out:
                continue
            if decl.kind.name not in ("VAR_DECL", "PARM_DECL"):
                continue
            if decl not in declared_before and self.threads._uniform_decl(decl, self.group.warp):
                continue
            if is_shared(decl):
                continue  # shared memory is the CTA's (the barrier makes the guard thread's writes visible)
            if _is_local_array(decl):
                raise Refusal(f"the loop reads {decl.spelling}, a local array (the guard thread's registers)")
            kind = decl.type.get_canonical().kind.name
            pointer = kind == "POINTER"
            if self.group.warp and kind not in _SHUFFLED:
                raise Refusal(f"{decl.spelling} ({decl.type.spelling}) cannot be handed to the warp by a shuffle")
            if not self.group.warp and kind not in _SCALARS and not pointer:
                raise Refusal(f"{decl.spelling} ({decl.type.spelling}) cannot be handed over through shared memory")
            out.append(decl)
        return out

    def _emit(self, statements, before, after, loop, handed, start, step) -> tuple[int, int, str]:
        unit, group = self.unit, self.group
        g0, g1 = unit.span(self.guard)
        ind = unit.indent(g0)
        inner = ind + "  "
        cond = unit.code(list(self.guard.get_children())[0])
        then = list(self.guard.get_children())[1]
        body_indent = unit.indent(unit.span(statements[0])[0]) if then.kind.name == "COMPOUND_STMT" else inner
        lines: list[str] = []
        names = {}
        for decl in handed:
            value_type = re.sub(r"^const\s+|\s+const$", "", decl.type.spelling).strip()
            names[decl] = (fresh_name(f"{decl.spelling}_{'lane0' if group.warp else 'shared'}", self.taken), value_type)
        carried = [d for d in handed if group.warp and d in {x for s in before for x in walk(s)}]
        for decl in handed:
            name, value_type = names[decl]
            if not group.warp:
                lines.append(f"{ind}__shared__ {value_type} {name};")
            elif decl in carried:
                lines.append(f"{ind}{value_type} {name}{{}};  // the guard lane's {decl.spelling}, for the shuffle")
        hand = [f"{inner}{names[d][0]} = {d.spelling};" for d in handed if not group.warp or d in carried]
        if before or hand:
            lines.append(f"{ind}if ({cond}) {{")
            lines += [_moved(unit, s, body_indent, inner) for s in before]
            lines += hand
            lines.append(f"{ind}}}")
        sync = "__syncwarp();" if group.warp else "__syncthreads();"
        who = "lane 0" if group.warp else "one thread"
        lines.append(f"{ind}{sync}  // the loop below, run by {who} before, is spread over the {group.name}")
        uniform = " && ".join(group.conditions)
        loop_ind = inner if uniform else ind
        if uniform:
            lines.append(f"{ind}if ({uniform}) {{")
        elif handed:
            lines.append(f"{ind}{{")
            loop_ind = inner
        for decl in handed:
            name, value_type = names[decl]
            if group.warp:
                source = name if decl in carried else decl.spelling
                lines.append(f"{loop_ind}const {value_type} {decl.spelling} = "
                             f"__shfl_sync(0xffffffffu, {source}, 0, {group.size});")
            else:
                lines.append(f"{loop_ind}const {value_type} {decl.spelling} = {name};")
        lines.append(_moved(unit, loop, body_indent, loop_ind, self._spread_header(loop, start, step)))
        if uniform or handed:
            lines.append(f"{ind}}}")
        last = statement_parent(self.guard, self.up) == body(self.function) and list(
            body(self.function).get_children())[-1] == self.guard
        if after or not last:
            lines.append(f"{ind}{sync}  // its stores seen by the threads that read them next")
        if after:
            lines.append(f"{ind}if ({cond}) {{")
            lines += [_moved(unit, s, body_indent, inner) for s in after]
            lines.append(f"{ind}}}")
        return g0, g1, "\n".join(lines)[len(ind):]

    def _spread_header(self, loop, start, step) -> list[tuple[int, int, str]]:
        unit, group = self.unit, self.group
        text = unit.code(start).strip()
        if text in ("0", "0u", "0U"):
            first = group.place
        elif re.fullmatch(r"[\w.]+", text):
            first = f"{text} + {group.place}"
        else:
            first = f"({text}) + {group.place}"
        var = next(next(loop.get_children()).get_children()).spelling
        return [(*unit.span(start), first), (*unit.span(step), f"{var} += {group.size}")]


def _moved(unit: Unit, statement, old: str, new: str, edits: list | None = None) -> str:
    """A statement's text (with its `#pragma` lines and any edits inside it) re-indented from `old` to `new`."""
    start, end = unit.span(statement)
    above = pragmas_above(unit, start)
    data = unit.data[start:end]
    for a, b, text in sorted(edits or [], reverse=True):
        data = data[:a - start] + text.encode() + data[b - start:]
    text = data.decode()
    if not text.rstrip().endswith((";", "}")):
        semicolon = unit.data.find(b";", end)
        if semicolon >= 0 and not unit.data[end:semicolon].strip():
            text += ";"
    pragmas = [p.strip() for p in unit.data[above:unit.line_start(start)].decode().splitlines() if p.strip()]
    out = [new + p for p in pragmas]
    for k, line in enumerate(text.splitlines()):
        if not line.strip():
            out.append("")
        elif k == 0:
            out.append(new + line.strip())
        else:
            out.append(new + (line[len(old):] if line.startswith(old) else line.lstrip()))
    return "\n".join(out)


def _stores(unit: Unit, root, registers: bool = False) -> list:
    """The assignments under `root` to an element of memory (`p[e]`, `*p`, `p[e].f`); with `registers`,
    those to a member of a local instead (`x.f = v`)."""
    return [n for n in walk(root) if n.kind.name in ("BINARY_OPERATOR", "COMPOUND_ASSIGNMENT_OPERATOR")
            and operator(unit, n) in ("=", "+=", "-=", "*=", "/=", "%=", "&=", "|=", "^=", "<<=", ">>=")
            and bare(next(n.get_children())).kind.name in ("ARRAY_SUBSCRIPT_EXPR", "UNARY_OPERATOR",
                                                           "MEMBER_REF_EXPR")
            and not (bare(next(n.get_children())).kind.name == "UNARY_OPERATOR"
                     and operator(unit, bare(next(n.get_children()))) != "*")
            and _member_of_local(bare(next(n.get_children()))) == registers]


def _operator_call(unit: Unit, call) -> str:
    """The operator of a call libclang leaves unresolved in a template (`a * b`, `out[i] = v` on dependent
    types, written as operators, seen as unnamed calls); '' for any other call."""
    if callee(call):
        return ""
    children = list(call.get_children())
    if len(children) == 3:  # lhs, the operator named, rhs
        spelled = unit.code(children[1]).strip()
    elif len(children) == 2:
        spelled = unit.data[children[0].extent.end.offset:children[1].extent.start.offset].decode().strip()
    else:
        return ""
    return spelled if re.fullmatch(r"[-+*/%<>=!&|^]{1,3}", spelled) else ""


def _pure_operator(name: str) -> bool:
    """A conversion or arithmetic operator of a value type (`operator float`, `operator*`), not an assignment."""
    return re.fullmatch(r"operator(\s+\w[\w\s:<>]*|[-+*/<>]|[<>=!]=)", name) is not None


def _member_of_local(target) -> bool:
    """`x.field` with `x` a plain local: a register, no memory (a member of an element is memory)."""
    if target.kind.name != "MEMBER_REF_EXPR":
        return False
    head = next(target.get_children(), None)
    return head is not None and refers_to(bare(head)) is not None and "*" not in bare(head).type.spelling


def _base(access):
    node = access
    while node.kind.name == "ARRAY_SUBSCRIPT_EXPR":
        node = bare(next(node.get_children()))
    return refers_to(node)


def _is_local_array(decl) -> bool:
    return decl.kind.name == "VAR_DECL" and "[" in decl.type.spelling and not is_shared(decl)



def _element_type(decl) -> str:
    spelled = decl.type.spelling
    spelled = re.sub(r"\b(const|volatile|__restrict__|__restrict)\b", " ", spelled)
    return re.sub(r"\s+", " ", re.sub(r"\[[^\]]*\]|\*", " ", spelled)).strip()


def _restrict(decl) -> bool:
    return "__restrict" in decl.type.spelling or "restrict" in {t.spelling for t in decl.get_tokens()}


def _read_only(decl) -> bool:
    spelled = re.sub(r"\b(__restrict__|__restrict)\b", " ", decl.type.spelling).strip()
    head = spelled.split("*")[0].split("[")[0].strip()
    return head.startswith("const ") or head.endswith(" const")


def _may_alias(a, b) -> bool:
    """Whether two named arrays or pointers may share memory (as far as their declarations tell)."""
    if a == b:
        return False
    if is_shared(a) and is_shared(b):
        return False  # two __shared__ arrays are two objects
    if is_shared(a) != is_shared(b) and (is_shared(a) and a.kind.name == "VAR_DECL" and "[" in a.type.spelling
                                           or is_shared(b) and b.kind.name == "VAR_DECL" and "[" in b.type.spelling):
        return False  # a __shared__ array and a pointer to global memory
    if _restrict(a) and _restrict(b):
        return False
    kinds = {_element_type(a), _element_type(b)}
    return len(kinds) == 1 or bool(kinds & {"char", "unsigned char", "signed char", "uint8_t", "int8_t", "void"})


def _steps_by_one(unit: Unit, index, var, locals_) -> int | None:
    """How much a subscript grows per iteration: 1 when it is the loop variable plus an offset the loop
    does not change, 0 when it does not involve the variable, None otherwise."""
    node = bare(index)
    kind = node.kind.name
    target = refers_to(node)
    if target == var:
        return 1
    if target is not None and target in locals_:
        init = locals_[target]
        return None if init is None else _steps_by_one(unit, init, var, locals_)
    if kind in ("CSTYLE_CAST_EXPR", "CXX_STATIC_CAST_EXPR", "CXX_FUNCTIONAL_CAST_EXPR"):
        inner = [c for c in node.get_children() if c.kind.name != "TYPE_REF"]
        return _steps_by_one(unit, inner[-1], var, locals_) if inner else None
    if kind == "BINARY_OPERATOR" and operator(unit, node) in ("+", "-"):
        left, right = list(node.get_children())
        a, b = _steps_by_one(unit, left, var, locals_), _steps_by_one(unit, right, var, locals_)
        if a is None or b is None or (operator(unit, node) == "-" and b):
            return None
        return a + b
    if any(refers_to(n) == var or refers_to(n) in locals_ for n in walk(node)):
        return None
    if any(n.kind.name in ("CALL_EXPR", "ARRAY_SUBSCRIPT_EXPR") for n in walk(node)):
        return None  # an offset read from memory may differ per iteration
    return 0


def _expanded(unit: Unit, index, locals_) -> str:
    """A subscript's text with the body's locals replaced by their initialisers (to compare two)."""
    node = bare(index)
    target = refers_to(node)
    if target is not None and target in locals_ and locals_[target] is not None:
        return _expanded(unit, locals_[target], locals_)
    return re.sub(r"\s+", "", unit.code(node))
