"""fastdiv: a thread's index split by launch arguments with a multiply-high and a shift instead of a division.

    for (int64_t i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x) {
      const int64_t col = i % cols;           ->    const int64_t col = static_cast<long>(astra_mod(static_cast<uint32_t>(i), cols_div));
      const int64_t row = i / cols;           ->    const int64_t row = static_cast<long>(astra_div(static_cast<uint32_t>(i), cols_div));
      ...

The pattern: an elementwise kernel walks a flat index and splits it into coordinates by run-time sizes
(`pair % pairs_per_head`, `row / (heads * pairs)`, `row % seq_len`). A division by a value the compiler cannot
see is a subroutine of about twenty instructions even at 32 bits (nvcc already takes 32 bits where a 64-bit
operand's high word is zero), and each element pays for it; with two or three per element a memory-bound
kernel becomes instruction-bound. Dividing by an invariant by multiplying with a precomputed reciprocal
(Granlund and Montgomery, PLDI 1994; CUTLASS's FastDivmod) costs one `__umulhi` and a shift. A scan of SGLang
0.5.23's JIT sources found such divisions or remainders in the device code of 61 files (rotary embeddings,
relayouts, norms over channels, KV-cache page maps); `astra passes fastdiv` measures where this pass applies.

What it writes: a copy of the kernel, `<kernel>_fastdiv`, taking one `AstraFastDivisor` (divisor, multiplier,
shift) per distinct divisor after its own parameters, with each qualifying division and remainder replaced;
and at every launch, the copy launched where `astra_fastdiv_fits(...)` holds on the host, the original
otherwise. The host computes the divisors from the launch's own arguments.

Exact where it is taken, checked on the kernel (refused otherwise, with the reason):
- the division or remainder is of two integers of 32 or 64 bits, in the body of a loop
  `for (T i = S; i < N; i += D)` (or `++i`) whose start S and step D are made of `threadIdx`, `blockIdx`,
  `blockDim`, `gridDim` and literals alone (so i >= 0), whose counter the body never writes;
- its dividend is that counter, a `const` local of the loop's body initialised from one, or a quotient or
  remainder of this kind (casts and parentheses aside): so it lies in [0, N) or [0, divisor);
- its divisor is made of the kernel's parameters (a struct parameter's members included), literals, the
  file's constants and `const` locals of the kernel initialised from these: the launch's arguments give it on
  the host. A divisor with no parameter in it is a constant, which the compiler divides by already;
- the copy is taken only where N and every divisor are in [1, 2^31): the multiply-high is exact for a
  dividend below 2^31 and a divisor of at least 1, and quotients and remainders of non-negative values are
  the same signed or unsigned;
- the kernel is launched from this file only, directly (`LaunchKernel(...)(k<T>, ...)` or `k<<<...>>>(...)`),
  with no occupancy or attribute query (the copy would not get the attribute) and no argument with a side
  effect (the arguments are evaluated for the check and again for the launch).
"""

from __future__ import annotations

import re

from astra.optimize.passes.base import ParsedPass, Refusal
from astra.optimize.passes.launches import namespaces, qualifier, uses
from astra.optimize.passes.syntax import Unit, assignment, bare, callee, fresh_name, operator, splice, stepped, walk

_INTEGERS = {"INT", "UINT", "LONG", "ULONG", "LONGLONG", "ULONGLONG"}
_NARROW = {"CHAR_U", "UCHAR", "CHAR_S", "SCHAR", "SHORT", "USHORT"}  # a parameter or local of these: promoted
_WIDE_CAST = r"static_cast\s*<\s*(?:(?:unsigned\s+)?long(?:\s+long)?|u?int64_t|size_t|uint32_t|unsigned(?:\s+int)?)\s*>"
_THREAD_PLACE = re.compile(r"(threadIdx|blockIdx|blockDim|gridDim)\s*\.\s*[xyz]|\d+[uUlL]*|[\s()*+]|" + _WIDE_CAST)
_GEOMETRY = ("threadIdx", "blockIdx", "blockDim", "gridDim")
_SIDE_EFFECT = re.compile(r"\+\+|--|<<=|>>=|(?<![=!<>])=(?!=)")


class FastDiv(ParsedPass):
    name = "fastdiv"
    family = "fastdiv"

    def rewrite(self, unit: Unit, spec: dict | None) -> tuple[str, str]:
        if "AstraFastDivisor" in unit.text:
            raise Refusal("the file holds AstraFastDivisor already (fastdiv applied)")
        functions = unit.functions()
        taken = {f.spelling for f in functions}
        up = _parents(unit)
        reasons: list[str] = []
        edits: list[tuple[int, int, str]] = []
        done: list[str] = []
        first, home = None, None  # where the helper goes, and the namespaces it is declared in
        for kernel in unit.kernels():
            try:
                _fits_a_copy(unit, kernel, home)
                sites = _sites(unit, kernel, up)
                launches = _launches(unit, kernel, up)
            except Refusal as refusal:
                reasons.append(f"{kernel.spelling}: {refusal}")
                continue
            home = namespaces(kernel)
            copy = fresh_name(f"{kernel.spelling}_fastdiv", taken)
            divisors = _divisor_names(sites, taken | set(re.findall(r"\w+", unit.code(kernel))))
            start = unit.line_start(unit.span(kernel)[0])  # a template's extent starts at `template <...>`
            edits.append((unit.span(kernel)[1], unit.span(kernel)[1],
                          "\n\n" + _kernel_copy(unit, kernel, start, copy, sites, divisors)))
            for call, ref, args, statement, config in launches:
                host = next((f for f in functions if unit.span(f)[0] <= unit.span(call)[0] < unit.span(f)[1]), None)
                edits.append((*statement,
                              _launch_text(unit, kernel, (call, ref, args, config), statement, copy, sites,
                                           divisors, qualifier(kernel, host))))
            first = first if first is not None else start
            done.append(f"{kernel.spelling} ({len(sites)} site{'s' if len(sites) > 1 else ''}: "
                        f"{', '.join(sorted({s.text for s in sites}))})")
        if first is None:
            raise Refusal(reasons[0] if reasons else "no __global__ kernel in the file")
        edits.append((first, first, HELPER))
        return splice(unit, edits), ("integer division and remainder by launch arguments as a multiply-high and a "
                                     f"shift, in a copy launched where the values fit: {', '.join(done)}")


