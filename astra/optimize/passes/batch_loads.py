"""batch_loads: an unrolled loop's loads of every iteration issued before its first store.

    #pragma unroll                                    Vec x_batch[kIters];
    for (int i = 0; i < kIters; ++i) {                #pragma unroll
      Vec x;                                          for (int i = 0; i < kIters; ++i) {
      x.load(in + i * 512 + tid * 4);          ->       x_batch[i].load(in + i * 512 + tid * 4);
      ... compute ...                                 }
      y.store(out + i * 512 + tid * 4);               #pragma unroll
    }                                                 for (int i = 0; i < kIters; ++i) {
                                                        Vec& x = x_batch[i];
                                                        ... compute ...
                                                        y.store(out + i * 512 + tid * 4);
                                                      }

Why: the compiler may not move a load above a store through a pointer it cannot prove distinct (two
pointers of a struct, two parameters without `__restrict__`), so each iteration's loads wait for the
previous iteration's store and a thread pays one memory latency per iteration. Where a row has few CTAs
(decode), nothing else hides that latency. Written out, the loads of all iterations are in flight at once.

What is taken: a `for` loop under `#pragma unroll` (no count: the arrays are indexed by constants only
once unrolled) of a `__global__` or `__device__` function, counting `i` from 0 by one to a compile-time
constant (a literal, a `constexpr` or `const` variable, a template's value parameter, an enumerator),
whose body opens with loads: `Vec x;` then `x.load(...)` (a load call on the variable), or
`T x = <load>;` (`p[e]`, `*p`, `__ldg(...)`, `load_as<V>(p, i)`, ...), between declarations of
indices whose initialisers load and call nothing (`const int offset = row * kHidden + i * 512;`).
Those opening loads go to a loop of their own (with the indices they use); in the loop left, each
loaded variable is a reference to its slot of the array, so the code after reads and writes it as
before.

Refused: a loop that is not a statement of a block (the body of an unbraced `for` or `if`); a loop with a
barrier, fence, atomic or PDL wait (another thread's stores may land between two iterations), inline
assembly that touches memory or synchronises (`rcp.approx` computes and is taken), a lambda, `break`,
`continue`, `return` or `goto` (a later iteration may not run, and its loads would read what the original
never read); a call that may store or synchronise: a function of this file that stores, writes a variable
outside it or a member, or calls such a function (read three calls deep), one defined elsewhere given a
pointer, a reference or a class holding pointers, or any call named like a barrier or an atomic (`sync`,
`arrive`, `wait`, `barrier`, `fence`, `atomic`); a load whose address, or an index declaration it reads,
reads a loaded value or a variable the loop changes (assigned, incremented, a member assigned, handed to
a call, a method called on it), a member through `this` in a member function, or a `volatile` pointer;
no store through a pointer or into shared memory after the loads (nothing holds them back); a type
libclang cannot name (`auto`, a dependent type it leaves unresolved); more than `BUDGET` bytes of batched
values per thread where the trip count is a number (a literal, `constexpr` arithmetic); a statement that
shares its line (a trailing `//` comment is kept); a load written other than as `x.load(...)` (a macro).

What the move assumes, as the kernel's interface does: a store and a load through different pointers
(different names, as written) write and read different buffers, or the same buffer at the same element
(an op run in place). An op whose output overlaps its input at an offset would read, in the original,
values an earlier iteration wrote, and here the values before. A store and a load through the same
pointer must use the same address expression, one that reads the counter through sums and products only
(each iteration's own element), else the loop is refused.
"""

from __future__ import annotations

import re

from astra.optimize.passes.base import ParsedPass, Refusal
from astra.optimize.passes.reuse import (
    _LOADS,
    _PURE,
    _STORES,
    _WAITS,
    _computes,
    _is_store_call,
    _passes_pointer,
    _pointer_root,
    _write_targets,
    _written_root,
)
from astra.optimize.passes.syntax import (
    BARRIERS,
    Unit,
    assignment,
    bare,
    body,
    callee,
    fresh_name,
    operator,
    parents,
    pragmas_above,
    refers_to,
    statement_parent,
    stores,
    walk,
    written,
)

BUDGET = 512  # bytes of batched values per thread (128 registers) where their size is known
_JUMPS = {"LAMBDA_EXPR", "CONTINUE_STMT", "BREAK_STMT", "RETURN_STMT", "GOTO_STMT"}
_HEADER = re.compile(r"^\s*(?:const\s+)?(?:unsigned\s+int|unsigned|int|uint32_t|int32_t|int64_t|uint64_t|size_t|"
                     r"long|auto)\s+(?P<i>\w+)\s*=\s*0\s*;\s*(?P=i)\s*<\s*(?P<n>[^;]+?)\s*;\s*"
                     r"(?:\+\+\s*(?P=i)|(?P=i)\s*\+\+|(?P=i)\s*\+=\s*1)\s*$", re.S)
