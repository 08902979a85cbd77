"""What a kernel's sources say about its template parameters, read as text (no compiler, no libclang),
and the template values that satisfy it.

`SourceFacts.read(texts, checked)` collects, over a module's include closure:
- template parameter lists (`template <...> struct Name` and function templates), parsed by hand
  (astra.sglang.template_params);
- `constexpr` definitions (`kWarpThreads = 32`, `kRopeVecSize = kRopeDim / (kWarpThreads * 2)`);
- enums and their enumerators (`enum class KVLayout : int32_t { V4 = 0, ... }`);
- from the `checked` files only (the kernel's own): the conditions of `static_assert`s (hard
  constraints), and of `if constexpr` and host checks (`RuntimeCheck`, `CHECK_HOST`: hints only).

`evaluate` (astra.sglang.constexpr_eval) reads a C++ constant expression over known names in
three-valued logic, and `solve` proposes template values, nearest to the drafted ones first, that every
static_assert it can evaluate accepts. The compiler has the last word (astra.spec.template_search);
this only orders what it is asked.
"""

from __future__ import annotations

import itertools
import math
import re
from dataclasses import dataclass, field

from astra.sglang.constexpr_eval import INT_SUFFIX, evaluate
from astra.sglang.template_params import (
    Scopes,
    TemplateParam,
    call_condition,
    drop_inactive,
    namespace_of,
    split_top,
    strip_comments,
    template_params,
)

__all__ = ["POWERS", "Enum", "SourceFacts", "TemplateParam", "evaluate", "literals", "numeric_candidates",
           "ranked_indices", "solve", "split_top", "strip_comments"]

_CHECK_CALLS = re.compile(r"\b(?:RuntimeCheck|CHECK_HOST|TORCH_CHECK|host::RuntimeCheck)\s*\(")


@dataclass
class Enum:
    name: str
    qualified: str  # as a template argument inside namespace sglang, e.g. deepseek_v4::KVLayout
    scoped: bool
    values: dict[str, int] = field(default_factory=dict)

    def literal(self, enumerator: str, type_text: str | None = None) -> str:
        """`enumerator` as a template argument; `type_text`: the enum as the parameter declares it."""
        qualified = type_text or self.qualified
        if self.scoped:
            return f"{qualified}::{enumerator}"
        scope = qualified.rpartition("::")[0]
        return f"{scope}::{enumerator}" if scope else enumerator


@dataclass
class Fact:
    """A condition or constexpr definition read from the sources, with the named scope that holds it."""

    text: str  # the condition (its `if constexpr` guards folded in) or the definition's expression
    scope: str | None  # the struct, class or function (outside any other) holding it; None: namespace level
    name: str = ""  # a definition's name