def _fits_a_copy(unit: Unit, kernel, home: list[str] | None) -> None:
    """Refuse a kernel whose copy the helper cannot serve or that cannot take more parameters: in another
    namespace than the kernels rewritten before it (the helper stands before the first), in an `extern "C"`
    block (a template cannot have C linkage), or with a default argument (the new parameters would follow it)."""
    if home is not None and namespaces(kernel) != home:
        raise Refusal(f"in namespace {'::'.join(namespaces(kernel)) or '(global)'}, not "
                      f"{'::'.join(home) or '(global)'} as the kernel rewritten before it")
    parent = kernel.lexical_parent
    while parent is not None and parent.kind.name != "TRANSLATION_UNIT":
        if parent.kind.name in ("LINKAGE_SPEC", "UNEXPOSED_DECL") and unit.code(parent).lstrip().startswith("extern"):
            raise Refusal('declared in an extern "C" block')
        parent = parent.lexical_parent
    if any("=" in unit.code(p) for p in _params(kernel)):
        raise Refusal("a parameter has a default argument")


class _Site:
    """One division or remainder the copy replaces: its node, operator, dividend, and the divisor's host
    text; `bounds` are the host texts that must lie in [1, 2^31) for it to be exact (the loop's bound and
    every divisor on the way)."""

    def __init__(self, node, op: str, dividend, divisor_host: str, bounds: list[str], text: str, typename: str):
        self.node, self.op, self.dividend, self.divisor_host = node, op, dividend, divisor_host
        self.bounds, self.text, self.typename = bounds, text, typename


def _sites(unit: Unit, kernel, up: dict) -> list[_Site]:
    changed = _changed(unit, kernel)
    params = {p.hash: i for i, p in enumerate(_params(kernel)) if p not in changed}  # the host's values
    facts, reasons = _facts(unit, kernel, params, changed, up)
    found: list[_Site] = []
    site_reasons: list[str] = []  # divisions it could not prove
    for node in walk(kernel):
        if node.kind.name != "BINARY_OPERATOR" or operator(unit, node) not in ("/", "%"):
            continue
        site = _site(unit, node, kernel, params, facts)
        if isinstance(site, _Site):
            found.append(site)
        elif site:
            site_reasons.append(site)
    if not found:
        if site_reasons or reasons:
            raise Refusal((site_reasons or reasons)[0])
        raise Refusal("no integer division or remainder by a launch argument")
    return found


class _Fact:
    """`decl` lies in [0, bound) inside `region` (byte offsets): a loop's counter in its body, an index after an
    early `if (idx >= N) return;` or inside `if (idx < N) { ... }`. `threads`: its value is a thread's place of a
    signed 32-bit type, exact only where the launch has fewer than 2^31 threads."""

    def __init__(self, decl, bound: str, region: tuple[int, int], threads: bool):
        self.decl, self.bound, self.region, self.threads = decl, bound, region, threads


def _facts(unit: Unit, kernel, params: dict, changed: set, up: dict) -> tuple[list[_Fact], list[str]]:
    """What bounds the kernel's indices (see _Fact), and why each loop or guard it skipped is skipped."""
    facts: list[_Fact] = []
    reasons: list[str] = []
    for loop in (n for n in walk(kernel) if n.kind.name == "FOR_STMT"):
        counter, bound = _loop(unit, loop, kernel, params, up)
        if counter is None:
            reasons.append(bound)
            continue
        facts.append(_Fact(counter, bound, unit.span(list(loop.get_children())[-1]), _signed32(counter)))
    for node in walk(kernel):
        if node.kind.name != "IF_STMT":
            continue
        children = list(node.get_children())
        if len(children) < 2:
            continue
        then = children[1]
        returns = then.kind.name == "RETURN_STMT" or (then.kind.name == "COMPOUND_STMT" and [
            c.kind.name for c in then.get_children()] == ["RETURN_STMT"])
        for form, disjunction in (("<", False), (">=", True)):
            if form == ">=" and (not returns or len(children) > 2 or up.get(node) != _body(kernel)):
                continue
            for cond in _terms(unit, children[0], "||" if disjunction else "&&"):
                found = _comparison(unit, cond, form, kernel, params, changed)
                if found is None:
                    continue
                decl, bound = found
                region = unit.span(then) if form == "<" else (unit.span(node)[1], unit.span(kernel)[1])
                facts.append(_Fact(decl, bound, region, _signed32(decl)))
    return facts, reasons