_CONSTANT_KINDS = ("TEMPLATE_NON_TYPE_PARAMETER", "ENUM_CONSTANT_DECL", "NON_TYPE_TEMPLATE_PARAMETER")


class BatchLoads(ParsedPass):
    name = "batch_loads"
    family = "batch"

    def rewrite(self, unit: Unit, spec: dict | None) -> tuple[str, str]:
        sites = []
        for function in unit.device_functions():
            if body(function) is None:
                continue
            taken = {t.spelling for t in function.get_tokens() if t.kind.name == "IDENTIFIER"}
            up = parents(function)
            for loop in walk(body(function)):
                if loop.kind.name == "FOR_STMT" and unit.in_main(loop):
                    where = f"{function.spelling} line {unit.line_of(unit.span(loop)[0])}"
                    sites.append((where, loop, lambda loop=loop, taken=taken, up=up, function=function:
                                  _guarded_batch(unit, function, loop, up, taken)))
        return self.rewrite_each(unit, sites, "loads of every iteration issued before the stores",
                                 "no for loop in device code")


def _guarded_batch(unit: Unit, function, loop, up: dict, taken: set) -> tuple[int, int, str, str]:
    """`_batch`, a shape the pass's reading of the tree does not expect refused rather than raised (one loop must
    not stop a survey of every module)."""
    try:
        return _batch(unit, function, loop, up, taken)
    except (StopIteration, AssertionError, IndexError, AttributeError) as err:
        raise Refusal(f"a shape this pass does not read ({type(err).__name__})") from err


def _batch(unit: Unit, function, loop, up: dict, taken: set) -> tuple[int, int, str, str]:
    if statement_parent(loop, up) is None:
        raise Refusal("the loop is not a statement of a block (the body of an unbraced `for` or `if`)")
    header, loop_body = _parts(unit, loop)
    counter, count = header
    pragmas = _pragmas(unit, loop)
    _check_hazards(unit, loop)
    stmts = list(loop_body.get_children())
    loaded, indices, end = _opening(unit, stmts, counter)
    if not loaded:
        raise Refusal("the body does not open with loads (`Vec x; x.load(p + i)` or `T x = p[i];`)")
    rest = stmts[end:]
    _check_rest(unit, function, loop, rest, loaded, indices, counter)
    size = sum(v.size for v in loaded)
    trips = _trips(unit, loop)
    if trips is not None and size > 0 and size * trips > BUDGET:
        raise Refusal(f"{size * trips} bytes of batched values per thread ({trips} iterations of {size} B), more "
                      f"than {BUDGET}")

    names = {v.decl.spelling: fresh_name(f"{v.decl.spelling}_batch", taken) for v in loaded}
    start = unit.span(loop)[0]
    indent = unit.indent(start)
    inner = indent + "  "
    head = unit.data[start:unit.span(loop_body)[0]].decode().rstrip()
    used = _needed(unit, loaded, indices)
    lines = [f"{indent}{v.type_text} {names[v.decl.spelling]}[{count}];" for v in loaded]
    lines += pragmas
    lines.append(f"{indent}{head} {{")
    for stmt in stmts[:end]:
        if stmt in used:
            lines.append(f"{inner}{unit.code(stmt).strip()}" + ("" if unit.code(stmt).strip().endswith(";") else ";"))
        for v in loaded:
            if stmt == v.load_stmt:
                lines.append(f"{inner}{_into_slot(unit, v, names[v.decl.spelling], counter)}")
    lines.append(f"{indent}}}")
    lines += pragmas

    # the loop left: each loaded variable a reference to its slot; its load gone; indices nothing reads dropped
    edits: list[tuple[int, int, str]] = []
    still = _read_after(unit, stmts, end, loaded, indices)
    for stmt in stmts[:end]:
        v = next((v for v in loaded if stmt in (v.decl_stmt, v.load_stmt)), None)
        if v is not None and stmt == v.decl_stmt:
            const = " const" if v.const else ""
            edits.append(_line_edit(unit, stmt, f"{v.type_text}{const}& {v.decl.spelling} = "
                                                f"{names[v.decl.spelling]}[{counter}];"))
        elif v is not None:
            edits.append(_line_edit(unit, stmt, None))
        elif stmt in indices and stmt not in still:
            edits.append(_line_edit(unit, stmt, None))
    loop_start, loop_end = unit.span(loop)
    rebuilt = _splice_within(unit, loop_start, loop_end, edits)
    at = pragmas_above(unit, loop_start)
    text = "\n".join(lines) + "\n" + indent + rebuilt
    what = ", ".join(v.decl.spelling for v in loaded)
    return at, loop_end, text, f"{what}; {count} iterations"


