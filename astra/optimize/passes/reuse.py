"""reuse: what does not change across a loop's iterations is computed once, before the loop.

    for (int i = tid; i < n; i += stride) {            const auto scale_v = scale[row];
      out[i] = in[i] * scale[row];              ->     for (int i = tid; i < n; i += stride) {
    }                                                    out[i] = in[i] * scale_v;
                                                       }

Two shapes (three under a tolerance, below), in the loops of `__global__` kernels (outermost first:
what an outer loop moved out, an inner one does not see again):
- a `const` local declared in the loop's body whose initialiser is loop-invariant moves above the loop
  whole (`const auto weight_vec = gmem.load(weight_ptr);` in a grid-stride loop over rows), where its
  name is declared once in the kernel;
- any other loop-invariant load in the body that runs on every iteration (not under an `if`, `?:`,
  `&&` or `||`: a guarded load may be out of range where the guard is false) becomes a `const auto`
  local above the loop, named after its pointer, and the loop reads the local.
Loop-invariant means: every name it reads is declared outside the loop (or by a declaration already
moved out) and is neither assigned, incremented nor taken the address of in it, nor has a member
assigned (`s.x += 1` changes `s`); it calls nothing but loads, casts, math functions and a template's
operators on operands of a dependent type (`a * b`, which libclang leaves an unnamed call where an
overload is in scope; its `+=`, `++` are assignments like any other); names may be template constants;
and every load reads memory the loop cannot change: no shared memory (no `__shared__` name, nor a name
initialised from one), nothing the loop calls is given a pointer (a store call, `v.store(p, ...)` or
`store_as<V>(p, ...)`, whose other arguments are no pointers, is a store through `p` instead), and the
loop stores nothing, or only into local arrays (when the load goes through a parameter), or only
through parameters other than the load's, where each such parameter or the load's is `__restrict__`
(restrict: memory written through one is reached through no other); or it reads an element of a thread's
own array (`x[r][0]` of `float x[2][4]`, not `__shared__` or `static`) that nothing but its name reaches
(every use in the kernel is an element: no `&x[i]`, no reference bound, no pointer made, no call given
it) and that the loop writes by no assignment, member call (`x[r].load(p)`) or call argument: no other
pointer, thread or call can change it. A row of an array (`x[r]`) is not moved (`const auto` would hold a
pointer). A store is an assignment to an
element, to a member of one (`p[i].x`, `p->x`) or through a reference, or a store call; one through
anything but a parameter may write any memory. A pointer to const, or an
element type the loop stores nowhere, is not taken as proof: another pointer of any type may write the
same memory. No load moves out of a loop that synchronises (`__syncthreads`, `__syncwarp`, a fence or
an atomic: another thread's stores may land between iterations), nor through a `volatile` pointer. A
load is `p[e]`, `*p`, `params.p[e]`, or a call named like one (`__ldg`, `__ldcs`, `load`, `load_as`,
...; not `__ldcv`, which reads memory expected to change) whose arguments are loop-invariant.

A third, under a spec whose tolerance admits approximate math (`fast_math.allows`, the one home of
that rule: never for a bit-exact spec): a float division `a / d` or `a /= d` whose divisor is
loop-invariant and not a literal becomes `a * d_rcp` with `const float d_rcp = 1.0f / (d);` above the
loop (x * (1/d) differs from x / d by an ulp or so, and is infinite where d is a denormal below 2^-128). A divisor
that loads is taken only where the division runs on every iteration; one of registers alone anywhere.
A divisor invariant in an outer loop goes above that loop.

Refused: loops with inline assembly, lambdas, `break`/`continue`/`return` (what follows one may not run
every iteration), or a PDL wait (a load moved above the wait would read before the previous kernel
wrote). A hoisted load runs even when the loop runs zero times; the
harness's memcheck sees an out-of-range one. The new local goes just above the loop's `#pragma` lines.
"""

from __future__ import annotations

import re