def _body(function):
    return next((c for c in function.get_children() if c.kind.name == "COMPOUND_STMT"), None)


def _terms(unit: Unit, cond, joiner: str) -> list:
    """The operands of a chain of `joiner` (`a && b && c`), parentheses aside; `cond` alone otherwise."""
    cond = bare(cond)
    if cond.kind.name == "BINARY_OPERATOR" and operator(unit, cond) == joiner:
        left, right = list(cond.get_children())
        return _terms(unit, left, joiner) + _terms(unit, right, joiner)
    return [cond]


def _comparison(unit: Unit, cond, form: str, kernel, params: dict, changed: set):
    """(the index, the host text of N) where `cond` is `idx < N` (form "<", also `N > idx`) or `idx >= N` (form
    ">=", also `N <= idx`), idx a local of the kernel that holds a thread's place and is never written."""
    if cond.kind.name != "BINARY_OPERATOR":
        return None
    op = operator(unit, cond)
    left, right = [bare(c) for c in cond.get_children()]
    flipped = {"<": ">", ">=": "<="}[form]
    if op == flipped:
        left, right = right, left
    elif op != form:
        return None
    decl = left.referenced if left.kind.name == "DECL_REF_EXPR" else None
    if decl is None or decl.kind.name != "VAR_DECL" or decl in changed or not _integer(decl.type):
        return None
    init = [c for c in decl.get_children() if c.kind.name != "TYPE_REF"]
    if len(init) != 1 or not _thread_place(unit, init[0], kernel):
        return None
    if _signed32(decl) and not _linear(unit, init[0]):
        return None
    try:
        return decl, _host(unit, right, kernel, params)
    except Refusal:
        return None


def _signed32(decl) -> bool:
    return decl.type.get_canonical().kind.name == "INT"


def _linear(unit: Unit, node) -> bool:
    """`blockIdx.x * blockDim.x + threadIdx.x` (either order), `threadIdx.x` or `blockIdx.x`: below the launch's
    thread count, so below 2^31 where the launch has fewer threads."""
    text = re.sub(_WIDE_CAST + r"|\s|\(|\)", "", unit.code(node))
    return text in ("threadIdx.x", "blockIdx.x") or bool(re.fullmatch(
        r"(blockIdx\.x\*blockDim\.x|blockDim\.x\*blockIdx\.x)\+threadIdx\.x|threadIdx\.x\+"
        r"(blockIdx\.x\*blockDim\.x|blockDim\.x\*blockIdx\.x)", text))


def _changed(unit: Unit, root) -> set:
    """The declarations the code under `root` may change: assigned, stepped or addressed (a member's or an array element's
    struct included), bound to a reference to non-const (`int& r = n;`), or handed whole to a call, which may take
    it by reference (a `const` declaration aside: nothing may change it)."""
    out = set()
    up = _parents(unit)
    for node in walk(root):
        target = None
        if assignment(unit, node) or stepped(unit, node) is not None:
            target = bare(next(node.get_children())) if assignment(unit, node) else stepped(unit, node)
        elif node.kind.name == "VAR_DECL" and node.type.kind.name == "LVALUEREFERENCE" and not (
                node.type.get_pointee().is_const_qualified()):
            inits = [c for c in node.get_children() if c.kind.name != "TYPE_REF"]
            target = bare(inits[0]) if inits else None
        elif node.kind.name == "DECL_REF_EXPR" and up.get(node) is not None and up[node].kind.name == "CALL_EXPR" and (
                node != next(up[node].get_children(), None)) and _by_reference(unit, up[node], node):
            target = node  # an argument a reference parameter of the callee may bind
        target = _root(unit, target)
        if target is not None and target.kind.name == "DECL_REF_EXPR" and target.referenced is not None and not (
                node.kind.name == "DECL_REF_EXPR" and target.referenced.type.is_const_qualified()):
            out.add(target.referenced)
    return out


_REFERENCE_KINDS = ("LVALUEREFERENCE", "RVALUEREFERENCE")
_FUNCTIONS = ("FUNCTION_DECL", "CXX_METHOD", "FUNCTION_TEMPLATE", "CONSTRUCTOR")


def _by_reference(unit: Unit, call, argument) -> bool:
    """Whether `argument`, handed to `call` without a conversion around it, may bind a reference to non-const:
    the callee's own parameter where libclang resolves the call; else (a call in a template) any function of
    the translation unit, headers included, of the callee's name that takes one there; an unknown callee may."""
    children = list(call.get_children())
    position = children.index(argument) - 1
    if position < 0:  # the callee itself
        return False
    target = call.referenced
    if target is not None and target.kind.name in _FUNCTIONS:
        candidates = [target]
    else:  # unresolved in a template: the functions of that name outside the system headers, of the object's class
        candidates = [f for f in _named_functions(unit).get(callee(call), []) if not f.location.is_in_system_header]
        head = children[0]
        if head.kind.name == "MEMBER_REF_EXPR" and list(head.get_children()):
            owner = next(head.get_children()).type.get_declaration()
            while owner is not None and owner.kind.name in ("TYPE_ALIAS_DECL", "TYPEDEF_DECL"):
                owner = owner.underlying_typedef_type.get_declaration()
            if owner is not None and owner.kind.name != "NO_DECL_FOUND" and owner.spelling:
                candidates = [f for f in candidates if f.semantic_parent is not None and (
                    f.semantic_parent.spelling == owner.spelling)]
    if not candidates:
        return True
    for function in candidates:
        params = [c for c in function.get_children() if c.kind.name == "PARM_DECL"]
        if position >= len(params):
            if function.type.is_function_variadic() or not params:
                return True
            continue
        type_ = params[position].type
        if type_.kind.name in _REFERENCE_KINDS and not type_.get_pointee().is_const_qualified():
            return True
        if type_.kind.name not in _REFERENCE_KINDS and type_.get_canonical().kind.name in ("UNEXPOSED", "DEPENDENT"):
            return True  # a forwarding `T&&` or a template's parameter type: it may be a reference
    return False


