"""What the C++ entry's host checks ask of a draft's dims (astra.sglang.host_checks finds them).

`cond_env` says what each name of a check means in the draft (SymbolicSizes, template arguments,
tensor shapes, scalars, `sizeof`), `host_relations` reads every check under it (skipping those whose
guard is false) and turns the parts into relations: a guessed integer scalar a check names becomes a
dim, a tensor without a TensorMatcher takes the shape its checks state (`x.ndim() == 2`,
`x.numel() == 1`), an equality with a free dim alone on one side makes that dim derived
(`D_out * 2 == D_in` -> `input_width = output_width * 2`), and the rest (divisibility, ranges, fixed
values, disjunctions) stay as constraints every case must meet (astra.spec.constraint_fit).
"""

from __future__ import annotations

import ast
import re
from dataclasses import dataclass, field

from astra.sglang import host_checks
from astra.sglang.cxx_facts import EntryFacts
from astra.spec import meanings
from astra.spec.argument_kinds import CPP_TO_DTYPE
from astra.spec.draft_dims import Dims
from astra.spec.draft_ranks import _reshape, ranked, ranks, rename
from astra.spec.expr import CPP_DTYPES, ExprError, evaluate, names_in


def scalar_placeholder(name: str) -> str:
    """The name standing for a guessed integer scalar in a check, until it is promoted to a dim."""
    return f"_s_{name}"


@dataclass
class Relations:
    """What the entry's host checks ask of the dims, in spec names: `constraints` every case must meet
    (after `derived` took the equalities it could), and the scalars promoted to dims."""

    constraints: list[str] = field(default_factory=list)
    promoted: dict[str, str] = field(default_factory=dict)  # scalar argument -> the dim it became
    reshaped: dict[str, list[str]] = field(default_factory=dict)  # unshaped tensor -> shape from its checks
    notes: list[str] = field(default_factory=list)
    present: dict[str, bool] = field(default_factory=dict)  # optional tensor -> passed (astra.spec.presence)


def cond_env(facts: EntryFacts, binding: dict[str, str], dims: Dims, shapes: dict[str, list[str]],
             scalars: dict[str, object], present: dict[str, bool]) -> host_checks.CondEnv:
    """The names a host check may use, as spec expressions. `scalars`: scalar argument -> its value in
    the draft (a dim expression, a literal, or a placeholder string for a guess)."""
    env = host_checks.CondEnv()
    env.sizes = dict(dims.by_cpp)
    for param, value in binding.items():
        if value == "{dtype}":
            env.types[param] = "elt(dtype)"
        elif value in CPP_DTYPES or value in CPP_TO_DTYPE:
            name = value if value in CPP_DTYPES else CPP_TO_DTYPE[value]
            env.types[param] = f"elt('{name}')"
        elif re.fullmatch(r"[\w ()*/+%-]+", value) and value not in ("true", "false"):
            env.names[param] = value
    if "{dtype}" in binding.values():
        env.types["dtype"] = "elt(dtype)"
    for name, value in (facts.defines or {}).items():
        if re.fullmatch(r"-?\d+", str(value)):
            env.names.setdefault(name, str(value))
    for name, value in scalars.items():
        if isinstance(value, bool):
            env.names[name] = str(value)
        elif isinstance(value, (int, float)):
            env.names[name] = repr(value)
        elif isinstance(value, str):
            env.names[name] = value
    env.cxx = dict(facts.constants)
    for name, fact in facts.tensors.items():
        if fact.shapes and name in shapes:
            env.shapes[name] = shapes[name]
        else:
            env.unshaped.add(name)
    env.present = dict(present)
    return env


