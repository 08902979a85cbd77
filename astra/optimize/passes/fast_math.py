"""fast_math: single-precision math calls and divisions in device code become the GPU's fast intrinsics.

    expf(x) -> __expf(x)   (likewise logf, sinf, cosf, tanf, exp2f... see _INTRINSICS)
    1.0f / sqrtf(x) -> rsqrtf(x)
    a / b -> __fdividef(a, b)     (a float division whose divisor is not a literal)

Applies in `__global__` and `__device__` functions only (not `__host__ __device__` ones: the intrinsics
do not exist on the host), to calls of the plain C names and to divisions libclang types as `float`
(a division in a template on a dependent type is left alone; so is one in a `constexpr` declaration,
which an intrinsic cannot initialise). The intrinsics differ from the IEEE results by a few ulp (and
`__fdividef` returns 0 for divisors above 2^126), so the pass asks the spec first (`allows`): it refuses
for a spec that compares outputs exactly (no tolerance, or atol = rtol = 0 for some dtype); without a
spec the harness's tolerance decides (the rule lives in passes.base.tolerated, which vectorize shares).
"""

from __future__ import annotations

from astra.optimize.passes.base import ParsedPass, Refusal, tolerated
from astra.optimize.passes.syntax import Unit, attrs, body, operator, parents, splice, walk

_INTRINSICS = {"expf": "__expf", "logf": "__logf", "sinf": "__sinf", "cosf": "__cosf", "tanf": "__tanf",
               "exp10f": "__exp10f", "log2f": "__log2f", "log10f": "__log10f", "powf": "__powf"}


def allows(spec: dict | None) -> tuple[bool, str]:
    """Whether the spec's tolerance admits approximate math, and why (one line)."""
    return tolerated(spec, "fast math")


class FastMath(ParsedPass):
    name = "fast_math"
    family = "fastmath"

    def rewrite(self, unit: Unit, spec: dict | None) -> tuple[str, str]:
        ok, why = allows(spec)
        if not ok:
            raise Refusal(why)
        edits: list[tuple[int, int, str]] = []
        counts: dict[str, int] = {}
        for function in unit.device_functions():
            if "CUDAHOST_ATTR" in attrs(function) or body(function) is None:
                continue
            up = parents(function)
            for node in walk(body(function)):
                if not unit.in_main(node):
                    continue
                what = _call(unit, node, edits) or _division(unit, node, up, edits)
                if what:
                    counts[what] = counts.get(what, 0) + 1
        if not edits:
            raise Refusal("no expf/logf/sinf/cosf/..., 1/sqrtf or float division in device code")
        done = ", ".join(f"{what} x{n}" for what, n in sorted(counts.items()))
        return splice(unit, edits), f"fast intrinsics in device code: {done} ({why})"


def _call(unit: Unit, node, edits: list) -> str:
    """`expf(x)` -> `__expf(x)`: the callee's name replaced (its arguments may hold other rewrites)."""
    if node.kind.name != "CALL_EXPR" or node.spelling not in _INTRINSICS:
        return ""
    callee = next((c for c in walk(node) if c.kind.name == "DECL_REF_EXPR" and c.spelling == node.spelling), None)
    if callee is None or unit.code(callee) != node.spelling:
        return ""  # spelled through a macro or a qualified name: left alone
    start, end = unit.span(callee)
    edits.append((start, end, _INTRINSICS[node.spelling]))
    return f"{node.spelling}->{_INTRINSICS[node.spelling]}"


def _division(unit: Unit, node, up: dict, edits: list) -> str:
    if node.kind.name != "BINARY_OPERATOR" or operator(unit, node) != "/" or node.type.spelling != "float":
        return ""
    lhs, rhs = list(node.get_children())
    if _constant_context(node, up) or any(_is_division(unit, n) for n in (*walk(lhs), *walk(rhs))):
        return ""
    if _literal(unit, rhs):
        return ""  # by a constant the compiler already multiplies where that is exact
    start, end = unit.span(node)
    root = _skip_implicit(rhs)
    if _literal(unit, lhs) and _is_one(unit, lhs) and root.kind.name == "CALL_EXPR" and root.spelling == "sqrtf":
        args = [a for a in root.get_arguments()]
        if len(args) == 1 and unit.code(root).startswith("sqrtf"):
            edits.append((start, unit.span(args[0])[0], "rsqrtf("))
            return "1/sqrtf->rsqrtf"
        return ""
    edits += [(start, start, "__fdividef("), (unit.span(lhs)[1], unit.span(rhs)[0], ", "), (end, end, ")")]
    return "a/b->__fdividef"


def _is_division(unit: Unit, node) -> bool:
    return node.kind.name == "BINARY_OPERATOR" and operator(unit, node) == "/"


def _skip_implicit(node):
    while node.kind.name in ("UNEXPOSED_EXPR", "PAREN_EXPR") and len(list(node.get_children())) == 1:
        node = next(node.get_children())
    return node


def _literal(unit: Unit, node) -> bool:
    return _skip_implicit(node).kind.name in ("FLOATING_LITERAL", "INTEGER_LITERAL")


def _is_one(unit: Unit, node) -> bool:
    text = unit.code(_skip_implicit(node)).lower().rstrip("f").rstrip(".")
    return text in ("1", "1.0", "1.")


def _constant_context(node, up: dict) -> bool:
    """Whether `node` initialises a `constexpr` or `static` variable, or sits in a template argument."""
    while node in up:
        node = up[node]
        if node.kind.name == "VAR_DECL":
            tokens = [t.spelling for t in node.get_tokens()]
            return "constexpr" in tokens or "static" in tokens
        if node.kind.name in ("COMPOUND_STMT", "FOR_STMT", "IF_STMT"):
            return False
    return False
