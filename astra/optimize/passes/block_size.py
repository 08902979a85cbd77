"""The one block size every launch of a kernel in its file uses, known at compile time: what `launch_bounds`
writes as `__launch_bounds__` and what `vectorize` needs to know a loop's stride is the CTA's thread count.

- The launches are SGLang's `LaunchKernel(grid, block, ...)(kernel, ...)`, the kernel named directly or
  through a variable initialised with it (passes.launches); occupancy queries that take a block size
  (`get_blocks_per_sm`, `cudaOccupancyMaxActiveBlocksPerMultiprocessor`) count as launches.
- A block size is an integer literal, a `const`/`constexpr` variable (local, namespace or class member)
  whose initialiser is one, arithmetic (`+ - * / % << >>`) and casts of those, or a `dim3` of such
  extents (the size is their product). Where every launch gives one number, the block size is that number;
  where the size rests on a template parameter of the launching code, it is written in the kernel's
  template parameters bound at each launch to the same value (`k<T, kThreads>` launched with `kThreads`
  threads gives `kThreadsOfTheKernel`), and every launch must give the same expression.

`launch_block(unit, kernel)` gives that size as text, or "!" and why there is none (a run-time block size,
a reference to the kernel other than launches and queries, a query that chooses the block size, launches
that disagree, a size outside 1..1024, a kernel that already has `__launch_bounds__` or `__maxnreg__` or is
declared twice); `value(unit, node)` a block-size expression's integer, `extents(node)` a `dim3`'s extents.
"""

from __future__ import annotations

from astra.optimize.passes.launches import QUERIES, Use, uses
from astra.optimize.passes.syntax import Unit, walk

_CASTS = ("UNEXPOSED_EXPR", "PAREN_EXPR", "CSTYLE_CAST_EXPR", "CXX_STATIC_CAST_EXPR", "CXX_FUNCTIONAL_CAST_EXPR")
_ARITHMETIC = ("+", "-", "*", "/", "%", "<<", ">>")
_OPERATORS = {"Add": "+", "Sub": "-", "Mul": "*", "Div": "/", "Rem": "%", "Shl": "<<", "Shr": ">>"}
_MAX_THREADS = 1024


def launch_block(unit: Unit, kernel) -> str:
    """The block size every launch of `kernel` uses, as text, or "!" and why there is none."""
    head = [t.spelling for t in kernel.get_tokens() if t.location.offset < kernel.location.offset]
    # libclang leaves __launch_bounds__ unnamed, and a kernel's extent may start after its attributes
    others = [" ".join(t.spelling for t in c.get_tokens()) for c in kernel.get_children()
              if c.kind.name.endswith("_ATTR") and c.kind.name != "CUDAGLOBAL_ATTR"]
    if any("launch_bounds" in t.lower() or "maxnreg" in t.lower() for t in head + others):
        return "!already has __launch_bounds__ or __maxnreg__"
    if others:
        return f"!already has an attribute besides __global__ (`{others[0]}`, perhaps __launch_bounds__ through a macro)"
    if unit.data[kernel.location.offset:].decode(errors="replace").split("(")[0].strip() != kernel.spelling:
        return "!its name is spelled through a macro"
    twice = [f for f in unit.nodes() if f.kind.name in ("FUNCTION_DECL", "FUNCTION_TEMPLATE") and f != kernel
             and f.spelling == kernel.spelling and f.canonical == kernel.canonical]
    if twice:
        return f"!declared again on line {twice[0].extent.start.line}: the bound would have to be on every declaration"
    found = uses(unit, kernel)
    if isinstance(found, str):
        return "!" + found
    sized = []
    for use in found:
        if use.query == "cudaOccupancyMaxPotentialBlockSize":
            return "!an occupancy query chooses its block size"
        if use.query and QUERIES[use.query] is None:
            continue  # an attribute query: no block size
        at = QUERIES[use.query] if use.query else 1
        if len(use.args) <= at:
            return f"!a {use.query or 'launch'} without a block size (line {use.call.extent.start.line})"
        sized.append((use, use.args[at]))
    if not any(not use.query for use, _ in sized):
        return "!not launched from this file through LaunchKernel"
    values = [value(unit, block) for _, block in sized]
    if all(v is not None for v in values):
        if len(set(values)) > 1:
            return f"!launches disagree on the block size ({', '.join(str(v) for v in sorted(set(values)))})"
        if not 1 <= values[0] <= _MAX_THREADS:
            return f"!block size {values[0]} outside 1..{_MAX_THREADS}"
        return str(values[0])
    params = _parameters(kernel)
    written = set()
    for use, block in sized:
        direct = unit.span(use.call)[0] <= unit.span(use.ref)[0] < unit.span(use.call)[1]  # not through an alias
        text = _symbolic(unit, block, _arguments(unit, use, params), direct)
        if text is None:
            return "!" + _why_not(unit, block, use)
        written.add(text)
    if len(written) > 1:
        return f"!launches disagree on the block size ({', '.join(sorted(written))})"
    return written.pop()