def _named_functions(unit: Unit) -> dict[str, list]:
    """Every function of the translation unit by name (headers included), read once per unit."""
    cache = unit.__dict__.get("_fastdiv_functions")
    if cache is None:
        cache = {}
        for cursor in unit.tu.cursor.walk_preorder():
            if cursor.kind.name in _FUNCTIONS:
                cache.setdefault(cursor.spelling, []).append(cursor)
        unit.__dict__["_fastdiv_functions"] = cache
    return cache


def _parents(unit: Unit) -> dict:
    """`unit.parents()`, walked once per unit (every loop's body asks what it changes)."""
    cache = unit.__dict__.get("_fastdiv_parents")
    if cache is None:
        cache = unit.__dict__["_fastdiv_parents"] = unit.parents()
    return cache


def _root(unit: Unit, target):
    """The variable whose storage `target` names: through members and array elements of a struct or an array
    it holds (a pointer's element is other memory)."""
    while target is not None and target.kind.name in ("MEMBER_REF_EXPR", "ARRAY_SUBSCRIPT_EXPR"):
        inner = next(target.get_children(), None)
        if inner is None or "->" in unit.code(target)[len(unit.code(inner)):][:3] or (
                target.kind.name == "ARRAY_SUBSCRIPT_EXPR" and bare(inner).type.kind.name != "CONSTANTARRAY"):
            return None
        target = bare(inner)
    return target


def _params(function) -> list:
    return [c for c in function.get_children() if c.kind.name == "PARM_DECL"]


def _loop(unit: Unit, loop, kernel, params: dict, up: dict):
    """(the counter's declaration, the host text of its bound N) of `for (T i = S; i < N; i += D)` with S and D
    non-negative thread places, or (None, why not)."""
    children = list(loop.get_children())
    line = loop.extent.start.line
    if len(children) != 4 or children[0].kind.name != "DECL_STMT":
        return None, f"the loop on line {line} is not `for (T i = S; i < N; i += D)`"
    decls = list(children[0].get_children())
    if len(decls) != 1 or decls[0].kind.name != "VAR_DECL" or not _integer(decls[0].type):
        return None, f"the loop on line {line} does not declare one integer counter"
    counter = decls[0]
    init = [c for c in counter.get_children() if c.kind.name != "TYPE_REF"]
    if len(init) != 1 or not _thread_place(unit, init[0], kernel):
        return None, f"the loop on line {line} does not start at a thread's place (threadIdx, blockIdx, blockDim)"
    if _signed32(counter) and not _linear(unit, init[0]):
        return None, (f"the loop on line {line}: an int counter that starts elsewhere than blockIdx.x * blockDim.x + "
                      "threadIdx.x may pass 2^31")
    cond = bare(children[1])
    if cond.kind.name != "BINARY_OPERATOR" or operator(unit, cond) != "<":
        return None, f"the loop on line {line}: its condition is not `i < N`"
    lhs, rhs = [bare(c) for c in cond.get_children()]
    if lhs.kind.name != "DECL_REF_EXPR" or lhs.referenced != counter:
        return None, f"the loop on line {line}: its condition is not `{counter.spelling} < N`"
    try:
        bound = _host(unit, rhs, kernel, params)
    except Refusal as refusal:
        return None, f"the loop on line {line}: its bound {refusal}"
    step = children[2]
    stepped_node = stepped(unit, step)
    if stepped_node is not None:
        ok = stepped_node.kind.name == "DECL_REF_EXPR" and stepped_node.referenced == counter and operator(
            unit, step) == "++"
    else:
        parts = list(step.get_children())
        ok = (step.kind.name == "COMPOUND_ASSIGNMENT_OPERATOR" and operator(unit, step) == "+=" and len(parts) == 2
              and bare(parts[0]).kind.name == "DECL_REF_EXPR" and bare(parts[0]).referenced == counter
              and _thread_place(unit, parts[1], kernel))
    if not ok:
        return None, f"the loop on line {line}: its step is not `++i` or `i += D` (D of blockDim, gridDim, literals)"
    if counter in _changed(unit, children[3]):
        return None, f"the loop on line {line} writes its counter {counter.spelling} in its body"
    return counter, bound