class _Loaded:
    """A variable of the loop's opening that a load fills: its declaration, the load, its type as written."""

    def __init__(self, decl, decl_stmt, load_stmt, type_text: str, const: bool, size: int):
        self.decl, self.decl_stmt, self.load_stmt = decl, decl_stmt, load_stmt
        self.type_text, self.const, self.size = type_text, const, size
        self.address = None  # the pointer argument, or the load expression (for the alias check)
        self.args: list = []  # every node the address is made of: a load call's arguments (`load(p, i)`)


def _parts(unit: Unit, loop):
    """((counter name, count text), body) of `for (int i = 0; i < N; ++i) { ... }` with N a constant."""
    children = list(loop.get_children())
    loop_body = children[-1] if children else None
    if loop_body is None or loop_body.kind.name != "COMPOUND_STMT":
        raise Refusal("the loop's body is not a block")
    start = unit.span(loop)[0]
    text = unit.data[start:unit.span(loop_body)[0]].decode()
    m = re.match(r"\s*for\s*\((.*)\)\s*$", text, re.S)
    header = _HEADER.match(m.group(1)) if m else None
    if header is None:
        raise Refusal("not `for (int i = 0; i < N; ++i)`")
    cond = next((c for c in children if c.kind.name == "BINARY_OPERATOR" and operator(unit, c) == "<"), None)
    if cond is None or not _constant(list(cond.get_children())[1]):
        raise Refusal(f"the trip count `{header.group('n')}` is not a compile-time constant")
    counter = header.group("i")
    assigned, _ = written(unit, loop_body)
    if any(d.spelling == counter for d in assigned):
        raise Refusal(f"the body changes the counter `{counter}`")
    return (counter, re.sub(r"\s+", " ", header.group("n")).strip()), loop_body


def _constant(node) -> bool:
    """Whether an expression is known at compile time: literals, `sizeof`, enumerators, template values,
    `constexpr` or `const` variables initialised by constants."""
    for n in walk(node):
        kind = n.kind.name
        if kind == "DECL_REF_EXPR":
            target = n.referenced
            if target is None:
                return False
            if target.kind.name in _CONSTANT_KINDS:
                continue
            if target.kind.name == "VAR_DECL":
                tokens = [t.spelling for t in target.get_tokens()]
                if "constexpr" in tokens or (target.type.is_const_qualified() and "[" not in target.type.spelling
                                             and _initialised_by_constant(target)):
                    continue
            return False
        if kind in ("CALL_EXPR", "ARRAY_SUBSCRIPT_EXPR", "MEMBER_REF_EXPR"):
            return False
    return True


def _initialised_by_constant(decl) -> bool:
    init = [c for c in decl.get_children() if c.kind.name not in ("TYPE_REF", "NAMESPACE_REF", "TEMPLATE_REF")]
    return bool(init) and _constant(init[-1])


def _trips(unit: Unit, loop) -> int | None:
    """The trip count where it is a number: a literal, or `constexpr`/`const` integers and arithmetic of them
    (`kHidden / (kThreads * 4)`); None for a template's value (the budget is not checked then)."""
    cond = next((c for c in loop.get_children() if c.kind.name == "BINARY_OPERATOR"), None)
    return _number(unit, list(cond.get_children())[1]) if cond is not None else None


def _number(unit: Unit, node, depth: int = 0) -> int | None:
    if depth > 16:
        return None
    node = bare(node)
    kind = node.kind.name
    kids = list(node.get_children())
    if kind == "INTEGER_LITERAL":
        text = "".join(t.spelling for t in node.get_tokens()).rstrip("uUlL")
        return int(text, 0) if re.fullmatch(r"(0[xX])?[0-9a-fA-F]+", text) else None
    if kind in ("CSTYLE_CAST_EXPR", "CXX_STATIC_CAST_EXPR", "CXX_FUNCTIONAL_CAST_EXPR") and kids:
        return _number(unit, kids[-1], depth + 1)
    if kind == "DECL_REF_EXPR" and node.referenced is not None and node.referenced.kind.name == "VAR_DECL":
        init = [c for c in node.referenced.get_children() if c.kind.name not in ("TYPE_REF", "NAMESPACE_REF")]
        return _number(unit, init[-1], depth + 1) if init else None
    if kind == "BINARY_OPERATOR" and len(kids) == 2:
        a, b = _number(unit, kids[0], depth + 1), _number(unit, kids[1], depth + 1)
        op = operator(unit, node)
        if a is None or b is None or op not in ("+", "-", "*", "/", "%", "<<", ">>"):
            return None
        try:
            return {"+": a + b, "-": a - b, "*": a * b, "/": a // b if b else None, "%": a % b if b else None,
                    "<<": a << b, ">>": a >> b}[op]
        except (ValueError, OverflowError):
            return None
    return None