@dataclass
class SourceFacts:
    constants: dict[str, str] = field(default_factory=dict)  # name -> expression (the first definition read)
    asserts: list[str] = field(default_factory=list)  # static_assert conditions (hard)
    hints: list[str] = field(default_factory=list)  # if constexpr / host check conditions (values only)
    enums: dict[str, Enum] = field(default_factory=dict)
    texts: list[str] = field(default_factory=list)
    facts: dict[str, list[Fact]] = field(default_factory=dict)  # "constants" | "asserts" | "hints" -> read
    bodies: dict[str, list[str]] = field(default_factory=dict)  # named scope -> its texts

    @classmethod
    def read(cls, texts: dict[str, str], checked: set[str]) -> "SourceFacts":
        """`texts`: {path: source} of the include closure; `checked`: paths whose conditions count."""
        facts = cls(facts={"constants": [], "asserts": [], "hints": []})
        for path, raw in texts.items():
            text = drop_inactive(strip_comments(raw))
            scopes = Scopes(text)
            facts.texts.append(text)
            for name, bodies in scopes.bodies(text).items():
                facts.bodies.setdefault(name, []).extend(bodies)
            for m in re.finditer(r"\bconstexpr\s+(?:[\w:]+(?:<[^;{}()]*>)?\s+)*?(\w+)\s*=\s*([^;{}]+);", text):
                facts._add("constants", Fact(" ".join(m.group(2).split()), scopes.top(m.start()), m.group(1)))
            facts._enums(text, namespace_of(text))
            if path not in checked:
                continue
            for kind, calls in (("asserts", re.finditer(r"\bstatic_assert\s*\(", text)),
                                ("hints", itertools.chain(re.finditer(r"\bif\s+constexpr\s*\(", text),
                                                          _CHECK_CALLS.finditer(text)))):
                for m in calls:
                    if (cond := call_condition(text, m.end() - 1)) is not None:
                        guards = scopes.guards(m.start())
                        if guards and kind == "asserts":
                            cond = f"!({' && '.join(guards)}) || ({cond})"
                        facts._add(kind, Fact(cond, scopes.top(m.start())))
        return facts

    def _add(self, kind: str, fact: Fact) -> None:
        self.facts[kind].append(fact)
        if kind == "constants":
            self.constants.setdefault(fact.name, fact.text)  # the kernel's own files are read first: theirs win
        else:
            getattr(self, kind).append(fact.text)

    def for_entry(self, names: list[str]) -> "SourceFacts":
        """The facts that apply to an entry naming `names` (`Kernel`, `run`): those at namespace level and
        in the named scopes the entry's first known name reaches (its body names them, transitively);
        definitions and conditions of other kernels in the same files are left out."""
        start = next((n for n in names if n in self.bodies), None)
        if start is None:
            return self
        reached, todo = set(), [start]
        while todo:
            name = todo.pop()
            if name in reached:
                continue
            reached.add(name)
            for body in self.bodies.get(name, []):
                todo += [w for w in set(re.findall(r"\b[A-Za-z_]\w*\b", body)) if w in self.bodies]
        out = SourceFacts(enums=self.enums, texts=self.texts, bodies=self.bodies,
                          facts={k: [] for k in self.facts})
        for kind, items in self.facts.items():
            for fact in items:
                if fact.scope is None or fact.scope in reached:
                    out._add(kind, fact)
        return out

    def _enums(self, text: str, namespace: str) -> None:
        for m in re.finditer(r"\benum\s+(class\s+|struct\s+)?(\w+)\s*(?::\s*[\w:]+\s*)?\{([^}]*)\}", text):
            enum = Enum(m.group(2), f"{namespace}::{m.group(2)}".strip(":"), bool(m.group(1)))
            value = -1
            for item in split_top(m.group(3)):
                key, _, expr = item.partition("=")
                if not key.strip():
                    continue
                known = evaluate(expr, {}, self) if expr.strip() else None
                value = known if isinstance(known, int) and not isinstance(known, bool) else value + 1
                enum.values[key.strip()] = value
            self.enums.setdefault(enum.name, enum)

    def params_of(self, name: str) -> list[TemplateParam] | None:
        for text in self.texts:
            found = template_params(text, name)
            if found is not None:
                return found
        return None

    def enum_of(self, type_text: str) -> Enum | None:
        return self.enums.get(type_text.split("::")[-1].strip())

    def mentioning(self, names: set[str], conditions: list[str]) -> list[str]:
        """The conditions that name one of `names`, directly or through constexpr definitions."""
        return [c for c in conditions if names & self.depends(c)]

    def depends(self, expr: str, _seen: frozenset = frozenset()) -> set[str]:
        """Every identifier `expr` reaches through constexpr definitions (itself included)."""
        out: set[str] = set()
        for ident in set(re.findall(r"\b[A-Za-z_]\w*\b", expr)):
            out.add(ident)
            if ident not in _seen and self.constants.get(ident):
                out |= self.depends(self.constants[ident], _seen | {ident})
        return out


# ---------------------------------------------------------------- proposing values


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


def solve(candidates: dict[str, list], fixed: dict, facts: SourceFacts, nogoods: list[dict] = (),
          limit: int = 20000) -> dict | None:
    """The first assignment, in order of the candidates' ranks, that every static_assert which can be
    evaluated accepts and that matches no `nogoods` entry (a failed set of values); None when none."""
    names = list(candidates)
    relevant = facts.mentioning(set(names), facts.asserts)
    lists = [candidates[n][:12] for n in names]
    for ix in itertools.islice(ranked_indices([len(values) for values in lists]), limit):
        env = {**fixed, **{n: lists[i][k] for i, (n, k) in enumerate(zip(names, ix))}}
        if any(all(env.get(k) == v for k, v in bad.items()) for bad in nogoods):
            continue
        if all(evaluate(cond, env, facts) is not False for cond in relevant):
            return {n: env[n] for n in names}
    return None


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