def _thread_place(unit: Unit, node, kernel) -> bool:
    """Whether `node` is made of threadIdx, blockIdx, blockDim, gridDim, literals, `+`, `*` and integer casts,
    through const locals of the kernel initialised so (a value >= 0, the same as the launch's geometry)."""
    start, end = unit.span(node)
    pieces, at = [], start
    for ref in _refs(node):
        if ref.spelling in _GEOMETRY:
            continue
        target = ref.referenced
        inside = target is not None and unit.span(kernel)[0] <= unit.span(target)[0] < unit.span(kernel)[1]
        init = [c for c in target.get_children() if c.kind.name != "TYPE_REF"] if inside else []
        if not (target is not None and _fixed(unit, kernel, target) and len(init) == 1
                and _thread_place(unit, init[0], kernel)):
            return False
        pieces.append(unit.data[at:unit.span(ref)[0]].decode() + "blockDim.x")  # stands for its checked value
        at = unit.span(ref)[1]
    pieces.append(unit.data[at:end].decode())
    text = "".join(pieces)
    return bool(text.strip()) and _THREAD_PLACE.sub("", text).strip() == "" and any(
        w in text for w in ("threadIdx", "blockIdx", "blockDim", "gridDim"))


def _integer(type_) -> bool:
    canonical = type_.get_canonical()
    return canonical.kind.name in _INTEGERS


def _site(unit: Unit, node, kernel, params: dict, facts: list[_Fact]) -> _Site | str:
    """The site at `node`, or why not ("" where it divides by no launch argument: nothing to say)."""
    line = node.extent.start.line
    text = re.sub(r"\s+", " ", unit.code(node))
    if not _integer(node.type):
        return ""
    dividend, divisor = list(node.get_children())
    (a, b), (da, db), (va, vb) = unit.span(node), unit.span(dividend), unit.span(divisor)
    if not (a <= da < db <= va < vb <= b) or unit.data[db:va].strip() not in (b"/", b"%"):
        return f"line {line}: `{text}` is written through a macro"
    if not all(_integer(c.type) or _geometry(unit, c) for c in (dividend, divisor)):
        return ""
    try:
        divisor_host = _host(unit, divisor, kernel, params, need_param=True)
    except Refusal as refusal:
        return "" if "constants alone" in str(refusal) or "depends on the thread" in str(refusal) else \
            f"line {line}: `{text}`: {refusal}"
    try:
        bounds = _bounded(unit, dividend, node, kernel, params, facts)
    except Refusal as refusal:
        return f"line {line}: `{text}`: {refusal}"
    spelled = node.type.spelling
    typename = spelled if re.fullmatch(r"(unsigned |signed )?(int|long|long long)|u?int(32|64)_t|size_t", spelled) \
        else node.type.get_canonical().spelling
    return _Site(node, operator(unit, node), dividend, divisor_host, bounds + [divisor_host], text, typename)


_GEOMETRY_VALUE = re.compile(r"(threadIdx|blockIdx)\s*\.\s*[xyz]")
THREADS = "{THREADS}"  # the launch's thread count, a bound of a signed 32-bit thread's place


def _geometry(unit: Unit, node) -> bool:
    """`threadIdx.x` ... `blockIdx.z` (libclang gives their members a pseudo-object type, not an integer)."""
    node = _uncast(node)
    return node.kind.name == "MEMBER_REF_EXPR" and bool(_GEOMETRY_VALUE.fullmatch(re.sub(r"\s", "", unit.code(node))))


def _bounded(unit: Unit, node, site, kernel, params: dict, facts: list[_Fact]) -> list[str]:
    """The host texts bounding `node` at `site` (it lies in [0, each)), or a Refusal: `threadIdx`/`blockIdx`
    (below 2^31 on every launch), an index a fact bounds there, a const local initialised with a bounded value,
    or a quotient or remainder by a launch-invariant divisor."""
    node = _uncast(node)
    kind = node.kind.name
    at = unit.span(site)[0]
    if _geometry(unit, node):
        return []
    if _linear(unit, node):  # blockIdx.x * blockDim.x + threadIdx.x: below the launch's thread count
        return [THREADS]
    if kind == "DECL_REF_EXPR":
        target = node.referenced
        for fact in facts:
            if fact.decl == target and fact.region[0] <= at < fact.region[1]:
                return [fact.bound] + ([THREADS] if fact.threads else [])
        if target is not None and _fixed(unit, kernel, target):
            init = [c for c in target.get_children() if c.kind.name != "TYPE_REF"]
            if len(init) == 1:
                return _bounded(unit, init[0], site, kernel, params, facts)
        raise Refusal(f"the dividend {node.spelling} is not known to lie in [0, 2^31): not a loop's counter, an "
                      "index checked against a launch argument, blockIdx or threadIdx")
    if kind == "BINARY_OPERATOR" and operator(unit, node) in ("/", "%"):
        dividend, divisor = list(node.get_children())
        divisor_host = _host(unit, divisor, kernel, params)
        inner = _bounded(unit, dividend, site, kernel, params, facts)
        return inner + [divisor_host]  # a remainder's dividend too: its bounds are what make it non-negative
    raise Refusal(f"the dividend `{_flat(unit.code(node))}` is not known to lie in [0, 2^31)")


def _flat(text: str) -> str:
    return re.sub(r"\s+", " ", text).strip()


def _uncast(node):
    """`node` without parentheses, implicit conversions and integer casts around it."""
    while True:
        node = bare(node)
        if node.kind.name in ("CXX_STATIC_CAST_EXPR", "CSTYLE_CAST_EXPR", "CXX_FUNCTIONAL_CAST_EXPR") and _integer(
                node.type):
            inner = [c for c in node.get_children() if c.kind.name not in ("TYPE_REF",)]
            if len(inner) == 1 and _integer(inner[0].type):
                node = inner[0]
                continue
        return node