def host_relations(facts: EntryFacts, env: host_checks.CondEnv, dims: Dims, token_dim: str | None,
                   guessed: set[str]) -> Relations:
    """Read every host check of `facts` under `env`, promote guessed scalars that a check constrains to
    dims, give unshaped tensors the shape their checks state, and turn equalities into derived dims
    (`D_out * 2 == D_in` -> `input_width = output_width * 2`)."""
    rel = Relations()
    ranks_ = ranks(facts, env)
    parts: list[str] = []
    for check in facts.checks:
        local = host_checks.CondEnv(**{**env.__dict__, "cxx": {**env.cxx, **check.locals}})
        if check.guard is not None and _guard_false(ranked(host_checks.to_python(check.guard, local), ranks_)):
            continue
        for part in host_checks.conjuncts(ranked(host_checks.to_python(check.cond, local), ranks_)):
            if part not in parts and _has_names(part) and not _always_true(part):
                parts.append(part)
    parts = _promote(parts, guessed, dims, rel)
    parts = _reshape(parts, env, dims, rel.reshaped, ranks_)
    parts = [p for p in parts if not _always_true(p)]  # `_t_x__ndim == 2`, now read as `2 == 2`
    for _ in range(2):
        for part in parts:
            _solve_equality(part, dims, token_dim)
    known = set(dims.free) | set(dims.derived) | {"dtype"}
    for part in parts:
        names = meaning_names(part)
        if names <= known:
            rel.constraints.append(part)
        else:
            rel.notes.append(f"host check `{part}` names {sorted(names - known)}: not honoured")
    return rel


def meaning_names(expr: str) -> set[str]:
    return names_in(expr)


def _has_names(expr: str) -> bool:
    return bool(meaning_names(expr))


def _trivially_true(expr: str) -> bool:
    """`a == a`, `a <= a`, `a % 1 == 0` (a template argument of 1 read into a divisibility check)."""
    try:
        tree = ast.parse(expr, mode="eval").body
    except SyntaxError:
        return True
    if isinstance(tree, ast.Compare) and len(tree.ops) == 1 and isinstance(tree.ops[0], (ast.Eq, ast.GtE, ast.LtE)):
        left, right = tree.left, tree.comparators[0]
        if isinstance(left, ast.BinOp) and isinstance(left.op, ast.Mod) and isinstance(tree.ops[0], ast.Eq) \
                and isinstance(left.right, ast.Constant) and left.right.value == 1 \
                and isinstance(right, ast.Constant) and right.value == 0:
            return True
        return ast.dump(left) == ast.dump(right)
    return False


def _always_true(expr: str) -> bool:
    """A tautology, or a disjunction with one (`not (not True and 1 > 1) or n % 1 == 0`: a guard over
    template arguments that rules the check out)."""
    try:
        tree = ast.parse(expr, mode="eval").body
    except SyntaxError:
        return True
    options = tree.values if isinstance(tree, ast.BoolOp) and isinstance(tree.op, ast.Or) else [tree]
    return any(_trivially_true(o) or constant(o, True) for o in map(ast.unparse, options))


def constant(expr: str, value: bool) -> bool:
    """Whether `expr` names nothing and evaluates to `value` (a template bool, an absent optional tensor)."""
    if host_checks.UNKNOWN in expr or meaning_names(expr):
        return False
    try:
        return bool(evaluate(expr, {})) is value
    except ExprError:
        return False


def _guard_false(expr: str) -> bool:
    """Whether a guard reads as a constant False."""
    return constant(expr, False)


_FLAG = re.compile(r"^(is|use|has|enable|do|with|apply)_|_(flag|enabled)$")


def _flag_value(scalar: str, parts: list[str]) -> int | None:
    """A guessed integer scalar that is a flag (named `is_x`, `use_x`, or read as a truth value,
    `!x`) takes 0 or 1, whichever no check over it alone refuses; None when it is no flag."""
    name = scalar_placeholder(scalar)
    mine = [p for p in parts if name in meaning_names(p)]
    negated = any(isinstance(n, ast.UnaryOp) and isinstance(n.op, ast.Not) and isinstance(n.operand, ast.Name)
                  and n.operand.id == name for p in mine for n in ast.walk(ast.parse(p, mode="eval")))
    if not (_FLAG.search(scalar.lower()) or negated):
        return None
    alone = [p for p in mine if meaning_names(p) == {name}]
    for value in (1, 0):
        if not any(constant(rename(p, {name: str(value)}), False) for p in alone):
            return value
    return None