from astra.optimize.passes.base import ParsedPass, Refusal
from astra.optimize.passes.fast_math import allows
from astra.optimize.passes.syntax import (
    BARRIERS,
    LOOPS,
    Unit,
    assignment,
    bare,
    body,
    callee,
    every_iteration,
    fresh_name,
    has_asm,
    operator,
    own_statement,
    parents,
    pointer_stem,
    pragmas_above,
    refers_to,
    splice,
    stepped,
    stores,
    unresolved_operator,
    walk,
    written,
)

_STORES = ("store", "store_as")  # a call that writes the memory its first argument points to, and nothing else
_LOADS = ("__ldg", "__ldca", "__ldcg", "__ldcs", "__ldlu", "load", "load_as", "ld_global", "ldg")
_PURE = ("static_cast", "cast", "expf", "__expf", "logf", "__logf", "sqrtf", "rsqrtf", "fabsf", "fminf", "fmaxf",
         "min", "max", "abs", "exp2f", "__fdividef", "__frcp_rn", "__float2half", "__half2float", "__float2bfloat16",
         "__bfloat162float", "rsqrt", "sqrt", "exp", "log", "fmaf", "__fmaf_rn", "__fmul_rn", "__fadd_rn", "__fsub_rn",
         "__fdiv_rn", "tanhf", "sinf", "cosf", "__sinf", "__cosf", "exp2", "log2f", "__log2f", "__exp2f")
_VALUE_NODES = ("BINARY_OPERATOR", "UNARY_OPERATOR", "UNEXPOSED_EXPR", "PAREN_EXPR", "INTEGER_LITERAL",
                "FLOATING_LITERAL", "CXX_BOOL_LITERAL_EXPR", "DECL_REF_EXPR", "MEMBER_REF_EXPR", "CSTYLE_CAST_EXPR",
                "CXX_STATIC_CAST_EXPR", "CXX_FUNCTIONAL_CAST_EXPR", "TYPE_REF", "NAMESPACE_REF", "TEMPLATE_REF",
                "OVERLOADED_DECL_REF", "CALL_EXPR", "ARRAY_SUBSCRIPT_EXPR", "CONDITIONAL_OPERATOR",
                "CXX_REINTERPRET_CAST_EXPR")
# what a template's operator on an operand of dependent type computes from its operands and nothing else
# (`&&`, `||` left out: not every operand runs; unary `*` and `&` left out: a load, an address)
_VALUE_OPERATORS = ("+", "-", "*", "/", "%", "<<", ">>", "<", ">", "<=", ">=", "==", "!=", "&", "|", "^", "!", "~")
_BUILTINS = ("threadIdx", "blockIdx", "blockDim", "gridDim")
_DECLS = ("VAR_DECL", "PARM_DECL", "TEMPLATE_NON_TYPE_PARAMETER", "UNEXPOSED_DECL", "FIELD_DECL")
_WAITS = ("PDLWaitPrimary", "cudaGridDependencySynchronize", "griddepcontrol_wait")


class Reuse(ParsedPass):
    name = "reuse"
    family = "reuse"

    def rewrite(self, unit: Unit, spec: dict | None) -> tuple[str, str]:
        reciprocals, _ = allows(spec)
        edits: list[tuple[int, int, str]] = []
        done: list[str] = []
        for kernel in unit.kernels():
            if body(kernel) is None:
                continue
            up = parents(kernel)
            taken = {t.spelling for t in kernel.get_tokens() if t.kind.name == "IDENTIFIER"}
            shared = _shared_names(kernel)
            own = _own_arrays(unit, kernel, up)
            counts: dict[str, int] = {}
            covered: list[tuple[int, int]] = []  # what an outer loop already moved out
            for node in walk(kernel):
                if node.kind.name == "VAR_DECL":
                    counts[node.spelling] = counts.get(node.spelling, 0) + 1
            for loop in [n for n in walk(body(kernel)) if n.kind.name in LOOPS and unit.in_main(n)]:
                if _hazard(unit, loop) or not own_statement(unit, loop, up):
                    continue
                done += _hoist_loop(unit, loop, up, shared, own, taken, counts, edits, covered, reciprocals)
        if not edits:
            raise Refusal("no loop reads read-only memory or computes a value at a loop-invariant place")
        more = " ..." if len(done) > 4 else ""
        return splice(unit, edits), f"moved {len(done)} loop-invariant value(s) out of loops: {', '.join(done[:4])}{more}"


