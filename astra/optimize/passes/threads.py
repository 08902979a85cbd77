"""What a kernel's threads agree on, read on libclang's tree: which locals hold a thread's index, lane or
warp; which guard picks one thread of the CTA or of a warp (`Threads.single_thread`); whether an expression
has one value across the CTA or a warp (`Threads.uniform`); whether every thread of the group reaches a
statement together (`Threads.converged`). For the passes that spread a single thread's work over its group
(`parallelize`) or pack a loop whose stride is the CTA's thread count (`vectorize`)."""

from __future__ import annotations

import re

from astra.optimize.passes.syntax import (
    LOOPS,
    Unit,
    attrs,
    bare,
    body,
    callee,
    operator,
    parents,
    refers_to,
    walk,
    written,
)

JUMPS = ("RETURN_STMT", "BREAK_STMT", "CONTINUE_STMT", "GOTO_STMT")
GRID = ("blockIdx", "blockDim", "gridDim")
# calls a spread loop may make: conversions and math, nothing that writes memory or talks to other threads
PURE = ("static_cast", "cast", "to_float", "expf", "__expf", "logf", "__logf", "sqrtf", "rsqrtf", "fabsf", "fminf",
         "fmaxf", "min", "max", "abs", "exp2f", "__fdividef", "__frcp_rn", "__float2half", "__half2float",
         "__float2bfloat16", "__bfloat162float", "__float2int_rn", "__int2float_rn", "rsqrt", "sqrt", "exp", "log",
         "tanhf", "ceilf", "floorf", "roundf", "truncf", "fmaf", "__fmul_rn", "__fadd_rn", "sigmoid")


class Group:
    """Who shares the guard thread's work: the CTA, or the guard lane's warp."""

    def __init__(self, name: str, place: str, size: str, conditions: list[str]):
        self.name, self.place, self.size = name, place, size
        self.conditions = conditions  # the guard's other conjuncts, every thread of the group agreeing

    @property
    def warp(self) -> bool:
        return self.name == "warp"