def _promote(parts: list[str], guessed: set[str], dims: Dims, rel: Relations) -> list[str]:
    """Guessed integer scalars that a check names become dims (their value is then what the check
    asks, not the guess); a flag among them takes the value 0 or 1 its checks allow instead."""
    out = []
    for scalar in sorted({n[3:] for p in parts for n in meaning_names(p) if n.startswith("_s_")}):
        value = _flag_value(scalar, parts)
        if value is not None:
            rel.promoted[scalar] = str(value)
            parts = [rename(p, {scalar_placeholder(scalar): str(value)}) for p in parts]
            rel.notes.append(f"scalar `{scalar}` is a flag: {value}, as its host checks allow")
    for part in parts:
        for name in sorted(meaning_names(part)):
            if not name.startswith("_s_"):
                continue
            scalar = name[3:]
            if scalar not in rel.promoted:
                rel.promoted[scalar] = dims.add_free(scalar, f"scalar {scalar}")
                dims.by_cpp.setdefault(scalar, rel.promoted[scalar])
            part = rename(part, {name: rel.promoted[scalar]})
        out.append(part)
    return out


def _expand(expr: str, derived: dict[str, str], depth: int = 0) -> set[str]:
    """The free names `expr` depends on, through derived dims."""
    out: set[str] = set()
    for n in meaning_names(expr):
        if n in derived and depth < 16:
            out |= _expand(derived[n], derived, depth + 1)
        else:
            out.add(n)
    return out


def _solve_equality(part: str, dims: Dims, token_dim: str | None) -> bool:
    """An equality with a free dim alone on one side (or times, plus, minus a constant, or divided by
    one) makes that dim derived; equal products of dims are equal factor by factor."""
    tree = ast.parse(part, mode="eval").body
    if not (isinstance(tree, ast.Compare) and len(tree.ops) == 1 and isinstance(tree.ops[0], ast.Eq)):
        return False
    left, right = tree.left, tree.comparators[0]
    options = []
    for side, other in ((left, right), (right, left)):
        solved = _isolate(side, ast.unparse(other))
        if solved is None:
            continue
        dim, expr = solved
        if dim not in dims.free or dim == token_dim or dim in _expand(expr, dims.derived):
            continue
        options.append((_weight(dim, side), dim, expr))
    if options:
        _, dim, expr = min(options)
        del dims.free[dim]
        dims.derived[dim] = expr
        return True
    lf, rf = _factors(left), _factors(right)
    if lf and rf and len(lf) == len(rf) and lf != rf:
        done = False
        for a, b in zip(lf, rf):
            if a == b:
                continue
            for x, y in ((b, a), (a, b)):
                if x in dims.free and x != token_dim and x not in _expand(y, dims.derived):
                    del dims.free[x]
                    dims.derived[x] = y
                    done = True
                    break
        return done
    return False


def _weight(dim: str, side: ast.expr) -> tuple:
    """Which dim to derive when both sides could be: one alone on its side, named by nothing known
    (an anonymous `x_d1`, a promoted scalar) before one a model configuration gives."""
    return (not isinstance(side, ast.Name), meanings.meaning_of(dim) is not None)


def _isolate(side: ast.expr, other: str) -> tuple[str, str] | None:
    """(dim, expression) when `side == other` solves for one dim: `d`, `d * c`, `d + c`, `d - c`, `d // c`."""
    if isinstance(side, ast.Name):
        return side.id, other
    if isinstance(side, ast.BinOp):
        a, b = side.left, side.right
        const = lambda n: isinstance(n, ast.Constant) and isinstance(n.value, int) and not isinstance(n.value, bool)  # noqa: E731
        if isinstance(side.op, ast.Mult):
            if isinstance(a, ast.Name) and const(b) and b.value:
                return a.id, f"({other}) // {b.value}"
            if isinstance(b, ast.Name) and const(a) and a.value:
                return b.id, f"({other}) // {a.value}"
        if isinstance(a, ast.Name) and const(b):
            if isinstance(side.op, ast.Add):
                return a.id, f"({other}) - {b.value}"
            if isinstance(side.op, ast.Sub):
                return a.id, f"({other}) + {b.value}"
            if isinstance(side.op, ast.FloorDiv) and b.value:
                return a.id, f"({other}) * {b.value}"
    return None


def _factors(node: ast.expr) -> list[str] | None:
    if isinstance(node, ast.Name):
        return [node.id]
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Mult):
        a, b = _factors(node.left), _factors(node.right)
        return a + b if a is not None and b is not None else None
    return None


