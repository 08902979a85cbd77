"""Where a kernel of a file is launched: SGLang's `LaunchKernel(grid, block, ...)(kernel, args...)`, read on
libclang's tree, for the passes that change a kernel together with its launches (`coarsen`,
`launch_bounds`).

A kernel is reached directly (`LaunchKernel(...)(k<T>, ...)`) or through `auto` variables initialised with
it whole (`static constexpr auto kernel = k<T>;`, then `LaunchKernel(...)(kernel, ...)`), or with a choice
between two of its instantiations (`const auto kernel = c ? k<A> : k<B>;`), or with such a variable; occupancy and
attribute queries (`get_blocks_per_sm(kernel, block)`, `cudaFuncSetAttribute(kernel, ...)`) name it too.
Any other reference (a function pointer handed elsewhere, a call through a typed pointer) is reported as
such: the passes cannot see what is done with it. A pass that handles the triple-chevron launch
(`k<T><<<grid, block, smem, stream>>>(args)`) asks for it (`chevrons=True`): its Use's `args` are then the
launch configuration (grid, block, ...) as for LaunchKernel. `qualifier` names a kernel's namespace from the
function that launches it, for the passes that write a name of the kernel's file into a launch.
"""

from __future__ import annotations

from dataclasses import dataclass

from astra.optimize.passes.syntax import Unit, callee, walk

# Queries that take the kernel as an argument, and where their block size stands (None: they take none).
QUERIES = {"get_blocks_per_sm": 1, "cudaFuncSetAttribute": None, "cudaFuncGetAttributes": None,
           "cudaOccupancyMaxActiveBlocksPerMultiprocessor": 2, "cudaOccupancyMaxPotentialBlockSize": None}


@dataclass(frozen=True)
class Use:
    """One launch or query of a kernel."""

    call: object  # the launch `LaunchKernel(...)(kernel, ...)`, or the query's call
    ref: object  # the reference to the kernel itself (`k<T, 256>`; in an alias's initializer for an alias)
    args: tuple  # LaunchKernel's arguments (grid, block, ...) for a launch; the query's for a query
    query: str = ""  # the query's name; "" for a launch


def uses(unit: Unit, kernel, chevrons: bool = False) -> list[Use] | str:
    """Every launch and query of `kernel` from this file (directly, or through a variable initialised with
    it; with `chevrons`, triple-chevron launches too), or why not: a reference that is neither (line given)."""
    up = unit.parents()
    refs = [n for n in unit.nodes() if _names(n, kernel) and unit.in_main(n)
            and not unit.span(kernel)[0] <= unit.span(n)[0] < unit.span(kernel)[1]]
    out: list[Use] = []
    pending = [(ref, ref) for ref in refs]  # (a reference, the kernel's own reference it stands for)
    seen = set()
    while pending:
        ref, origin = pending.pop(0)
        found = _use(unit, ref, origin, up) or (_chevron(unit, ref, origin, up) if chevrons else None)
        if found is not None:
            out.append(found)
            continue
        alias = _alias_of(unit, ref, up)
        if alias is None:
            if ref is origin:
                return f"referenced other than as LaunchKernel(grid, block, ...)(kernel, ...) (line {ref.extent.start.line})"
            return f"{ref.spelling} is used other than as a launch's kernel (line {ref.extent.start.line})"
        if (alias.hash, origin.hash) in seen:
            continue
        seen.add((alias.hash, origin.hash))
        pending += [(n, origin) for n in unit.nodes()
                    if n.kind.name == "DECL_REF_EXPR" and n.referenced == alias and unit.in_main(n)]
    return out


def launch_grids(unit: Unit, kernel, chevrons: bool = False) -> list[tuple[object, object]] | str:
    """[(the launch call, its grid argument)] for every launch of `kernel` (one per call; queries left out), or
    why not: a reference `uses` cannot account for, or no launch from this file."""
    found = uses(unit, kernel, chevrons)
    if isinstance(found, str):
        return found
    out = {use.call.hash: (use.call, use.args[0]) for use in found if not use.query}
    where = "LaunchKernel or <<<...>>>" if chevrons else "LaunchKernel"
    return list(out.values()) or f"not launched from this file through {where}"