def _shared_names(kernel) -> set[str]:
    """Names declared `__shared__` in the kernel (and whatever is initialised from them)."""
    out = set()
    for node in walk(kernel):
        if node.kind.name == "VAR_DECL":
            tokens = {t.spelling for t in node.get_tokens()}
            if "__shared__" in tokens or tokens & out:
                out.add(node.spelling)
    return out


def _hazard(unit: Unit, loop) -> bool:
    """Inline asm, a lambda, a PDL wait, or a jump (what follows a `continue` may not run every iteration)."""
    kinds = {n.kind.name for n in walk(loop)}
    return has_asm(unit, loop) or bool(kinds & {"LAMBDA_EXPR", "CONTINUE_STMT", "BREAK_STMT", "RETURN_STMT",
                                                 "GOTO_STMT"}) or any(
        n.kind.name == "CALL_EXPR" and callee(n) in _WAITS for n in walk(loop))


def _loop_body(loop):
    children = list(loop.get_children())
    return children[0] if loop.kind.name == "DO_STMT" else children[-1]


class _Loop:
    """What one loop writes, and the test of whether an expression in it is the same every iteration."""

    def __init__(self, unit: Unit, loop, shared: set[str], own: set = frozenset()):
        self.unit, self.shared = unit, shared
        # the thread's own arrays the loop leaves alone: written in it by no assignment, member call or call
        self.own = own - _touched(unit, loop, own)
        self.assigned, self.made = written(unit, loop)
        bases = [bare(next(bare(next(s.get_children())).get_children())) for s in stores(unit, loop)]
        for target in _write_targets(unit, loop):
            written_in, base = _written_root(unit, target)
            if written_in is not None:
                self.assigned.add(written_in)
            if base is not None:
                bases.append(base)
        bases += [_pointer_root(unit, next(n.get_arguments())) for n in walk(loop) if _is_store_call(n)]
        self.stored = {unit.code(b) for b in bases}  # what the loop stores through, as written
        # the parameter each pointer store goes through, None for any other pointer; a local array is left
        # out (no parameter points into a thread's own array)
        self.store_roots = [_parameter(b) for b in bases if "[" not in b.type.spelling]
        self.writes = bool(bases)
        self.opaque = any(_passes_pointer(n) for n in walk(loop) if n.kind.name == "CALL_EXPR"
                          and callee(n) not in _LOADS and callee(n) not in _PURE and not _is_store_call(n)
                          and not _computes(unit, n) and not _operator_write(unit, n))
        # a barrier: other threads' stores (another branch's, in a warp-specialised kernel) land between iterations
        self.synchronises = any(n.kind.name == "CALL_EXPR" and (callee(n) in BARRIERS or callee(n).startswith(
            ("__sync", "__threadfence", "__barrier", "barrier"))) for n in walk(loop))
        self.outside: set = set()  # declarations moved out of the loop

    def invariant(self, expr) -> bool:
        loads = 0
        for node in walk(expr):
            kind = node.kind.name
            if kind not in _VALUE_NODES:
                return False
            if kind == "CALL_EXPR":
                name = callee(node)
                if _computes(self.unit, node):
                    continue  # its operands are the call's children, walked next
                if name in _LOADS:
                    loads += 1
                    if not self._readonly(node):
                        return False
                elif name not in _PURE:
                    return False
            elif kind == "ARRAY_SUBSCRIPT_EXPR" or (kind == "UNARY_OPERATOR" and operator(self.unit, node) == "*"):
                if not self._readonly(node):
                    return False
            elif kind == "UNARY_OPERATOR" and operator(self.unit, node) in ("++", "--"):
                return False
            elif kind == "UNARY_OPERATOR" and operator(self.unit, node) == "&" and (
                    bare(next(node.get_children())).kind.name != "ARRAY_SUBSCRIPT_EXPR"):
                return False  # the address of an element is arithmetic; of a variable, a way to write it
            target = refers_to(node)
            if target is None or target.spelling in _BUILTINS:
                continue
            if target.kind.name in ("FUNCTION_DECL", "FUNCTION_TEMPLATE", "CXX_METHOD", "OVERLOADED_DECL_REF"):
                continue  # a function (a template's overloaded name too): what it does is the call's to judge
            if target.spelling in self.shared or target.kind.name not in _DECLS:
                return False
            if target in self.assigned or (target in self.made and target not in self.outside):
                return False
        return True

    def _readonly(self, load) -> bool:
        """Whether the memory the load reads cannot change in the loop: it is not shared memory, nothing
        the loop calls is given a pointer, and the loop stores nothing, or only into local arrays, or
        through other parameters than the load's, each pair with a `__restrict__` side (memory written
        through a restrict pointer is reached through no other, and memory read through one is written
        through no other). A pointer to const or an element type the loop stores nowhere proves nothing:
        another pointer may write the same memory."""
        bases = [n for n in walk(load) if "*" in n.type.spelling and (
            (refers_to(n) is not None and refers_to(n).kind.name in _DECLS) or n.kind.name == "MEMBER_REF_EXPR")]
        if _array_root(load) in self.own:
            return True  # an element of a thread's own array, which only its name can write
        if not bases or self.opaque or self.synchronises:
            return False
        for base in bases:
            text = self.unit.code(base)
            if "volatile" in base.type.spelling:
                return False  # read again on every iteration by definition
            if text in self.stored or any(name in self.shared for name in re.findall(r"\w+", text)):
                return False
            param = _parameter(base)
            if not self.writes or (param is not None and not self.store_roots):
                continue  # no store, or stores into local arrays only, which no parameter points into
            if param is None or any(root is None or root == param or not (
                    param.type.is_restrict_qualified() or root.type.is_restrict_qualified())
                                    for root in self.store_roots):
                return False
        return True