class Threads:
    """What a kernel's threads agree on: which locals hold the thread's index, lane or warp, and whether
    an expression has one value across the CTA (`uniform`) or across a warp (`warp=True`)."""

    def __init__(self, unit: Unit, function):
        self.unit, self.function = unit, function
        self.up = parents(function)
        self.assigned = written(unit, function)[0]
        self.global_ = "CUDAGLOBAL_ATTR" in {c.kind.name for c in function.get_children()}
        self.two_d = bool(re.search(r"\b(threadIdx|blockDim)\s*\.\s*[yz]\b", unit.code(function)))
        self.tids, self.lanes, self.warps = set(), {}, {}
        for decl in [n for n in walk(function) if n.kind.name == "VAR_DECL" and n not in self.assigned]:
            init = initializer(decl)
            text = re.sub(r"\s+", "", unit.code(init)) if init is not None else ""
            text = re.sub(r"^\(?(static_cast<\w+>|\(\w+\)|int|unsigned)?\(?", "", text).rstrip(")")
            if text == "threadIdx.x":
                self.tids.add(decl)
                continue
            match = re.fullmatch(r"(\w+(?:\.x)?)(%|&|/|>>)(\w+)", text)
            if match is None or not self._is_tid_text(match.group(1), init):
                continue
            op, width = match.group(2), match.group(3)
            if op == "%":
                self.lanes[decl] = width
            elif op == "&" and width.isdigit() and int(width) + 1 in (32,):
                self.lanes[decl] = "32"
            elif op == "/":
                self.warps[decl] = width
            elif op == ">>" and width == "5":
                self.warps[decl] = "32"
        self._memo: dict = {}

    def _is_tid_text(self, text: str, init) -> bool:
        if text == "threadIdx.x":
            return True
        ref = next((refers_to(n) for n in walk(init) if refers_to(n) is not None and refers_to(n).spelling == text),
                   None)
        return ref in self.tids

    def single_thread(self, guard) -> Group | None:
        """The group a guard picks one thread of, or None when it is no such guard."""
        children = list(guard.get_children())
        if len(children) != 2:  # an `else`, or an init statement: not a plain guard
            return None
        conjuncts = _conjuncts(self.unit, children[0])
        tid = lane = warp = None
        rest = []
        for part in conjuncts:
            zeroed = _zero_test(self.unit, part)
            if zeroed is not None and (zeroed == "threadIdx.x" or zeroed in self.tids):
                tid = part
            elif zeroed is not None and zeroed in self.lanes:
                lane = (part, zeroed)
            elif zeroed is not None and zeroed in self.warps:
                warp = (part, zeroed)
            else:
                rest.append(part)
        if tid is None and lane is not None and warp is not None and self.lanes[lane[1]] == self.warps[warp[1]]:
            tid = lane[0]  # warp 0's lane 0: thread 0 of the CTA
        elif warp is not None:
            rest.append(warp[0])
        conditions = [self.unit.code(p) for p in rest]
        if tid is not None:
            return Group("CTA", "threadIdx.x", "blockDim.x", conditions)
        if lane is not None:
            return Group("warp", lane[1].spelling, self.lanes[lane[1]], conditions)
        return None

    def uniform(self, expr, warp: bool = False) -> bool:
        for node in walk(expr):
            kind = node.kind.name
            if kind in ("ARRAY_SUBSCRIPT_EXPR", "LAMBDA_EXPR", "COMPOUND_ASSIGNMENT_OPERATOR"):
                return False
            if kind == "UNARY_OPERATOR" and operator(self.unit, node) in ("*", "++", "--", "&"):
                return False
            if kind == "BINARY_OPERATOR" and operator(self.unit, node) == "=":
                return False
            if kind == "CALL_EXPR" and node.referenced is not None and node.referenced.kind.name not in (
                    "CONSTRUCTOR",) and callee(node) not in PURE:
                return False
            target = refers_to(node)
            if target is not None and not self._uniform_decl(target, warp):
                return False
        return True

    def _uniform_decl(self, decl, warp: bool) -> bool:
        kind = decl.kind.name
        if decl.spelling == "threadIdx":
            return False
        if decl.spelling in GRID or kind in ("NON_TYPE_TEMPLATE_PARAMETER", "ENUM_CONSTANT_DECL", "FUNCTION_DECL",
                                              "FUNCTION_TEMPLATE", "CXX_METHOD"):
            return True
        if kind == "PARM_DECL":
            return decl not in self.assigned
        if kind != "VAR_DECL":
            return False
        if warp and decl in self.warps:
            return True
        tokens = {t.spelling for t in decl.get_tokens()}
        if is_shared(decl):
            return False
        if "constexpr" in tokens:
            return True
        key = (decl.hash, warp)
        if key in self._memo:
            return self._memo[key]
        self._memo[key] = False  # a cycle is not uniform
        if decl in self.assigned:
            result = self._uniform_counter(decl, warp)
        else:
            init = initializer(decl)
            result = init is not None and self.uniform(init, warp)
        self._memo[key] = result
        return result

    def _uniform_counter(self, decl, warp: bool) -> bool:
        """Whether `decl` is the variable of a `for` loop whose start, bound and step every thread agrees
        on, and which only the loop's step changes."""
        loop = self.up.get(self.up.get(decl))
        if loop is None or loop.kind.name != "FOR_STMT":
            return False
        parts = list(loop.get_children())
        if len(parts) != 4:
            return False
        init, cond, step, loop_body = parts
        if decl in written(self.unit, loop_body)[0]:
            return False
        start = initializer(decl)
        return (start is not None and self.uniform(start, warp) and self._uniform_but(cond, decl, warp)
                and self._uniform_but(step, decl, warp))

    def _uniform_but(self, expr, decl, warp: bool) -> bool:
        """Uniform, reading `decl` itself aside (the loop's own variable in its condition and step)."""
        for node in walk(expr):
            if refers_to(node) == decl:
                continue
            kind = node.kind.name
            if kind in ("DECL_REF_EXPR", "CALL_EXPR", "ARRAY_SUBSCRIPT_EXPR") and not self.uniform(node, warp):
                return False
        return True

    def converged(self, guard, warp: bool) -> str:
        """'' when every thread of the group reaches the guard together, else why not."""
        if not self.global_:
            return "in a __device__ function: whether its whole CTA reaches the guard is not known here"
        if self.two_d:
            return "the kernel uses threadIdx.y/z or blockDim.y/z (a 2-D block: the test picks a row of threads)"
        group = "warp" if warp else "CTA"
        node, enclosing = guard, []
        while node in self.up and node != self.function:
            parent = self.up[node]
            why = self._diverges(parent, node, warp)
            if why:
                return f"the guard is under {why} its {group}'s threads may disagree on"
            if parent.kind.name in LOOPS:
                enclosing.append(parent)
            node = parent
        start = self.unit.span(guard)[0]
        for jump in [n for n in walk(body(self.function)) if n.kind.name in JUMPS]:
            inside = any(self.unit.span(loop)[0] <= self.unit.span(jump)[0] < self.unit.span(loop)[1]
                         for loop in enclosing)
            if self.unit.span(jump)[0] >= start and not inside:
                continue
            if self._in_lambda(jump) or not self._leaves_past(jump, guard):
                continue
            node = jump
            while node in self.up and node != self.function:
                parent = self.up[node]
                if self._diverges(parent, node, warp):
                    what = jump.kind.name.split("_")[0].lower()
                    return (f"a {what} at line {self.unit.line_of(self.unit.span(jump)[0])} under a condition its "
                            f"{group}'s threads may disagree on")
                node = parent
        return ""

    def _leaves_past(self, jump, guard) -> bool:
        """Whether a jump can keep a thread from the guard: a `return`, or a `break`/`continue` of a loop
        (or `switch`) that holds the guard."""
        if jump.kind.name in ("RETURN_STMT", "GOTO_STMT"):
            return True
        node = jump
        targets = LOOPS + (("SWITCH_STMT",) if jump.kind.name == "BREAK_STMT" else ())
        while node in self.up:
            node = self.up[node]
            if node.kind.name in targets:
                a, b = self.unit.span(node)
                return a <= self.unit.span(guard)[0] < b
        return True

    def _in_lambda(self, node) -> bool:
        while node in self.up:
            node = self.up[node]
            if node.kind.name == "LAMBDA_EXPR":
                return True
        return False

    def _diverges(self, parent, child, warp: bool) -> str:
        """What about `parent` may send the group's threads different ways to `child` ('' if nothing)."""
        kind = parent.kind.name
        if kind == "LAMBDA_EXPR":
            return "a lambda"
        parts = list(parent.get_children())
        if kind in ("IF_STMT", "SWITCH_STMT", "WHILE_STMT") and parts and parts[0] != child:
            return "" if self.uniform(parts[0], warp) else "a condition"
        if kind == "DO_STMT" and parts and parts[-1] != child:
            return "" if self.uniform(parts[-1], warp) else "a loop condition"
        if kind == "FOR_STMT" and parts and parts[-1] == child:
            header = parts[:-1]
            decls = [d for p in header if p.kind.name == "DECL_STMT" for d in p.get_children()]
            if all(self._uniform_decl(d, warp) for d in decls) and all(
                    self._uniform_but(p, d, warp) for p in header if p.kind.name != "DECL_STMT" for d in decls or [None]):
                return ""
            return "a loop"
        if kind == "CXX_FOR_RANGE_STMT":
            return "a range loop"
        return ""


