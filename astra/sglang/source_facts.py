"""What a kernel's sources say about its template parameters, read as text (no compiler, no libclang).

`SourceFacts.read(texts, checked)` collects, over a module's include closure:
- template parameter lists (`template <...> struct Name` and function templates), parsed by hand
  (astra.sglang.template_params);
- `constexpr` definitions (`kWarpThreads = 32`, `kRopeVecSize = kRopeDim / (kWarpThreads * 2)`);
- enums and their enumerators (`enum class KVLayout : int32_t { V4 = 0, ... }`);
- from the `checked` files only (the kernel's own): the conditions of `static_assert`s (hard
  constraints; an `if constexpr` branch's guarded by its condition), and of `if constexpr` and host
  checks (`RuntimeCheck`, `CHECK_HOST`: hints only); each with the named scope holding it, so that
  `for_entry` keeps those of the entry's kernel and of what it instantiates (their own constants
  inlined, their parameters bound to the entry's arguments), not other kernels' of the same file.

The sources are scanned with comments and literals blanked (astra.cxx.text), so that a bracket, or
a kernel's name in a message (`"use RMSNormKernel for ..."`), counts for nothing; conditions and
definitions are quoted as written. The branches a CUDA compile skips (`#ifdef USE_ROCM`) are dropped. astra.sglang.assert_solver proposes template values these facts accept;
the compiler has the last word (astra.spec.template_search).
"""

from __future__ import annotations

import itertools
import re
from dataclasses import dataclass, field, replace

from astra.cxx.brackets import closing, split_top
from astra.cxx.text import blank
from astra.sglang.constexpr_eval import evaluate
from astra.sglang.template_params import (
    Scopes,
    TemplateParam,
    bind_names,
    call_condition,
    class_templates,
    drop_inactive,
    fits_template_param,
    inline_names,
    namespace_of,
    template_params,
)

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
    nested: bool = False  # inside a member function (or another named scope) of `scope`