def _array_root(node):
    """The declaration `a` of an element `a[i]`, `a[i][j]` read straight off a named array (every base an
    array: `p[i][k]` of an array of pointers reads what `p[i]` points to), or None."""
    node = bare(bare(node))
    while node.kind.name == "ARRAY_SUBSCRIPT_EXPR":
        node = bare(next(node.get_children()))
        if "[" not in node.type.spelling:
            return None
    target = refers_to(node)
    return target if target is not None and target.kind.name == "VAR_DECL" else None


def _own_arrays(unit: Unit, kernel, up: dict) -> set:
    """The kernel's local arrays (not `__shared__`, `static` or `volatile`) that nothing but their name can
    reach: every use is an element `a[i]...` (or its member), never a row used whole (`a` or `a[i]` of
    `a[2][4]` alone decays to a pointer), an address (`&a[i]`), a reference bound, a member call other than
    a load or store of the element whole (`a[i].data()` may keep a pointer) or an argument of a call other
    than a cast, math function or a template's operator."""
    arrays = {n for n in walk(kernel) if n.kind.name == "VAR_DECL" and "[" in n.type.spelling
              and "volatile" not in n.type.spelling
              and not {t.spelling for t in n.get_tokens()} & {"__shared__", "static", "extern"}}
    for node in walk(kernel):
        target = refers_to(node)
        if target not in arrays:
            continue
        element, parent = node, up.get(node)
        while parent is not None and next(parent.get_children(), None) == element and (
                parent.kind.name in ("UNEXPOSED_EXPR", "PAREN_EXPR", "ARRAY_SUBSCRIPT_EXPR", "MEMBER_REF_EXPR")
                or (parent.kind.name == "CALL_EXPR" and callee(parent) == "operator[]")):
            element, parent = parent, up.get(parent)
        if parent is None or _escapes(unit, element, parent):
            arrays.discard(target)
    return arrays