def _use(unit: Unit, site, origin, up: dict) -> Use | None:
    """The launch or query whose kernel argument is `site`; `origin` is the kernel's own reference."""
    node = _outer(site, up)
    call = up.get(node)
    if call is None or call.kind.name != "CALL_EXPR":
        return None
    if callee(call) in QUERIES:
        return Use(call, origin, tuple(call.get_arguments()), callee(call))
    children = list(call.get_children())
    operator_ref = len(children) > 2 and children[1].spelling == "operator()"  # a call outside a template
    if len(children) < 2 or children[2 if operator_ref else 1] != node:
        return None
    constructs = [n for n in walk(children[0]) if n.kind.name in ("CALL_EXPR", "UNEXPOSED_EXPR",
                                                                  "CXX_FUNCTIONAL_CAST_EXPR")
                  and unit.code(n).startswith("LaunchKernel(")]
    if not constructs:
        return None
    construct = constructs[-1]  # the innermost: `LaunchKernel(...)` itself, not `.enable_pdl(...)` around it
    args = [a for a in construct.get_children() if a.kind.name not in ("TYPE_REF", "TEMPLATE_REF", "NAMESPACE_REF")]
    args = [a for a in args if unit.span(a)[0] > unit.span(construct)[0] + len("LaunchKernel")]
    if len(args) < 2:
        return None
    return Use(call, origin, tuple(args))


def _chevron(unit: Unit, site, origin, up: dict) -> Use | None:
    """The triple-chevron launch whose kernel is `site` (`k<T><<<grid, block, ...>>>(args)`), or None."""
    node = _outer(site, up)
    call = up.get(node)
    if call is None or call.kind.name != "CALL_EXPR":
        return None
    children = list(call.get_children())
    if len(children) < 2 or children[0] != node or children[1].kind.name != "CALL_EXPR" or not unit.code(
            children[1]).startswith("<<<"):
        return None
    config = [c for c in children[1].get_children() if not unit.code(c).startswith("<<<")]
    return Use(call, origin, tuple(config)) if len(config) >= 2 else None


def _outer(node, up: dict):
    """`node` with the conversions, parentheses and references wrapped around it."""
    while node in up and up[node].kind.name in ("UNEXPOSED_EXPR", "DECL_REF_EXPR", "PAREN_EXPR"):
        node = up[node]
    return node


def _alias_of(unit: Unit, ref, up: dict):
    """The variable `ref` initialises whole (`auto kernel = ref;`), also as a branch of a choice between
    instantiations of one kernel (`auto kernel = c ? k<A> : k<B>;`), or None."""
    node = _outer(ref, up)
    parent = up.get(node)
    if parent is not None and parent.kind.name == "CONDITIONAL_OPERATOR":
        branches = [_inner(c) for c in list(parent.get_children())[1:]]
        if node == list(parent.get_children())[0] or len(branches) != 2 or not all(
                _named(b) == ref.spelling for b in branches):
            return None
        node = _outer(parent, up)
        parent = up.get(node)
    if parent is not None and parent.kind.name == "VAR_DECL" and list(parent.get_children())[-1] == node:
        head = [t.spelling for t in parent.get_tokens()]
        if "auto" in head[:head.index(parent.spelling)] if parent.spelling in head else False:
            return parent  # a declared function-pointer type would no longer match a changed signature
    return None


def _named(node) -> str:
    """The function a reference names (`k` of `k<T, 4>`, also where the template is left unresolved)."""
    if node.kind.name not in ("DECL_REF_EXPR", "OVERLOADED_DECL_REF"):
        return ""
    inner = next(iter(node.get_children()), None)
    return node.spelling or (inner.spelling if inner is not None and inner.kind.name == "OVERLOADED_DECL_REF" else "")


def _inner(node):
    """`node` without the conversions and parentheses around it."""
    while node.kind.name in ("UNEXPOSED_EXPR", "PAREN_EXPR") and len(list(node.get_children())) == 1:
        node = next(node.get_children())
    return node


def _names(node, kernel) -> bool:
    kind = node.kind.name
    if kind == "DECL_REF_EXPR" and node.referenced is not None:
        return node.referenced == kernel
    if kind == "OVERLOADED_DECL_REF":
        return node.spelling == kernel.spelling
    return False


def namespaces(cursor) -> list[str]:
    """The named namespaces `cursor` is declared in, outermost first (classes passed through)."""
    parts = []
    parent = cursor.semantic_parent
    while parent is not None and parent.kind.name != "TRANSLATION_UNIT":
        if parent.kind.name == "NAMESPACE" and parent.spelling:
            parts.append(parent.spelling)
        parent = parent.semantic_parent
    return list(reversed(parts))


def qualifier(kernel, host) -> str:
    """What names the kernel's namespace from the launching function's (`detail::` from `sglang` for
    `sglang::detail`; nothing where they share it)."""
    inner, outer = namespaces(kernel), namespaces(host) if host is not None else []
    common = 0
    while common < min(len(inner), len(outer)) and inner[common] == outer[common]:
        common += 1
    return "".join(f"{p}::" for p in inner[common:])