def _pragmas(unit: Unit, loop) -> list[str]:
    """The `#pragma` lines right above the loop; one must be `#pragma unroll` without a count."""
    at = pragmas_above(unit, unit.span(loop)[0])
    lines = [line.rstrip() for line in unit.data[at:unit.line_start(unit.span(loop)[0])].decode().splitlines()
             if line.strip()]
    if not any(re.fullmatch(r"\s*#pragma\s+unroll", line) for line in lines):
        raise Refusal("not under `#pragma unroll` (the arrays need constant indices)")
    return lines


def _check_hazards(unit: Unit, loop) -> None:
    kinds = {n.kind.name for n in walk(loop)}
    if kinds & _JUMPS:
        raise Refusal("the loop jumps (`break`, `continue`, `return`, `goto`) or holds a lambda: a later "
                      "iteration may not run")
    if _memory_asm(unit, loop):
        raise Refusal("the loop holds inline assembly that touches memory or synchronises")


def _opening(unit: Unit, stmts: list, counter: str):
    """The loaded variables of the body's opening statements, the index declarations among them, and where
    the opening ends."""
    loaded: list[_Loaded] = []
    pending: dict = {}  # `Vec x;` waiting for its `x.load(...)`
    indices: list = []
    end = 0
    for k, stmt in enumerate(stmts):
        decl = _single_decl(stmt)
        if decl is not None:
            init = _initialiser(decl)
            if init is None:
                if _type_text(unit, decl, stmt) is None:
                    break
                pending[decl] = stmt
            elif _is_load_expr(unit, init):
                type_text = _resolved_type(decl)
                if type_text is None:
                    break
                v = _Loaded(decl, stmt, stmt, type_text, decl.type.is_const_qualified(), _size(decl))
                v.address = init
                v.args = [init]
                loaded.append(v)
            elif _pure(unit, init):
                indices.append(stmt)
            else:
                break
            end = k + 1
            continue
        call = bare(stmt)
        if call.kind.name == "CALL_EXPR" and callee(call) in _LOADS:
            head = bare(next(call.get_children()))
            obj = bare(next(head.get_children(), head)) if head.kind.name == "MEMBER_REF_EXPR" else None
            target = refers_to(obj) if obj is not None else None
            if target in pending:
                decl_stmt = pending.pop(target)
                v = _Loaded(target, decl_stmt, stmt, _type_text(unit, target, decl_stmt), False, _size(target))
                v.args = list(call.get_arguments())
                v.address = v.args[0] if v.args else None
                loaded.append(v)
                end = k + 1
                continue
        break
    for v in loaded:
        if v.address is None:
            raise Refusal(f"the load of `{v.decl.spelling}` has no address argument")
    # a declaration the opening made and never loaded (`Vec out;`) stays where it is, in the loop left
    return loaded, indices, end


def _single_decl(stmt):
    if stmt.kind.name != "DECL_STMT":
        return None
    decls = list(stmt.get_children())
    if len(decls) != 1 or decls[0].kind.name != "VAR_DECL":
        return None
    tokens = {t.spelling for t in stmt.get_tokens()}
    if tokens & {"static", "__shared__", "extern", "volatile"}:
        return None
    return decls[0]


def _initialiser(decl):
    kids = [c for c in decl.get_children() if c.kind.name not in ("TYPE_REF", "NAMESPACE_REF", "TEMPLATE_REF")]
    if not kids:
        return None
    tokens = [t.spelling for t in decl.get_tokens()]
    return kids[-1] if "=" in tokens or "{" in tokens else None


def _type_text(unit: Unit, decl, stmt) -> str | None:
    """The type `Vec x;` declares, as written (no array, reference, pointer or `auto`)."""
    text = unit.code(stmt).strip().rstrip(";").strip()
    m = re.fullmatch(rf"(?P<t>.+?)\s+{re.escape(decl.spelling)}", text, re.S)
    if m is None:
        return None
    t = re.sub(r"\s+", " ", m.group("t")).strip()
    if "auto" in t.split() or "&" in t or "*" in t or "[" in text:
        return None
    return t