def _fixed(unit: Unit, kernel, decl) -> bool:
    """Whether `decl` is a local of the kernel that keeps its initial value: `const`, or never assigned, stepped
    or addressed (the kernel's writes read once per kernel and kept on the unit)."""
    if decl.kind.name != "VAR_DECL" or not unit.span(kernel)[0] <= unit.span(decl)[0] < unit.span(kernel)[1]:
        return False
    cache = unit.__dict__.setdefault("_fastdiv_changed", {})
    if kernel.hash not in cache:
        cache[kernel.hash] = _changed(unit, kernel)
    return _const(decl) or decl not in cache[kernel.hash]


def _const(decl) -> bool:
    return decl.type.is_const_qualified()


def _host(unit: Unit, node, kernel, params: dict, need_param: bool = False) -> str:
    """`node`'s text as the host writes it at a launch, each kernel parameter as `{P<i>}` (the launch's i-th
    argument fills it), a const local of the kernel as its initializer's; or a Refusal where `node` depends on
    anything else (a thread's place, memory, a call, a template parameter)."""
    used = [False]

    def render(n) -> str:
        check(n)
        start, end = unit.span(n)
        pieces, at = [], start
        for child in _refs(n):
            cs, ce = unit.span(child)
            if not re.fullmatch(r"(::)?(\w+::)*" + re.escape(child.spelling), unit.code(child).strip()):
                raise Refusal(f"`{_flat(unit.code(node))}` is written through a macro (`{unit.code(child)}`)")
            pieces.append(unit.data[at:cs].decode())
            pieces.append(substitute(child))
            at = ce
        pieces.append(unit.data[at:end].decode())
        return "".join(pieces)

    def check(tree) -> None:
        """Refuse what the host cannot compute alike: a call, a load, the thread's place, a template parameter."""
        for n in walk(tree):
            kind = n.kind.name
            if kind in ("TYPE_REF", "TEMPLATE_REF") and n.referenced is not None and n.referenced.kind.name in (
                    "TEMPLATE_TYPE_PARAMETER", "TEMPLATE_TEMPLATE_PARAMETER"):
                raise Refusal(f"`{_flat(unit.code(node))}` depends on the kernel's template parameter {n.spelling}")
            if kind == "TYPE_REF" and n.referenced is not None and namespaces(n.referenced)[:1] not in ([], ["std"]):
                raise Refusal(f"`{_flat(unit.code(node))}` names a type of a namespace ({n.spelling})")
            if kind in ("CALL_EXPR", "ARRAY_SUBSCRIPT_EXPR") or (kind == "UNARY_OPERATOR" and operator(unit, n) in (
                    "*", "&", "++", "--")):
                raise Refusal(f"`{_flat(unit.code(node))}` reads memory or calls")
            if kind == "MEMBER_REF_EXPR" and re.search(r"(threadIdx|blockIdx|blockDim|gridDim)\s*\.", unit.code(n)):
                raise Refusal(f"`{_flat(unit.code(node))}` depends on the thread")
            if kind == "MEMBER_REF_EXPR" and "->" in unit.code(n):
                raise Refusal(f"`{_flat(unit.code(node))}` reads memory through a pointer")

    def substitute(ref) -> str:
        target = ref.referenced
        if target is None:
            raise Refusal(f"`{ref.spelling}` names nothing libclang resolves")
        if target.kind.name == "PARM_DECL" and target.hash not in params:
            raise Refusal(f"the kernel changes its parameter {target.spelling}: the launch's value is not the one divided by")
        if target.kind.name == "PARM_DECL":
            used[0] = True
            kind = target.type.get_canonical().kind.name
            if kind not in _INTEGERS | _NARROW and kind != "RECORD":
                raise Refusal(f"the parameter {target.spelling} is of type {target.type.spelling}, not an integer "
                              "or a struct")
            return "{P%d}" % params[target.hash]
        if _fixed(unit, kernel, target):
            init = [c for c in target.get_children() if c.kind.name != "TYPE_REF"]
            if len(init) == 1:
                if target.type.get_canonical().kind.name not in _INTEGERS | _NARROW:
                    raise Refusal(f"`{target.spelling}` is of type {target.type.spelling}, not an integer")
                return f"static_cast<{_spelled(target.type)}>({render(init[0])})"  # the local's own type
        elif target.kind.name == "VAR_DECL" and _const(target):
            if target.semantic_parent is not None and target.semantic_parent.kind.name in (
                    "NAMESPACE", "TRANSLATION_UNIT"):  # named in full: the launch may stand in another namespace
                return "".join(f"::{part}" for part in namespaces(target)) + "::" + target.spelling
        if target.kind.name == "ENUM_CONSTANT_DECL":  # named in full, through its enum where that is scoped
            enum = target.semantic_parent
            scope = [enum.spelling] if enum is not None and enum.is_scoped_enum() else []
            return "".join(f"::{part}" for part in namespaces(target) + scope) + "::" + target.spelling
        raise Refusal(f"`{ref.spelling}` is not a launch argument or a constant")

    text = render(node)
    if need_param and not used[0]:
        raise Refusal("a divisor of constants alone (the compiler divides by it already)")
    return re.sub(r"\s+", " ", text).strip()


def _refs(node) -> list:
    """The outermost DECL_REF_EXPRs under `node` (or `node` itself), in order."""
    if node.kind.name == "DECL_REF_EXPR":
        return [node]
    out = []
    for child in node.get_children():
        out += _refs(child)
    return out