def _why_not(unit: Unit, block, use: Use) -> str:
    what = f"the {use.query} query" if use.query else "a launch"
    text = " ".join(_text(unit, block).split())
    if len(extents(block) or []) > 1 or text.startswith(("dim3", "{")):
        return f"{what} on line {use.call.extent.start.line} has a 2-D/3-D or dim3 block `{text}` with an extent not known at compile time"
    if _templated(block):
        return (f"{what} on line {use.call.extent.start.line} has a block size (`{text}`) resting on a template "
                "parameter that no template argument of the kernel equals")
    return f"{what} on line {use.call.extent.start.line} has a block size not known at compile time (`{text}`)"


def _templated(node) -> bool:
    """Whether a block-size expression reads a template parameter (directly or through constants)."""
    dims = extents(node)
    if dims is not None:
        return any(_templated(e) for e in dims)
    node = _strip(node)
    if node.kind.name == "DECL_REF_EXPR" and node.referenced is not None:
        if node.referenced.kind.name == "TEMPLATE_NON_TYPE_PARAMETER":
            return True
        init = _constant(node.referenced)
        return init is not None and _templated(init)
    return node.kind.name == "BINARY_OPERATOR" and any(_templated(c) for c in node.get_children())


def _text(unit: Unit, node) -> str:
    if node.location.file is not None and node.location.file.name == unit.path:
        return unit.code(node)
    return " ".join(t.spelling for t in node.get_tokens())


def _strip(node):
    """`node` without casts, conversions and parentheses."""
    while node.kind.name in _CASTS:
        inner = [c for c in node.get_children() if c.kind.name not in ("TYPE_REF", "NAMESPACE_REF", "TEMPLATE_REF")]
        if len(inner) != 1:
            break
        node = inner[0]
    return node


def extents(node) -> list | None:
    """The extents of a `dim3(...)`/`{...}` block, or None when `node` is not one."""
    node = _strip(node)
    if node.kind.name == "CALL_EXPR" and node.spelling == "dim3":
        return [a for a in node.get_arguments() if any(True for _ in a.get_tokens())]  # defaults are 1
    if node.kind.name == "INIT_LIST_EXPR":
        return list(node.get_children())
    return None


def _constant(decl) -> object | None:
    """The initialiser of a `const`/`constexpr` variable, or None."""
    if decl is None or decl.kind.name != "VAR_DECL":
        return None
    tokens = [t.spelling for t in decl.get_tokens()]
    name_at = tokens.index(decl.spelling) if decl.spelling in tokens else len(tokens)
    if not {"constexpr", "const"} & set(tokens[:name_at]):
        return None
    children = [c for c in decl.get_children() if c.kind.name not in ("TYPE_REF", "NAMESPACE_REF", "TEMPLATE_REF")
                and not c.kind.name.endswith("_ATTR")]
    return children[-1] if children and "=" in tokens[name_at:] else None


def _operator(node) -> str:
    spelled = getattr(node, "binary_operator", None)
    return _OPERATORS.get(getattr(spelled, "name", ""), "")