def _resolved_type(decl) -> str | None:
    """The type of `T x = <load>;` as clang names it, its own `const` dropped (a pointer's pointee keeps
    its `const`: `const float *`); None where clang cannot name it (`auto` in a template, a reference, an
    array)."""
    spelled = decl.type.spelling
    if not spelled or "auto" in spelled or "&" in spelled or "[" in spelled or "type-parameter" in spelled:
        return None
    if not decl.type.is_const_qualified():
        return spelled.strip()
    if "*" in spelled:
        return re.sub(r"\s*\bconst\s*$", "", spelled).strip()  # `const float *const` -> `const float *`
    return re.sub(r"^\s*const\s+", "", spelled).strip()


def _size(decl) -> int:
    size = decl.type.get_size()
    return size if isinstance(size, int) and size > 0 else 0


def _is_load_expr(unit: Unit, node) -> bool:
    node = _unwrapped(node)
    kind = node.kind.name
    if kind == "ARRAY_SUBSCRIPT_EXPR":
        base = bare(next(node.get_children()))
        return "*" in base.type.spelling
    if kind == "UNARY_OPERATOR" and operator(unit, node) == "*":
        return True
    return kind == "CALL_EXPR" and callee(node) in _LOADS


def _unwrapped(node):
    """An initialiser without its casts and the copy a class type's initialisation makes."""
    while True:
        node = bare(node)
        kids = list(node.get_children())
        if node.kind.name in ("CSTYLE_CAST_EXPR", "CXX_STATIC_CAST_EXPR", "CXX_FUNCTIONAL_CAST_EXPR") and kids:
            node = kids[-1]
        elif node.kind.name == "CALL_EXPR" and len(kids) == 1 and node.spelling and node.spelling == bare(
                node).type.spelling.split("<")[0].split("::")[-1].replace("const ", "").strip():
            node = kids[0]  # the copy constructor of `float4 v = *p;`
        else:
            return node


def _pure(unit: Unit, init) -> bool:
    """An index: nothing loaded, nothing called but casts and math, nothing written."""
    for n in walk(init):
        kind = n.kind.name
        if kind == "ARRAY_SUBSCRIPT_EXPR" or (kind == "UNARY_OPERATOR" and operator(unit, n) in ("*", "++", "--", "&")):
            return False
        if kind == "CALL_EXPR" and callee(n) not in _PURE and not _computes(unit, n) and n.spelling:
            return False
        if kind in ("BINARY_OPERATOR", "COMPOUND_ASSIGNMENT_OPERATOR") and operator(unit, n).endswith("=") and (
                operator(unit, n) not in ("==", "!=", "<=", ">=")):
            return False
    return True


def _check_rest(unit: Unit, function, loop, rest: list, loaded: list, indices: list, counter: str) -> None:
    """The loads may move: what their addresses read (through the index declarations too) is neither a loaded
    value nor anything the loop writes, assigns a member of, hands to a call or calls a method on; nothing the
    loop calls may store or synchronise; a store follows them; a pointer loaded and stored in the loop is stored
    at the element it was read from, an element that moves with the counter."""
    by_decl = {_single_decl(s): s for s in indices}
    names = {v.decl for v in loaded}
    _check_calls(unit, loop)
    changed = _changed(unit, loop)
    for v in loaded:
        reads, via_this = set(), False
        for arg in v.args:
            more, this = _reads(unit, arg, by_decl)
            reads, via_this = reads | more, via_this or this
        if names & reads:
            raise Refusal(f"the address of `{v.decl.spelling}` reads another loaded value")
        moved = {d for d in reads & changed if d.spelling != counter}
        if moved:
            raise Refusal(f"the address of `{v.decl.spelling}` reads `{sorted(d.spelling for d in moved)[0]}`, which "
                          "the loop changes")
        if via_this and function.kind.name == "CXX_METHOD":
            raise Refusal(f"the address of `{v.decl.spelling}` reads a member of `this`, which the loop may change")
        if any("volatile" in n.type.spelling for arg in v.args for n in walk(arg)):
            raise Refusal(f"`{v.decl.spelling}` is loaded through a `volatile` pointer")
    targets: list[tuple[str, str]] = []  # (pointer as written, address as written) of each store after the loads
    holds = False  # a store the compiler may take to alias a load: through a pointer or into shared memory
    for stmt in rest:
        for node in walk(stmt):
            if node.kind.name == "CALL_EXPR" and _is_store_call(node):
                address, *index = list(node.get_arguments())
                targets.append((_root_text(unit, address), _address_key(unit, address, index[:1])))
                holds = True
        for store in stores(unit, stmt):
            target = bare(next(store.get_children()))
            ref, base = _written_root(unit, target)
            if base is None:
                continue  # a variable of the thread's own
            targets.append((_root_text(unit, base), _address_key(unit, target)))
            holds = holds or "[" not in base.type.spelling or _shared(base)
    if not holds:
        raise Refusal("no store through a pointer follows the loads: nothing holds them back")
    for v in loaded:
        root, address = _root_text(unit, v.address), _address_key(unit, v.address, v.args[1:])
        for stored_root, stored_address in targets:
            if stored_root != root:
                continue
            if stored_address != address:
                raise Refusal(f"`{root}` is loaded and stored in the loop at different addresses")
            if not all(_moves_with(unit, arg, by_decl, counter) for arg in v.args[:2]):
                raise Refusal(f"`{root}` is loaded and stored in the loop at an element that does not move with "
                              f"`{counter}` alone (a later iteration would read what an earlier one wrote)")


