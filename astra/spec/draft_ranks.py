"""Ranks and shapes of the tensors that no TensorMatcher shapes, read from host checks
(astra.spec.host_relations reads the checks).

`ranks` picks, for a tensor whose check lists the ranks it takes (`x.ndim() == 1 || x.ndim() == 2`),
the smallest, and `ranked` writes it into a condition, so that the other ranks' branches are skipped;
`_reshape` gives each such tensor its dims: the rank from `x.ndim() == k`, `x.ndim() >= k`, the
indices its sizes are read at (`x.size(1)`, `x.size(-2)`), one more when its numel is read too, or
another tensor's rank (`alpha.ndim() == A.ndim() - 1`).
"""

from __future__ import annotations

import ast
import re

from astra.sglang import host_checks
from astra.sglang.cxx_facts import EntryFacts
from astra.spec.draft_dims import Dims
from astra.spec.expr import ExprError, evaluate, names_in


def meaning_names(expr: str) -> set[str]:
    return names_in(expr)


_NDIM = re.compile(r"^_t_(\w+?)__ndim$")


def ranks(facts: EntryFacts, env: host_checks.CondEnv) -> dict[str, int]:
    """The rank the draft gives each unshaped tensor whose check lists the ranks it takes
    (`x.ndim() == 1 || x.ndim() == 2`): the smallest, so that the checks of the other ranks' branches
    (`if (x.ndim() == 2) ...`) are skipped rather than read together."""
    out: dict[str, int] = {}
    for check in facts.checks:
        if check.guard is not None:
            continue
        local = host_checks.CondEnv(**{**env.__dict__, "cxx": {**env.cxx, **check.locals}})
        try:
            tree = ast.parse(host_checks.to_python(check.cond, local), mode="eval").body
        except SyntaxError:
            continue
        while isinstance(tree, ast.BoolOp) and isinstance(tree.op, ast.And) and len(tree.values) == 1:
            tree = tree.values[0]
        options = tree.values if isinstance(tree, ast.BoolOp) and isinstance(tree.op, ast.Or) else [tree]
        found: dict[str, list[int]] = {}
        for o in options:
            if not (isinstance(o, ast.Compare) and len(o.ops) == 1 and isinstance(o.ops[0], ast.Eq)):
                break
            a, b = o.left, o.comparators[0]
            if isinstance(b, ast.Name):
                a, b = b, a
            if not (isinstance(a, ast.Name) and _NDIM.match(a.id) and isinstance(b, ast.Constant)
                    and isinstance(b.value, int)):
                break
            found.setdefault(_NDIM.match(a.id).group(1), []).append(b.value)
        else:
            if len(found) == 1:
                (tensor, values), = found.items()
                out.setdefault(tensor, min(v for v in values if v >= 0))
    return out


def ranked(expr: str, ranks: dict[str, int]) -> str:
    """`expr` with the chosen ranks in place of the placeholders for them."""
    for tensor, rank in ranks.items():
        expr = re.sub(rf"\b_t_{re.escape(tensor)}__ndim\b", str(rank), expr)
    return expr


def rename(expr: str, table: dict[str, str]) -> str:
    tree = ast.parse(expr, mode="eval")
    for node in ast.walk(tree):
        if isinstance(node, ast.Name) and node.id in table:
            node.id = table[node.id]
    return ast.unparse(tree.body)