def _divisor_names(sites: list[_Site], taken: set) -> dict[str, str]:
    """A parameter name for each distinct divisor (its host text), from the names in it."""
    names: dict[str, str] = {}
    for site in sites:
        if site.divisor_host in names:
            continue
        words = re.findall(r"[A-Za-z_]\w*", re.sub(r"\{P\d+\}", "", site.divisor_host))
        own = [w for w in re.findall(r"[A-Za-z_]\w*", re.sub(r"static_cast\s*<[^>]*>", "", site.text.split(
            "/" if site.op == "/" else "%", 1)[-1])) if w not in ("static_cast", "int64_t", "uint32_t")]
        stem = "_".join((own or words or ["divisor"])[:3])
        names[site.divisor_host] = fresh_name(f"{stem}_div", taken)
    return names


def _kernel_copy(unit: Unit, kernel, start: int, copy: str, sites: list[_Site], divisors: dict[str, str]) -> str:
    """The kernel's text from `start`, renamed `copy`, given the divisors as parameters, its sites replaced."""
    name_at = kernel.location.offset
    params = _params(kernel)
    close = unit.span(params[-1])[1]
    extra = "".join(f", AstraFastDivisor {name}" for name in dict.fromkeys(divisors[s.divisor_host] for s in sites))
    edits = [(name_at, name_at + len(kernel.spelling), copy), (close, close, extra)]
    chosen = _outermost(unit, sites)
    for site in chosen:
        edits.append((*unit.span(site.node), _site_text(unit, site, sites, divisors)))
    edits.sort()
    data, out, at = unit.data, [], start
    for s, e, text in edits:
        out.append(data[at:s].decode())
        out.append(text)
        at = e
    out.append(data[at:unit.span(kernel)[1]].decode())
    return "".join(out)


def _outermost(unit: Unit, sites: list[_Site]) -> list[_Site]:
    spans = [unit.span(s.node) for s in sites]
    return [s for s, (a, b) in zip(sites, spans) if not any(c <= a and b <= d and (c, d) != (a, b) for c, d in spans)]


def _site_text(unit: Unit, site: _Site, sites: list[_Site], divisors: dict[str, str]) -> str:
    """`static_cast<T>(astra_div(static_cast<uint32_t>(dividend), divisor))` (astra_mod for a remainder), the
    dividend's own sites replaced too."""
    a, b = unit.span(site.dividend)
    inner = [s for s in sites if s is not site and a <= unit.span(s.node)[0] and unit.span(s.node)[1] <= b]
    pieces, at = [], a
    for s in _outermost(unit, inner):
        sa, sb = unit.span(s.node)
        pieces.append(unit.data[at:sa].decode())
        pieces.append(_site_text(unit, s, sites, divisors))
        at = sb
    pieces.append(unit.data[at:b].decode())
    helper = "astra_div" if site.op == "/" else "astra_mod"
    return (f"static_cast<{site.typename}>({helper}(static_cast<uint32_t>({''.join(pieces)}), "
            f"{divisors[site.divisor_host]}))")


def _launches(unit: Unit, kernel, up: dict) -> list[tuple]:
    """[(the launch call, the kernel's reference in it, the kernel's arguments, the statement)] of every launch."""
    found = uses(unit, kernel, chevrons=True)
    if isinstance(found, str):
        raise Refusal(found)
    out = []
    for use in found:
        if use.query:
            raise Refusal(f"queried by {use.query} (line {use.call.extent.start.line}): the copy would not share it")
        call = use.call
        a, b = unit.span(call)
        if not a <= unit.span(use.ref)[0] < b:
            raise Refusal(f"launched through a variable (line {call.extent.start.line})")
        args = [c for c in call.get_arguments()]
        chevron = unit.code(call).lstrip().startswith(use.ref.spelling) and "<<<" in unit.code(call)
        if not chevron:
            args = [c for c in args if unit.span(c)[0] >= unit.span(use.ref)[1]]
        if len(args) != len(_params(kernel)):
            raise Refusal(f"the launch on line {call.extent.start.line} passes {len(args)} arguments for "
                          f"{len(_params(kernel))} parameters")
        if any(_SIDE_EFFECT.search(unit.code(arg)) for arg in [*args, *use.args]):
            raise Refusal(f"an argument of the launch on line {call.extent.start.line} has a side effect")
        statement = call
        while up.get(statement) is not None and up[statement].kind.name in ("UNEXPOSED_EXPR", "PAREN_EXPR"):
            statement = up[statement]
        parent = up.get(statement)
        if parent is None or parent.kind.name not in ("COMPOUND_STMT", "IF_STMT", "FOR_STMT", "WHILE_STMT"):
            raise Refusal(f"the launch on line {call.extent.start.line} is not a statement of its own")
        rest = unit.data[unit.span(statement)[1]:]
        if not rest.lstrip().startswith(b";"):
            raise Refusal(f"the launch on line {call.extent.start.line} is not a statement of its own")
        out.append((call, use.ref, args, (unit.span(statement)[0], unit.span(statement)[1] + rest.index(b";") + 1),
                    use.args))
    if not out:
        raise Refusal("not launched from this file through LaunchKernel or <<<...>>>")
    return out