def _reads(unit: Unit, address, by_decl: dict) -> tuple[set, bool]:
    """The declarations an address reads, through the index declarations it names (their initialisers too),
    and whether it reads a member through an implicit or explicit `this`."""
    out: set = set()
    via_this = False
    work, seen = [address], set()
    while work:
        node = work.pop()
        for n in walk(node):
            if n.kind.name == "CXX_THIS_EXPR" or (n.kind.name == "MEMBER_REF_EXPR" and not list(n.get_children())):
                via_this = True
            target = refers_to(n)
            if target is None:
                continue
            out.add(target)
            stmt = by_decl.get(target)
            if stmt is not None and stmt not in seen:
                seen.add(stmt)
                work.append(stmt)
    return out, via_this


def _changed(unit: Unit, loop) -> set:
    """The declarations the loop may change: assigned, incremented, their address taken, a member assigned
    (`p.x += 4` changes `p`), handed to a call other than a value computation, or a method called on them
    (`it.next()`, `advance(off)` taking a reference)."""
    assigned, _ = written(unit, loop)
    out = set(assigned)
    for target in _write_targets(unit, loop):
        node = bare(target)
        while node.kind.name == "MEMBER_REF_EXPR" and list(node.get_children()):
            node = bare(next(node.get_children()))
        if refers_to(node) is not None:
            out.add(refers_to(node))
    for node in walk(loop):
        if node.kind.name != "CALL_EXPR" or _value_call(unit, node):
            continue
        for n in walk(node):
            if refers_to(n) is not None and refers_to(n).kind.name in ("VAR_DECL", "PARM_DECL", "FIELD_DECL"):
                out.add(refers_to(n))
    return out


def _value_call(unit: Unit, call) -> bool:
    """A call that computes a value from its arguments and changes none of them: a cast, a math function, a
    template's value operator, an element access, or a load or store call (which writes memory, not the
    variables naming it)."""
    name = callee(call)
    if assignment(unit, call):
        return True  # `a = b` on a class: its target is a write (`_write_targets`, `stores`), its operands values
    return (name in _PURE or name in _LOADS or name in _STORES or name == "operator[]" or _computes(unit, call)
            or name.startswith(("__f", "__d", "__float", "__half", "__bfloat", "__int2", "__uint2", "make_"))
            or (call.referenced is not None and call.referenced.kind.name == "CONSTRUCTOR"))


_SYNC_WORDS = ("sync", "arrive", "wait", "barrier", "fence", "atomic")


def _synchronises(name: str) -> bool:
    """A call named as a barrier, fence, atomic or PDL wait (`__syncthreads`, `atomicAdd`, `PDLWaitPrimary`), or
    one that reads like one wherever it is defined (`block_sync`, `bar.arrive_and_wait`)."""
    return name in BARRIERS or name in _WAITS or any(word in name.lower() for word in _SYNC_WORDS)


def _check_calls(unit: Unit, loop) -> None:
    """Nothing the loop calls may store or synchronise (another thread's stores may land between two
    iterations): a function of this file is read (three calls deep); one defined elsewhere may take only
    values (no pointer, reference, array or class of pointers); see `_synchronises`."""
    for node in walk(loop):
        if node.kind.name != "CALL_EXPR" or _value_call(unit, node):
            continue
        name = callee(node) or unit.code(node)[:30]
        if _synchronises(name):
            raise Refusal(f"the loop synchronises or waits (`{name}`): another thread's stores may land between "
                          "iterations")
        definition = node.referenced.get_definition() if node.referenced is not None else None
        if definition is not None and unit.in_main(definition):
            why = _writes_memory(unit, definition, 3)
            if why:
                raise Refusal(f"the loop calls `{name}`, which {why}")
            continue
        if _passes_pointer(node) or any(_holds_pointers(a.type) for a in node.get_arguments()):
            raise Refusal(f"the loop calls `{name}` with a pointer: it may write what a later iteration loads")