def _reshape(parts: list[str], env: host_checks.CondEnv, dims: Dims, reshaped: dict[str, list[str]],
             ranks: dict[str, int] | None = None) -> list[str]:
    """Tensors without a TensorMatcher: their rank from `x.ndim() == k` (or the rank chosen among
    those a check lists), their dims from `x.size(i) == e`, a one-element tensor from
    `x.numel() == 1`; a tensor whose sizes are read only up to index i but whose numel a check also
    reads (`x.numel() / tokens % head_size`) has one more dim: the numel counts more than the leading
    dims."""
    facts: dict[str, dict[str, str]] = {tensor: {"ndim": str(rank)} for tensor, rank in (ranks or {}).items()}
    pattern = re.compile(r"^_t_(\w+?)__(m?\d+|numel|ndim)$")
    numel_read = {pattern.match(n).group(1) for p in parts for n in meaning_names(p)
                  if pattern.match(n) and pattern.match(n).group(2) == "numel"}
    low: dict[str, int] = {}  # tensor -> least rank, from `x.ndim() >= k` or `x.ndim() > k`
    for part in parts:
        tree = ast.parse(part, mode="eval").body
        if isinstance(tree, ast.Compare) and len(tree.ops) == 1 and isinstance(tree.ops[0], (ast.GtE, ast.Gt)) \
                and isinstance(tree.left, ast.Name) and _NDIM.match(tree.left.id) \
                and _int(ast.unparse(tree.comparators[0])) is not None:
            bound = _int(ast.unparse(tree.comparators[0])) + isinstance(tree.ops[0], ast.Gt)
            low[_NDIM.match(tree.left.id).group(1)] = bound
            facts.setdefault(_NDIM.match(tree.left.id).group(1), {})
        if isinstance(tree, ast.Compare) and len(tree.ops) == 1 and isinstance(tree.ops[0], ast.Eq):
            for a, b in ((tree.left, tree.comparators[0]), (tree.comparators[0], tree.left)):
                if isinstance(a, ast.Name) and pattern.match(a.id):
                    tensor, what = pattern.match(a.id).groups()
                    facts.setdefault(tensor, {}).setdefault(what, ast.unparse(b))
    table: dict[str, str] = {}
    # tensors whose rank is another's (`alpha.ndim() == A.ndim() - 1`) after the others
    order = sorted(facts, key=lambda t: _int(facts[t].get("ndim")) is None and bool(facts[t].get("ndim")))
    for tensor in order:
        known = facts[tensor]
        if tensor not in env.unshaped or not env.present.get(tensor, True):
            continue
        rank = _int(known.get("ndim"))
        indices = [int(k) for k in known if k.isdigit()]
        if rank is None and known.get("ndim"):
            rank = _int(str(_value(rename(known["ndim"], table))))
        least = [low.get(tensor, 0)] + [int(k[1:]) for k in known if k.startswith("m")]
        if rank is None and (indices or max(least)):
            rank = max([max(indices, default=-1) + 1 + (tensor in numel_read and "numel" not in known)] + least)
        elif rank is None:
            rank = 1 if "numel" in known else None
        if rank is None or not 0 <= rank <= 8:
            continue
        if rank == 1 and "numel" in known and "0" not in known and _int(known["numel"]) is not None:
            shape = [str(_int(known["numel"]))]
        else:
            shape = [dims.add_free(f"{tensor}_d{i}", f"any size ({tensor} dim {i})") for i in range(rank)]
        reshaped[tensor] = shape
        table[f"_t_{tensor}__ndim"] = str(rank)
        for i, d in enumerate(shape):
            table[f"_t_{tensor}__{i}"] = d
            table[f"_t_{tensor}__m{rank - i}"] = d
        table[f"_t_{tensor}__numel"] = " * ".join(shape) if shape else "1"
    out = []
    for part in parts:
        names = meaning_names(part)
        if any(pattern.match(n) for n in names):
            if not all(n in table for n in names if pattern.match(n)):
                continue
            part = rename(part, {n: f"({table[n]})" for n in names if n in table})
            part = ast.unparse(ast.parse(part, mode="eval").body)
        out.append(part)
    return out


def _value(expr: str):
    try:
        return evaluate(expr, {})
    except ExprError:
        return None


def _int(text: str | None) -> int | None:
    if text is None:
        return None
    try:
        value = ast.literal_eval(text.strip())
    except (ValueError, SyntaxError):
        return None
    return value if isinstance(value, int) and not isinstance(value, bool) else None