def _launch_text(unit: Unit, kernel, launch: tuple, statement: tuple[int, int], copy: str, sites: list[_Site],
                 divisors: dict[str, str], namespace: str) -> str:
    """`if (astra_fastdiv_fits(bounds...)) { the copy's launch; } else { the original launch; }`; `launch` is (the
    call, the kernel's reference, its arguments, the launch's grid and block, ...), `statement` the launch's
    (start, end), its `;` included."""
    call, ref, args, config = launch
    filled = {f"{{P{i}}}": _argument(unit, param, arg) for i, (param, arg) in enumerate(zip(_params(kernel), args))}
    threads = (f"{namespace}astra_fastdiv_threads(dim3({unit.code(config[0]).strip()}), "
               f"dim3({unit.code(config[1]).strip()}))")

    def host(text: str) -> str:
        text = text.replace(THREADS, threads)
        return re.sub(r"\{P\d+\}", lambda m: filled[m.group(0)], text)

    bounds = list(dict.fromkeys(host(b) for s in sites for b in s.bounds))
    a, end = statement
    original = unit.data[a:end].decode()
    ra, rb = unit.span(ref)
    ref_text = unit.code(ref)
    renamed = namespace + copy + ref_text[len(kernel.spelling):] if ref_text.startswith(kernel.spelling) else None
    if renamed is None:
        qualified = re.match(r"([\w:]*::)?" + re.escape(kernel.spelling), ref_text)
        if qualified is None:
            raise Refusal(f"the launch names the kernel as `{ref_text}`")
        renamed = (qualified.group(1) or "") + copy + ref_text[qualified.end():]
    fast = unit.data[a:ra].decode() + renamed + unit.data[rb:unit.span(call)[1] - 1].decode()
    fast += "".join(f", {namespace}astra_fast_divisor({host(h)})" for h in dict.fromkeys(
        s.divisor_host for s in sites)) + ")"
    fast += unit.data[unit.span(call)[1]:end].decode()
    indent = unit.indent(a)
    inner = indent + "  "
    return (f"if ({namespace}astra_fastdiv_fits({', '.join(bounds)})) {{\n{inner}{_reindent(fast)}\n"
            f"{indent}}} else {{\n{inner}{_reindent(original)}\n{indent}}}")


def _argument(unit: Unit, param, arg) -> str:
    """The launch's argument as the kernel receives it: converted to an integer parameter's own type (the host's
    arithmetic on it then wraps, narrows and sizes as the kernel's does), a struct as it is."""
    text = unit.code(arg).strip()
    if param.type.get_canonical().kind.name in _INTEGERS | _NARROW:
        return f"static_cast<{_spelled(param.type)}>({text})"
    return f"({text})"


def _spelled(type_) -> str:
    """An integer type as the host can name it, `const` dropped: as written where that is a built-in or standard
    name (`int64_t`, `unsigned int`), else its canonical spelling."""
    own = re.sub(r"\bconst\s+|\s+const\b", "", type_.spelling).strip()
    if re.fullmatch(r"(unsigned |signed )?(char|short|int|long|long long)( int)?|(std::)?u?int(8|16|32|64)_t|"
                    r"(std::)?size_t", own):
        return own
    return re.sub(r"\bconst\s+|\s+const\b", "", type_.get_canonical().spelling).strip()


def _reindent(text: str) -> str:
    return text.replace("\n", "\n  ")


HELPER = """// n / d and n % d as a multiply-high and a shift (Granlund and Montgomery; CUTLASS's FastDivmod), exact for
// 0 <= n < 2^31 and 1 <= d < 2^31: a kernel's _fastdiv copy is launched only where its values fit
struct AstraFastDivisor {
  uint32_t divisor, multiplier, shift;
};

inline AstraFastDivisor astra_fast_divisor(int64_t d) {
  AstraFastDivisor f{static_cast<uint32_t>(d), 0u, 0u};
  if (d > 1) {
    uint32_t log2 = 0;  // ceil(log2(d))
    while ((uint64_t{1} << log2) < static_cast<uint64_t>(d)) ++log2;
    const uint32_t p = 31 + log2;
    f.multiplier = static_cast<uint32_t>(((uint64_t{1} << p) + static_cast<uint64_t>(d) - 1) / static_cast<uint64_t>(d));
    f.shift = p - 32;
  }
  return f;
}

inline int64_t astra_fastdiv_threads(dim3 grid, dim3 block) {  // a launch's threads, at most 2^31
  const uint32_t dims[6] = {grid.x, grid.y, grid.z, block.x, block.y, block.z};
  int64_t threads = 1;
  for (int k = 0; k < 6; ++k) {
    threads *= dims[k];
    if (threads > 0x7fffffff) return int64_t{1} << 31;
  }
  return threads;
}

inline bool astra_fastdiv_fits() { return true; }

template <typename... Rest>
inline bool astra_fastdiv_fits(int64_t value, Rest... rest) {
  return value >= 1 && value <= 0x7fffffff && astra_fastdiv_fits(static_cast<int64_t>(rest)...);
}

__host__ __device__ __forceinline__ uint32_t astra_div(uint32_t n, AstraFastDivisor f) {
#ifdef __CUDA_ARCH__
  return f.divisor == 1 ? n : __umulhi(n, f.multiplier) >> f.shift;
#else
  return f.divisor == 1 ? n : static_cast<uint32_t>((static_cast<uint64_t>(n) * f.multiplier) >> 32) >> f.shift;
#endif
}

__host__ __device__ __forceinline__ uint32_t astra_mod(uint32_t n, AstraFastDivisor f) {
  return n - astra_div(n, f) * f.divisor;
}

"""