def _escapes(unit: Unit, element, parent) -> bool:
    """Whether the use `element` (an array's element, row or member) of its `parent` may let a pointer or
    reference to the array out, or hands the array to code that may write it unseen."""
    if "[" in bare(element).type.spelling or bare(element).kind.name == "DECL_REF_EXPR":
        return True  # a row or the array itself, used whole: it decays to a pointer
    if parent.kind.name == "UNARY_OPERATOR" and operator(unit, parent) == "&":
        return True
    if parent.kind.name == "VAR_DECL" and "&" in parent.type.spelling:
        return True
    if parent.kind.name != "CALL_EXPR":
        return False
    if element.kind.name == "MEMBER_REF_EXPR":
        return callee(parent) not in _LOADS + _STORES  # `a[i].load(p)` writes the element whole
    if element == next(parent.get_children()):
        return not (_computes(unit, parent) or _operator_write(unit, parent) or assignment(unit, parent))
    return callee(parent) not in _PURE and not _computes(unit, parent)


def _touched(unit: Unit, loop, own: set) -> set:
    """The arrays of `own` the loop may write: named in what it assigns or increments, in the object of a
    member call (`a[i].load(p)`) or in an argument of a call other than a cast, math function or
    element access."""
    out = set()
    for target in _write_targets(unit, loop):
        out |= {refers_to(n) for n in walk(target)} & own
    for node in walk(loop):
        if node.kind.name == "CALL_EXPR" and callee(node) not in _PURE and callee(node) != "operator[]" and (
                not _computes(unit, node)):
            out |= {refers_to(n) for n in walk(node)} & own
    return out


def _parameter(base):
    """The function parameter a pointer expression is (`p`), or None for anything else."""
    target = refers_to(bare(base))
    return target if target is not None and target.kind.name == "PARM_DECL" else None


def _write_targets(unit: Unit, root):
    """What the assignments and increments under `root` write, a template's unnamed operator calls included."""
    for node in walk(root):
        if assignment(unit, node) or _operator_write(unit, node):
            yield bare(next(node.get_children()))
        elif stepped(unit, node) is not None and operator(unit, node) in ("++", "--"):
            yield stepped(unit, node)


def _written_root(unit: Unit, target) -> tuple:
    """(the variable a write changes, None) for a variable or a member of one (`s.x += 1` changes `s`);
    (None, the pointer it goes through) for memory (`p[i].x = v`, `p->x = v`, a reference); a pointer
    no parameter is stands for memory any pointer may reach."""
    node = bare(target)
    while node.kind.name == "MEMBER_REF_EXPR":
        base = bare(next(node.get_children()))
        if "*" in base.type.spelling:
            return None, base  # p->x
        node = base
    if node.kind.name == "ARRAY_SUBSCRIPT_EXPR" or (
            node.kind.name == "UNARY_OPERATOR" and operator(unit, node) == "*"):
        return None, bare(next(node.get_children()))
    ref = refers_to(node)
    if ref is None:
        return None, node
    return ref, (node if "&" in ref.type.spelling else None)  # a reference writes what it refers to


def _is_store_call(node) -> bool:
    """`v.store(p, ...)`, `store_as<V>(p, v, ...)`: a call named like a store whose other arguments are no
    pointers or arrays; it writes what its first argument points to, and nothing else."""
    if node.kind.name != "CALL_EXPR" or callee(node) not in _STORES:
        return False
    args = list(node.get_arguments())
    return bool(args) and not any("*" in a.type.spelling or "[" in a.type.spelling for a in args[1:])


def _pointer_root(unit: Unit, pointer):
    """The pointer an address starts from: `p` of `p`, `p + k`, `p - k`."""
    node = bare(pointer)
    while node.kind.name == "BINARY_OPERATOR" and operator(unit, node) in ("+", "-") and (
            "*" in bare(next(node.get_children())).type.spelling):
        node = bare(next(node.get_children()))
    return node


def _computes(unit: Unit, call) -> bool:
    """Whether a call is a template's unnamed operator that computes a value from its operands alone
    (`a * b` on operands of a dependent type), not an assignment, increment, load or address."""
    op = unresolved_operator(unit, call)
    operands = len(list(call.get_children())) - 1
    return op in _VALUE_OPERATORS and (operands == 2 or op in ("-", "+", "!", "~"))