@dataclass
class SourceFacts:
    constants: dict[str, str] = field(default_factory=dict)  # name -> expression (the first definition read)
    asserts: list[str] = field(default_factory=list)  # static_assert conditions (hard)
    hints: list[str] = field(default_factory=list)  # if constexpr / host check conditions (values only)
    enums: dict[str, Enum] = field(default_factory=dict)
    texts: list[str] = field(default_factory=list)  # every file read (comments and literals blanked)
    facts: dict[str, list[Fact]] = field(default_factory=dict)  # "constants" | "asserts" | "hints" -> read
    bodies: dict[str, list[str]] = field(default_factory=dict)  # named scope -> its texts
    own: list[str] = field(default_factory=list)  # the texts of the checked files (the kernel's own)
    hard: list[str] = field(default_factory=list)  # (for_entry) asserts every instantiation of the entry meets
    aliases: dict[str, str] = field(default_factory=dict)  # `using Trait = Kernel<kDim, kRows>;` (for depends)
    members: dict[tuple, str] = field(default_factory=dict)  # (scope, name) -> its own definition

    @classmethod
    def read(cls, texts: dict[str, str], checked: set[str]) -> "SourceFacts":
        """`texts`: {path: source} of the include closure; `checked`: paths whose conditions count."""
        facts = cls(facts={"constants": [], "asserts": [], "hints": []})
        for path, raw in texts.items():
            text = drop_inactive(blank(raw, literals=False))  # what facts quote: literals as written
            code = blank(text)  # what is scanned: a bracket or a name in a literal does not count
            scopes = Scopes(code)
            facts.texts.append(code)
            for name, bodies in scopes.bodies(code).items():
                facts.bodies.setdefault(name, []).extend(bodies)
            for m in re.finditer(r"\bconstexpr\s+(?:[\w:]+(?:<[^;{}()]*>)?\s+)*?(\w+)\s*=\s*([^;{}]+);", code):
                named = scopes.named(m.start())
                fact = Fact(" ".join(text[m.start(2):m.end(2)].split()), next(iter(named), None), m.group(1),
                            len(named) > 1)
                facts._add("constants", fact)
                facts.members.setdefault((fact.scope, fact.name), fact.text)
            facts._enums(text, namespace_of(code))
            for m in re.finditer(r"\busing\s+(\w+)\s*=\s*([^;{}]+);", code):
                facts.aliases.setdefault(m.group(1), " ".join(text[m.start(2):m.end(2)].split()))
            if path not in checked:
                continue
            facts.own.append(code)
            for kind, calls in (("asserts", re.finditer(r"\bstatic_assert\s*\(", code)),
                                ("hints", itertools.chain(re.finditer(r"\bif\s+constexpr\s*\(", code),
                                                          _CHECK_CALLS.finditer(code)))):
                for m in calls:
                    if (cond := call_condition(text, m.end() - 1, code)) is not None:
                        guards = scopes.guards(m.start())
                        if guards and kind == "asserts":
                            cond = f"!({' && '.join(guards)}) || ({cond})"
                        named = scopes.named(m.start())
                        facts._add(kind, Fact(cond, next(iter(named), None), nested=len(named) > 1))
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
        out = SourceFacts(enums=self.enums, texts=self.texts, bodies=self.bodies, own=self.own, aliases=self.aliases,
                          members=self.members,
                          facts={k: [] for k in self.facts})
        local: dict[str, dict[str, str]] = {}  # scope -> its own definitions (they shadow the others)
        for fact in self.facts["constants"]:
            if fact.scope in reached and fact.scope != start:
                local.setdefault(fact.scope, {}).setdefault(fact.name, fact.text)
            elif fact.scope is None or fact.scope == start:
                out._add("constants", fact)
        bound = self._bindings(start, reached)
        for kind in ("asserts", "hints"):
            for fact in self.facts[kind]:
                if fact.scope is None or fact.scope in reached:
                    text = bind_names(inline_names(fact.text, local.get(fact.scope, {})), bound.get(fact.scope, {}))
                    out._add(kind, Fact(text, fact.scope, nested=fact.nested))
                    if kind == "asserts" and (fact.scope is None or fact.scope == start and not fact.nested):
                        out.hard.append(text)
        return out

    def _bindings(self, start: str, reached: set[str]) -> dict[str, dict[str, str]]:
        """{scope: {parameter: argument}} of the templates the entry's own body instantiates with
        arguments (`using Trait = AttnTrait<kDim, kNvb>;`: AttnTrait's kDim_ is the entry's kDim)."""
        body = "\n".join(self.bodies.get(start, []))
        out: dict[str, dict[str, str]] = {}
        for scope in reached - {start}:
            m = re.search(rf"(?<![\w:]){re.escape(scope)}\s*<", body)
            close = closing(body, m.end() - 1) if m else None
            params = self.params_of(scope) if close is not None else None
            if params:
                args = split_top(body[m.end():close])
                out[scope] = {p.name: a for p, a in zip(params, args) if p.kind == "value" and a != p.name}
        return out

    def member(self, scope: str, name: str):
        """The value of `scope::name`, a static constexpr member of a struct (`N128K512Trait::K`)."""
        local = {n: text for (sc, n), text in self.members.items() if sc == scope}
        return evaluate(inline_names(local[name], local), {}, self) if name in local else None

    def strict(self) -> "SourceFacts":
        """These facts with only the asserts every instantiation of the entry meets (those of its own
        scope, outside its member functions): the others are instantiated only on some paths."""
        return replace(self, asserts=list(self.hard), hints=list(self.hints))

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

    def templates_for(self, param: TemplateParam, exclude: set[str] = frozenset()) -> list[str]:
        """The kernel's class templates that fit template template parameter `param`, in source order."""
        names = dict.fromkeys(n for text in self.own for n in class_templates(text) if n not in exclude)
        return [n for n in names if fits_template_param(param, self.params_of(n) or [])]

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
            definition = self.constants.get(ident) or self.aliases.get(ident)
            if ident not in _seen and definition:
                out |= self.depends(definition, _seen | {ident})
        return out
