"""Template values that a kernel's static_asserts accept, proposed before nvcc is asked.

The conditions come from astra.sglang.source_facts (`SourceFacts`: the asserts, hints and constexpr
definitions that apply to one entry); `evaluate` (astra.sglang.constexpr_eval) reads each over known
names in three-valued logic (True, False, unknown). From them:
- `numeric_candidates` lists values worth trying for one numeric parameter: the drafted value, the
  models' values, the literals of every condition that names it, and powers of two, nearest first;
- `narrow` solves the asserts that name one parameter alone: an equality gives its value, a bound its
  edge and the powers of two at it, `% k == 0` multiples of k, and only the values these asserts accept
  remain (`solved_for` reads one condition);
- `dependents` finds the parameters an equality computes from the others (`NC == A + B`), which the
  search computes instead of enumerating;
- `solve` proposes the first assignment, in the candidates' rank order (`ranked_indices`), that every
  assert it can evaluate accepts and that no earlier failure ruled out;
- `failing_side` and `rules_out` turn a failed compile into what it rules out: the value, or for a
  failed bound (`n * size <= budget` failing at n=4) the whole failing side (n >= 4).
The compiler has the last word (astra.spec.template_search).
"""

from __future__ import annotations

import itertools
import math
import re

from astra.cxx.brackets import split_top
from astra.sglang.constexpr_eval import INT_SUFFIX, comparison, conjuncts, evaluate
from astra.sglang.source_facts import SourceFacts

POWERS = [1 << i for i in range(0, 15)]


def literals(conditions: list[str]) -> list[int]:
    """Integer literals in the conditions (and, for `% n`, a few multiples of n)."""
    out: list[int] = []
    for cond in conditions:
        text = INT_SUFFIX.sub(r"\1", cond)
        for m in re.finditer(r"(%\s*)?\b(\d+)\b", text):
            n = int(m.group(2))
            out += [n, 2 * n, 4 * n] if m.group(1) else [n]
    return [n for n in dict.fromkeys(out) if 0 <= n <= 1 << 16]


def numeric_candidates(name: str, current: int | None, extra: list[int], facts: SourceFacts) -> list[int]:
    """Values for numeric template parameter `name`: the drafted one, the model values in `extra`, the
    literals of every condition that mentions it, and powers of two; the nearest to the draft first."""
    mentioning = facts.mentioning({name}, facts.asserts + facts.hints)
    pool = dict.fromkeys([*([current] if current is not None else []), *extra, *literals(mentioning), *POWERS])
    values = [v for v in pool if isinstance(v, int) and not isinstance(v, bool)]
    if current is None or current <= 0:
        return values
    return sorted(values, key=lambda v: (v != current, v not in extra,
                                         abs(math.log2(max(v, 0.5) / current)), v))


def narrow(candidates: dict[str, list], fixed: dict, facts: SourceFacts) -> dict[str, list]:
    """Each parameter's candidates with the values the static_asserts that name it alone (besides fixed
    values and constants) solve for it: an equality gives its value, a bound its edge and the powers of
    two at it, `% k == 0` multiples of k; then only those these asserts accept (none: an empty list)."""
    names = set(candidates)
    out = {}
    for name, values in candidates.items():
        unary = [c for cond in facts.asserts for c in conjuncts(cond)
                 if name in (d := facts.depends(c)) and not d & (names - {name})]
        exact, near = [], []
        for conj in unary:
            found = solved_for(name, conj, fixed, facts)
            exact += found["=="]
            near += found["~"]
        pool = [*exact, *values, *near] if all(isinstance(v, int) for v in values) else list(values)
        out[name] = [v for v in dict.fromkeys(pool)
                     if all(evaluate(c, {**fixed, name: v}, facts) is not False for c in unary)]
    return out


def solved_for(name: str, cond: str, env: dict, facts: SourceFacts) -> dict[str, list[int]]:
    """Values of `name` that condition `cond` points at, with the other names' values in `env`:
    {"==": what an equality (or one branch of a disjunction of them) requires, "~": values at its bounds
    and multiples}."""
    out: dict[str, list[int]] = {"==": [], "~": []}
    for branch in split_top(cond, "||"):
        for conj in conjuncts(branch):
            m = re.fullmatch(rf"{re.escape(name)}\s*%\s*(.+?)\s*==\s*0", conj)
            if m and isinstance(k := evaluate(m.group(1), env, facts), int) and k > 0:
                out["~"] += [k * i for i in (1, 2, 4, 8, 16)]
                continue
            sides = comparison(conj)
            if sides is None:
                continue
            left, op, right = sides
            if right == name:
                left, right, op = right, left, {"<": ">", ">": "<", "<=": ">=", ">=": "<="}.get(op, op)
            if left != name or not isinstance(v := evaluate(right, env, facts), int) or isinstance(v, bool):
                continue
            if op == "==":
                out["=="].append(v)
            elif op in ("<", "<="):
                edge = v - (op == "<")
                out["~"] += [edge, *([1 << (edge.bit_length() - 1)] if edge > 0 else [])]
            elif op in (">", ">="):
                edge = v + (op == ">")
                out["~"] += [edge, *([1 << max(edge - 1, 0).bit_length()] if edge >= 0 else [])]
    return out