def _operator_write(unit: Unit, call) -> bool:
    """Whether a call is a template's unnamed assignment or increment (`x += y`, `++x` on a dependent type)."""
    op = unresolved_operator(unit, call)
    return op in ("++", "--") or (op.endswith("=") and op not in ("==", "!=", "<=", ">="))


def _passes_pointer(call) -> bool:
    """Whether a call is given a pointer or an array (it may store through it) or an argument of a type
    libclang cannot tell in a template."""
    for arg in call.get_arguments():
        spelled = arg.type.spelling
        if "*" in spelled or "[" in spelled or not spelled or "dependent" in spelled:
            return True
    return False


def _hoist_loop(unit: Unit, loop, up: dict, shared: set[str], own: set, taken: set, counts: dict, edits: list,
                moved: list, reciprocals: bool) -> list[str]:
    facts = _Loop(unit, loop, shared, own)
    loop_body = _loop_body(loop)
    if loop_body.kind.name != "COMPOUND_STMT" or any(a <= unit.span(loop)[0] < b for a, b in moved):
        return []
    lines: list[str] = []
    done: list[str] = []
    for stmt in loop_body.get_children():
        decl = _const_decl(unit, stmt)
        if decl is None or counts.get(decl.spelling, 0) != 1:
            continue
        init = list(decl.get_children())[-1] if list(decl.get_children()) else None
        if init is None or not facts.invariant(init) or not _worth(unit, init):
            continue
        facts.outside.add(decl)
        lines.append(unit.code(stmt).strip() + ("" if unit.code(stmt).strip().endswith(";") else ";"))
        start, end = unit.span(stmt)
        line_begin, line_end = unit.line_start(start), unit.data.find(b"\n", end)
        alone = not unit.data[line_begin:start].strip() and not unit.data[end:line_end].strip(b" \t;")
        edits.append((line_begin, line_end + 1, "") if alone else (start, end, ""))
        moved.append((start, end))
        done.append(decl.spelling)
    if reciprocals:
        done += _reciprocals(unit, loop_body, up, facts, taken, edits, moved, lines)
    names: dict[str, str] = {}
    for node in walk(loop_body):
        if any(a <= node.extent.start.offset < b for a, b in moved):
            continue
        if not _is_load(unit, node) or not _read_as_value(unit, node, up) or not facts.invariant(node):
            continue
        if "[" in node.type.spelling:
            continue  # a row of an array: `const auto` would hold a pointer to it, not its values
        if not every_iteration(unit, node, loop_body, up):
            continue  # a load under a condition may be out of range where the condition is false
        text = re.sub(r"\s+", " ", unit.code(node))
        if text not in names:
            names[text] = fresh_name(_pointer_name(node), taken)
            lines.append(f"const auto {names[text]} = {text};")
            done.append(text)
        start, end = unit.span(node)
        edits.append((start, end, names[text]))
        moved.append((start, end))
    if lines:
        at = pragmas_above(unit, unit.span(loop)[0])
        indent = unit.indent(unit.span(loop)[0])
        edits.append((at, at, "".join(f"{indent}{line}\n" for line in lines)))
    return done