def _holds_pointers(t) -> bool:
    """A class argument whose fields hold pointers (a struct of buffers handed to a call may be written through)."""
    decl = t.get_canonical().get_declaration()
    if decl is None or decl.kind.name not in ("STRUCT_DECL", "CLASS_DECL", "CLASS_TEMPLATE"):
        return "&" in t.spelling
    return any("*" in f.type.spelling for f in decl.get_children() if f.kind.name == "FIELD_DECL")


def _writes_memory(unit: Unit, function, depth: int) -> str:
    """Why a function of this file may write memory or synchronise ("" when it only computes)."""
    if body(function) is None:
        return ""
    if _memory_asm(unit, function):
        return "holds inline assembly that touches memory or synchronises"
    if stores(unit, body(function)) or any(n.kind.name == "CALL_EXPR" and _is_store_call(n) for n in walk(function)):
        return "stores to memory"
    for target in _write_targets(unit, body(function)):
        ref = refers_to(bare(target))
        if ref is not None and ref.kind.name == "VAR_DECL" and ref.semantic_parent is not None and (
                ref.semantic_parent.kind.name not in ("FUNCTION_DECL", "FUNCTION_TEMPLATE", "CXX_METHOD")):
            return f"writes `{ref.spelling}`, a variable outside it"
        if bare(target).kind.name == "MEMBER_REF_EXPR":
            return "writes a member"
    for n in walk(body(function)):
        if n.kind.name != "CALL_EXPR" or _value_call(unit, n):
            continue
        name = callee(n)
        if _synchronises(name):
            return f"synchronises or waits (`{name}`)"
        inner = n.referenced.get_definition() if n.referenced is not None else None
        if inner is not None and unit.in_main(inner) and depth > 1:
            why = _writes_memory(unit, inner, depth - 1)
            if why:
                return why
        elif inner is None or not unit.in_main(inner):
            if _passes_pointer(n):
                return f"hands a pointer to `{name}`"
    return ""


_ASM_MEMORY = re.compile(r"\b(?:ld|st|atom|red|bar|barrier|fence|membar|griddepcontrol|cp|mbarrier|prefetch|"
                         r"discard|applypriority|createpolicy|tex|suld|sust|sured|vote|shfl|match|activemask)\b|\"memory\"")


def _memory_asm(unit: Unit, root) -> bool:
    """Inline assembly under `root` that may read or write memory, synchronise or exchange values between
    threads (`rcp.approx.f32` computes; `st.global`, `bar.sync`, a `"memory"` clobber do not)."""
    return any(n.kind.name in ("ASM_STMT", "MS_ASM_STMT") and _ASM_MEMORY.search(unit.code(n)) for n in walk(root))


def _shared(base) -> bool:
    target = refers_to(bare(base))
    return target is not None and "__shared__" in {t.spelling for t in target.get_tokens()}


def _moves_with(unit: Unit, address, by_decl: dict, counter: str) -> bool:
    """Whether an address reads the counter, through sums and products only (`row + i * 512`), so each iteration
    reads and writes an element of its own."""
    joined = " ".join(unit.code(n) for n in [address, *_indices_read([address], by_decl)])
    return bool(re.search(rf"\b{re.escape(counter)}\b", joined)) and not re.search(
        r"%|/|>>|&(?!&)|\?|\b(?:min|max|clamp)\s*\(", joined)


def _root_text(unit: Unit, address) -> str:
    """The pointer an address starts from, as written, casts dropped (`params.out` of
    `static_cast<T*>(params.out) + offset`)."""
    return _flat(unit.code(_root(unit, address)[1]))


_CASTS = ("CSTYLE_CAST_EXPR", "CXX_STATIC_CAST_EXPR", "CXX_REINTERPRET_CAST_EXPR", "CXX_CONST_CAST_EXPR")


def _uncast(unit: Unit, node):
    """The pointer a cast pointer expression starts from (`params.x` of `static_cast<const T*>(params.x)`)."""
    node = bare(node)
    while node.kind.name in _CASTS and list(node.get_children()):
        node = bare(_pointer_root(unit, list(node.get_children())[-1]))
    return node