def dependents(names: list[str], facts: SourceFacts) -> dict[str, str]:
    """{parameter: expression} of the asserts' equalities that give one parameter from the others
    (`NC == NUM_RED_LOG + NUM_GPUS`): the search computes it instead of trying values."""
    out: dict[str, str] = {}
    pool = set(names)
    for cond in facts.mentioning(pool, facts.asserts):
        for conj in conjuncts(cond):
            sides = comparison(conj)
            if sides is None or sides[1] != "==":
                continue
            for side, other in ((sides[0], sides[2]), (sides[2], sides[0])):
                uses = facts.depends(other) & pool
                if (side in pool and side not in out and uses and side not in uses and not uses & set(out)
                        and not any(side in facts.depends(e) for e in out.values())):
                    out[side] = other
                    break
    return out


def solve(candidates: dict[str, list], fixed: dict, facts: SourceFacts, nogoods: list[dict] = (),
          limit: int = 20000) -> dict | None:
    """The first assignment, in order of the candidates' ranks, that every static_assert which can be
    evaluated accepts and that matches no `nogoods` entry (a failed set of values); None when none.
    A parameter an equality gives from the others (`dependents`) is computed, not enumerated."""
    names = list(candidates)
    relevant = facts.mentioning(set(names), facts.asserts)
    derived = dependents(names, facts)
    lists = [(candidates[n] or [0])[:1] if n in derived else candidates[n][:12] for n in names]
    seen: set[tuple] = set()
    for ix in itertools.islice(ranked_indices([len(values) for values in lists]), limit):
        env = {**fixed, **{n: lists[i][k] for i, (n, k) in enumerate(zip(names, ix))}}
        for name, expr in derived.items():
            value = evaluate(expr, env, facts)
            if isinstance(value, int) and not isinstance(value, bool) and (value > 0 or value in candidates[name]):
                env[name] = value
        key = tuple(repr(env[n]) for n in names)
        if key in seen or any(all(rules_out(env.get(k), v) for k, v in bad.items()) for bad in nogoods):
            continue
        seen.add(key)
        if all(evaluate(cond, env, facts) is not False for cond in relevant):
            return {n: env[n] for n in names}
    return None


def rules_out(value, bad) -> bool:
    """Whether `value` is what a nogood entry rules out: a value, or (">=" | "<=", bound) for every value
    on the failing side of a bound (a failed `n * size <= budget` fails for every larger n too)."""
    if isinstance(bad, tuple):
        op, bound = bad
        return isinstance(value, int) and (value >= bound if op == ">=" else value <= bound)
    return value == bad


def failing_side(cond: str, env: dict, facts: SourceFacts, names: set[str]) -> dict[str, str]:
    """{name: ">=" | "<="} for the `names` that a failed bound of `cond` grows with on its large side
    (`kOccupancy * kSmemBytes <= 233472`: larger kOccupancy fails too) or its small side; only sides
    that add and multiply (no `-`, `/`, `%`, `>>`) count."""
    out: dict[str, str] = {}
    for conj in conjuncts(cond):
        sides = comparison(conj)
        if sides is None or sides[1] not in ("<", "<=", ">", ">=") or evaluate(conj, env, facts) is True:
            continue
        big, small = (sides[0], sides[2]) if sides[1] in ("<", "<=") else (sides[2], sides[0])
        for side, op, other in ((big, ">=", small), (small, "<=", big)):
            if re.search(r"-|/|%|>>|\?", side):
                continue
            for name in names & facts.depends(side) - facts.depends(other):
                out.setdefault(name, op)
    return out


def ranked_indices(sizes: list[int]):
    """Every index tuple into lists of `sizes`, lazily, in the order of (sum of the indices, the tuple):
    what sorting the whole product gives, without building it (12 values of 8 slots are 430M tuples)."""
    if any(size <= 0 for size in sizes):
        return
    room = [sum(size - 1 for size in sizes[i:]) for i in range(len(sizes) + 1)]  # the most the rest can add

    def tuples(i: int, total: int):
        if i == len(sizes):
            yield ()
            return
        for first in range(max(0, total - room[i + 1]), min(sizes[i] - 1, total) + 1):
            for rest in tuples(i + 1, total - first):
                yield (first, *rest)

    for total in range(room[0] + 1):
        yield from tuples(0, total)