def _reciprocals(unit: Unit, loop_body, up: dict, facts: _Loop, taken: set, edits: list, moved: list,
                 lines: list) -> list[str]:
    """`a / d` and `a /= d` on floats, `d` loop-invariant and not a literal: `1.0f / (d)` once above the loop,
    a multiplication in it. A divisor that loads must be read on every iteration (a guarded load may be
    out of range where the guard is false); one made of registers alone is safe to compute anywhere."""
    done: list[str] = []
    names: dict[str, str] = {}
    for node in walk(loop_body):
        if node.kind.name not in ("BINARY_OPERATOR", "COMPOUND_ASSIGNMENT_OPERATOR"):
            continue
        if operator(unit, node) not in ("/", "/=") or node.type.spelling != "float":
            continue
        if any(a <= node.extent.start.offset < b for a, b in moved) or _in_constant(node, up):
            continue
        lhs, rhs = list(node.get_children())
        if any(a <= rhs.extent.start.offset < b for a, b in moved):
            continue  # an outer loop took it, or a load in it already moved
        if bare(rhs).kind.name in ("INTEGER_LITERAL", "FLOATING_LITERAL") or not facts.invariant(rhs):
            continue
        if "float" not in bare(rhs).type.spelling and "int" not in bare(rhs).type.spelling:
            continue  # a double divisor: the division is done in double
        if any(_is_load(unit, n) for n in walk(rhs)) and not every_iteration(unit, node, loop_body, up):
            continue
        text = re.sub(r"\s+", " ", unit.code(rhs)).strip()
        if text not in names:
            words = re.findall(r"[A-Za-z_]\w*", text)
            names[text] = fresh_name(f"{pointer_stem(words[0]) if words else 'divisor'}_rcp", taken)
            lines.append(f"const float {names[text]} = 1.0f / ({text});")
            done.append(f"1 / {text}")
        times = " * " if operator(unit, node) == "/" else " *= "
        edits.append((unit.span(lhs)[1], unit.span(rhs)[1], f"{times}{names[text]}"))
        moved.append(unit.span(rhs))
    return done


def _in_constant(node, up: dict) -> bool:
    """Whether `node` initialises a `constexpr` or `static` variable (no run-time value can)."""
    while node in up:
        node = up[node]
        if node.kind.name == "VAR_DECL":
            tokens = {t.spelling for t in node.get_tokens()}
            return bool(tokens & {"constexpr", "static"})
        if node.kind.name in ("COMPOUND_STMT", "FOR_STMT", "IF_STMT"):
            return False
    return False


def _const_decl(unit: Unit, stmt):
    """The variable of `const T name = init;` (one variable, no array, not static or shared), or None."""
    if stmt.kind.name != "DECL_STMT":
        return None
    decls = list(stmt.get_children())
    if len(decls) != 1 or decls[0].kind.name != "VAR_DECL":
        return None
    tokens = [t.spelling for t in stmt.get_tokens()]
    if "const" not in tokens[:3] or {"static", "__shared__", "[", "&", "constexpr"} & set(tokens[:tokens.index(
            decls[0].spelling)] if decls[0].spelling in tokens else tokens):
        return None
    return decls[0]


def _worth(unit: Unit, init) -> bool:
    """Whether moving the initialiser saves work: it loads, calls or computes (not just renames)."""
    return any(n.kind.name in ("CALL_EXPR", "ARRAY_SUBSCRIPT_EXPR", "BINARY_OPERATOR", "MEMBER_REF_EXPR") or (
        n.kind.name == "UNARY_OPERATOR" and operator(unit, n) == "*") for n in walk(init))


def _is_load(unit: Unit, node) -> bool:
    kind = node.kind.name
    if kind == "ARRAY_SUBSCRIPT_EXPR":
        return True
    if kind == "UNARY_OPERATOR" and operator(unit, node) == "*":
        return True
    return kind == "CALL_EXPR" and callee(node) in _LOADS


def _read_as_value(unit: Unit, node, up: dict) -> bool:
    """Neither assigned to, nor under `&`, nor the argument of a load call (that call is the load)."""
    parent = up.get(node)
    while parent is not None and parent.kind.name in ("UNEXPOSED_EXPR", "PAREN_EXPR"):
        node, parent = parent, up.get(parent)
    if parent is None:
        return False
    kind = parent.kind.name
    if stepped(unit, parent) is not None or ((assignment(unit, parent) or _operator_write(unit, parent))
                                             and next(parent.get_children()) == node):
        return False
    if kind == "CALL_EXPR" and callee(parent) in _LOADS:
        return False
    return True


def _pointer_name(load) -> str:
    ref = next((refers_to(n) for n in walk(load) if refers_to(n) is not None and refers_to(n).kind.name in _DECLS
                and ("*" in refers_to(n).type.spelling or "[" in refers_to(n).type.spelling)), None)
    stem = ref.spelling if ref is not None else "loaded"
    return pointer_stem(stem) + "_v"