def initializer(decl):
    """The initialiser of a variable declaration, or None."""
    kids = [c for c in decl.get_children() if c.kind.name not in ("TYPE_REF", "NAMESPACE_REF", "TEMPLATE_REF")
            and not c.kind.name.endswith("_ATTR")]
    return kids[-1] if kids else None


def _conjuncts(unit: Unit, cond) -> list:
    cond = bare(cond)
    if cond.kind.name == "BINARY_OPERATOR" and operator(unit, cond) == "&&":
        left, right = list(cond.get_children())
        return _conjuncts(unit, left) + _conjuncts(unit, right)
    return [cond]


def _zero_test(unit: Unit, part):
    """`threadIdx.x` or the declaration `x` names for a test `x == 0` / `0 == x`, else None."""
    part = bare(part)
    if part.kind.name != "BINARY_OPERATOR" or operator(unit, part) != "==":
        return None
    sides = [bare(c) for c in part.get_children()]
    zero = [s for s in sides if s.kind.name == "INTEGER_LITERAL" and unit.code(s).rstrip("uUlL") == "0"]
    other = [s for s in sides if s not in zero]
    if len(zero) != 1 or len(other) != 1:
        return None
    if re.fullmatch(r"threadIdx\s*\.\s*x", unit.code(other[0])):
        return "threadIdx.x"
    return refers_to(other[0])


def is_shared(decl) -> bool:
    return decl.kind.name == "VAR_DECL" and ("CUDASHARED_ATTR" in attrs(decl)
                                             or "__shared__" in {t.spelling for t in decl.get_tokens()})