def _root(unit: Unit, address):
    """(the expression the address starts from, casts and all; the pointer inside it, also through `p[e]`
    and `&p[e]`)."""
    outer = _pointer_root(unit, address)
    node = outer
    while True:
        node = _uncast(unit, node)
        if node.kind.name == "ARRAY_SUBSCRIPT_EXPR":
            node = next(node.get_children())
            continue
        if node.kind.name == "UNARY_OPERATOR" and operator(unit, node) == "&":
            node = next(node.get_children())
            continue
        return outer, node


def _address_key(unit: Unit, address, index: list = ()) -> str:
    """The address as written, the casts around its pointer dropped and `p[e]`, `&p[e]`, `load(p, e)` written
    `p+e`, to compare a store's address with a load's."""
    if index:
        return f"{_address_key(unit, address)}+{_flat(unit.code(index[0]))}"
    node = _unwrapped(address)
    if node.kind.name == "UNARY_OPERATOR" and operator(unit, node) in ("*", "&"):
        node = bare(next(node.get_children()))
    if node.kind.name == "ARRAY_SUBSCRIPT_EXPR":
        base, index = list(node.get_children())
        return f"{_cast_free(unit, base)}+{_flat(unit.code(index))}"
    return _cast_free(unit, node)


def _cast_free(unit: Unit, node) -> str:
    """A pointer expression's text, the casts around the pointer it starts from dropped."""
    outer = _pointer_root(unit, node)
    inner = _uncast(unit, outer)
    return _flat(unit.data[unit.span(node)[0]:unit.span(outer)[0]].decode() + unit.code(inner)
                 + unit.data[unit.span(outer)[1]:unit.span(node)[1]].decode())


def _flat(text: str) -> str:
    return re.sub(r"\s+", "", text)


def _needed(unit: Unit, loaded: list, indices: list) -> set:
    """The index declarations the loads' addresses read, directly or through other indices."""
    return _indices_read([arg for v in loaded for arg in v.args], {_single_decl(s): s for s in indices})


def _read_after(unit: Unit, stmts: list, end: int, loaded: list, indices: list) -> set:
    """The index declarations something left in the loop still reads (the code after the opening, or
    another index still read)."""
    left = list(stmts[end:]) + [s for s in stmts[:end] if s not in indices and not any(
        s in (v.decl_stmt, v.load_stmt) for v in loaded)]
    return _indices_read(left, {_single_decl(s): s for s in indices})


def _indices_read(roots: list, by_decl: dict) -> set:
    """The index declarations (of `by_decl`: declaration -> its statement) that `roots` read, directly or
    through other index declarations."""
    reached: set = set()
    work = list(roots)
    while work:
        for n in walk(work.pop()):
            stmt = by_decl.get(refers_to(n)) if refers_to(n) is not None else None
            if stmt is not None and stmt not in reached:
                reached.add(stmt)
                work.append(stmt)
    return reached


def _into_slot(unit: Unit, v: _Loaded, name: str, counter: str) -> str:
    """The load, writing the variable's slot: `x_batch[i].load(...)`, or `x_batch[i] = <load>;`."""
    if v.load_stmt is v.decl_stmt:
        return f"{name}[{counter}] = {unit.code(_initialiser(v.decl)).strip()};"
    call = unit.code(v.load_stmt).strip().rstrip(";")
    obj = v.decl.spelling
    if not re.match(rf"{re.escape(obj)}\s*\.", call):
        raise Refusal(f"the load of `{obj}` is not written `{obj}.load(...)` (a macro?)")
    return f"{name}[{counter}]{call[len(obj):]};"


def _line_edit(unit: Unit, stmt, new: str | None) -> tuple[int, int, str]:
    """Replace a statement alone on its line (with its `;`; a `//` comment after it stays with a replacement),
    or drop the line."""
    start, end = unit.span(stmt)
    line_begin = unit.line_start(start)
    line_end = unit.data.find(b"\n", end)
    line_end = len(unit.data) if line_end < 0 else line_end
    tail = unit.data[end:line_end].strip(b" \t\r")
    semicolon = tail.startswith(b";")
    tail = tail[1:].strip(b" \t\r") if semicolon else tail
    if unit.data[line_begin:start].strip() or (tail and not tail.startswith(b"//")):
        raise Refusal(f"line {unit.line_of(start)}: the statement shares its line")
    if new is None:
        return line_begin, line_end + 1, ""
    stop = unit.data.find(b";", end, line_end) + 1 if semicolon else end
    return start, stop, new


def _splice_within(unit: Unit, start: int, end: int, edits: list[tuple[int, int, str]]) -> str:
    data = unit.data[start:end]
    for a, b, new in sorted(edits, reverse=True):
        data = data[:a - start] + new.encode() + data[b - start:]
    return data.decode()