def value(unit: Unit, node) -> int | None:
    """The integer a block-size expression has at compile time, or None."""
    dims = extents(node)
    if dims is not None:
        if not dims or len(dims) > 3:
            return None
        product = 1
        for extent in dims:
            v = value(unit, extent)
            if v is None:
                return None
            product *= v
        return product
    node = _strip(node)
    kind = node.kind.name
    if kind == "INTEGER_LITERAL":
        tokens = [t.spelling for t in node.get_tokens()]
        try:
            return int(tokens[0].rstrip("uUlL").replace("'", ""), 0) if tokens else None
        except ValueError:
            return None
    if kind == "DECL_REF_EXPR":
        init = _constant(node.referenced)
        return value(unit, init) if init is not None else None
    if kind == "BINARY_OPERATOR":
        op = _operator(node)
        sides = list(node.get_children())
        if op not in _ARITHMETIC or len(sides) != 2:
            return None
        a, b = value(unit, sides[0]), value(unit, sides[1])
        if a is None or b is None or (op in ("/", "%") and b == 0):
            return None
        return {"+": a + b, "-": a - b, "*": a * b, "/": a // b, "%": a % b, "<<": a << b, ">>": a >> b}[op]
    return None


def _parameters(kernel) -> list[str]:
    """The kernel's template parameters' names, in order ('' for a type or template parameter)."""
    kinds = ("TEMPLATE_NON_TYPE_PARAMETER", "TEMPLATE_TYPE_PARAMETER", "TEMPLATE_TEMPLATE_PARAMETER")
    return [c.spelling if c.kind.name == "TEMPLATE_NON_TYPE_PARAMETER" else ""
            for c in kernel.get_children() if c.kind.name in kinds]


def _arguments(unit: Unit, use: Use, params: list[str]) -> list[tuple[str, object, str]]:
    """(kernel parameter, argument node or None, argument text) of each non-type template argument the
    kernel's reference spells (`k<T, 256>`); none where they are deduced or a pack."""
    at = unit.span(use.ref)[1]
    while at < len(unit.data) and unit.data[at:at + 1].isspace():
        at += 1
    if not params or unit.data[at:at + 1] != b"<":
        return []
    spans, depth, start = [], 0, at + 1
    for i in range(at, len(unit.data)):
        ch = unit.data[i:i + 1]
        if ch in (b"<", b"(", b"[", b"{"):
            depth += 1
        elif ch in (b">", b")", b"]", b"}"):
            depth -= 1
        if depth == 0 or (depth == 1 and ch == b","):
            spans.append((start, i))
            start = i + 1
        if depth == 0:
            break
    if len(spans) != len(params):
        return []
    nodes = {}
    for node in unit.nodes():
        nodes.setdefault(unit.span(node), node)  # the outermost node of each extent
    out = []
    for param, (a, b) in zip(params, spans):
        text = unit.data[a:b].decode()
        a += len(text) - len(text.lstrip())
        b -= len(text) - len(text.rstrip())
        if param:
            out.append((param, nodes.get((a, b)), text.strip()))
    return out


def _same(a, b) -> bool:
    """Whether two expressions are spelled alike and name the same declarations (so have one value)."""
    def refs(node):
        return [n.referenced for n in walk(node) if n.kind.name == "DECL_REF_EXPR"]

    spelled = [t.spelling for t in a.get_tokens()], [t.spelling for t in b.get_tokens()]
    named = refs(a), refs(b)
    return spelled[0] == spelled[1] and named[0] == named[1] and None not in named[0]


def _symbolic(unit: Unit, node, args: list, same_scope: bool) -> str | None:
    """A block-size expression written in the kernel's template parameters, or None."""
    dims = extents(node)
    if dims is not None:
        parts = [_symbolic(unit, e, args, same_scope) for e in dims]
        if not parts or len(parts) > 3 or any(p is None for p in parts):
            return None
        return " * ".join(f"({p})" if not p.isidentifier() and not p.isdigit() else p for p in parts)
    known = value(unit, node)
    bare = _strip(node)
    for param, arg, arg_text in args:
        target = _strip(arg) if arg is not None else None
        if target is not None and _same(bare, target):
            return param
        if known is not None and target is not None and value(unit, target) == known:
            return param
        if same_scope and " ".join(_text(unit, bare).split()) == " ".join(arg_text.split()):
            return param
    if known is not None:
        return str(known)
    if bare.kind.name == "DECL_REF_EXPR":
        init = _constant(bare.referenced)
        return _symbolic(unit, init, args, False) if init is not None else None
    if bare.kind.name == "BINARY_OPERATOR" and _operator(bare) in _ARITHMETIC:
        sides = [_symbolic(unit, s, args, same_scope) for s in bare.get_children()]
        if len(sides) != 2 or None in sides:
            return None
        left, right = (s if s.isidentifier() or s.isdigit() else f"({s})" for s in sides)
        return f"{left} {_operator(bare)} {right}"
    return None
