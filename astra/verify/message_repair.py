"""The rule-based repairer of `astra probe`: drafts revised from SGLang's TensorMatcher messages.

A TensorMatcher failure reads "Tensor match failed for Tensor<S>[strides=<...>, dtype=D, device=...] at
FILE:LINE (Root cause: ...)". `MessageRepairer` groups a module's rejected cases by FILE:LINE and cause,
finds the argument (the tensor of shape S and dtype D in every case, narrowed by the `.verify(x)` targets of
the statement at FILE:LINE) and applies one rule per group:

- "Size mismatch for shape#i[('label')]: expected E but got G": when the statement's size is an integer
  scalar argument holding E, the scalar takes the drafted size; else the size becomes the statement's C++
  expression in the spec's names (astra.sglang.cxx_facts: template arguments, constexprs), else the one
  dim equal to E in every case (E varies with the case), else E itself. A free dim used by no other
  tensor (or only where the C++ checks the same size) becomes derived; otherwise only this tensor's
  entry changes. The sweep's dim and the dims of the build's template arguments are never redefined.
- "Size mismatch for stride#0: expected E": the tensor's `row_stride` becomes E (or the one dim equal to it).
- "Dtype value [X] not in the allowed options: [...]": a `{dtype}` tensor narrows the spec's dtypes to
  the allowed ones; else the tensor takes the first allowed dtype a spec can hold (its init redrawn by
  astra.spec.infer for an integer dtype). "DType mismatch: expected X": the tensor takes X.

Every rule is checked against E (or the allowed dtypes) in every rejected case; what holds nowhere is
not proposed. The loop (astra.verify.probe_repair) validates the result and probes it.
"""

from __future__ import annotations

import copy
import re
from pathlib import Path
from typing import Callable

from astra.errors import AstraError
from astra.sglang import cxx_facts
from astra.sglang.tree import SglangTree
from astra.spec import infer, jobs
from astra.spec import model as spec_mod
from astra.spec.draft import _bytes as drafted_bytes
from astra.spec.expr import ExprError, evaluate, names_in
from astra.verify.probe_repair import Mismatch, cxx_to_spec, parse_message, source_statement, spec_dtype

_DIM_SOURCE = re.compile(r"from (?:template argument|SymbolicSize) (\w+)")  # a draft's note on a dim's origin

# ---------------------------------------------------------------- the rule-based repairer


class MessageRepairer:
    """Rules over the kernel's TensorMatcher messages (see the module docstring)."""

    name = "message"

    def repair(self, name: str, spec: dict, record: dict, tree: SglangTree) -> tuple[dict, str] | None:
        try:
            return _Session(name, spec, tree).run(record)
        except (ExprError, ValueError, KeyError):  # a suite that cannot be expanded: nothing to offer
            return None


class _Session:
    """One module's repair: the spec being revised, its cases, and (lazily) the C++ facts of its entry."""

    def __init__(self, name: str, spec: dict, tree: SglangTree):
        self.name, self.spec, self.tree = name, spec, tree
        self.path = Path(name) / "kernel.yaml"
        self.cases = {case.id: case for case in jobs.cases(spec_mod.KernelSpec(self.path, spec))[0]}
        self.drafted_arguments = copy.deepcopy(spec["arguments"])
        self._facts: cxx_facts.EntryFacts | None | bool = False

    def run(self, record: dict) -> tuple[dict, str] | None:
        groups: dict[tuple, list] = {}
        for result in record.get("cases") or []:
            found = parse_message(result.get("message") or "") if result.get("status") == "rejected" else None
            case = self.cases.get(result.get("id"))
            if found is not None and case is not None:
                key = (found.file, found.line, found.kind, found.index, found.label)
                groups.setdefault(key, []).append((case, found))
        notes, touched = [], set()
        for group in groups.values():
            arg = self.identify(group)
            if arg is None:
                continue
            first = group[0][1]
            aspect = (arg, "dtype") if first.kind in ("options", "dtype") else (arg, first.kind, first.index)
            if aspect in touched:
                continue
            rule = {"shape": self.size, "stride": self.stride, "options": self.dtype, "dtype": self.dtype}.get(first.kind)
            did = rule(arg, group) if rule else None
            if did:
                touched.add(aspect)
                notes.append(f"{first.cause} ({first.file}:{first.line}) -> {did}")
        if not notes:
            return None
        self._refresh()
        return self.spec, "; ".join(notes)

    @property
    def token_dim(self) -> str:
        return self.spec["shapes"].get("token_dim", "tokens")

    # ---- which argument
    def identify(self, group: list) -> str | None:
        """The spec argument the group's message is about: the tensor of the drafted shape and dtype in
        every case, narrowed by the statement's `.verify(x)` targets; an alias stands for its target."""
        args = {a["name"]: a for a in self.spec["arguments"]}
        names: set[str] | None = None
        for case, found in group:
            here = {t.alias or t.name for t in case.tensors()
                    if tuple(t.shape) == found.shape and (found.dtype is None or t.dtype == found.dtype)}
            names = here if names is None else names & here
        if names and len(names) > 1:
            statement = source_statement(self.tree, group[0][1].file, group[0][1].line)
            if statement:
                verified = {args[t].get("alias") or t for t in statement[1] if t in args}
                names = names & verified
        return next(iter(names)) if names and len(names) == 1 else None

    def _partners(self, arg: str) -> list[dict]:
        return [a for a in self.spec["arguments"] if a["name"] == arg or a.get("alias") == arg]

    # ---- sizes
    def size(self, arg: str, group: list) -> str | None:
        a = next(x for x in self.spec["arguments"] if x["name"] == arg)
        index = group[0][1].index
        if index >= len(a.get("shape") or []):
            return None
        current = a["shape"][index]
        cxx = self._cxx_dim(arg, group[0][1], index)
        scalar = self._scalar_of(cxx)
        if scalar is not None and not isinstance(scalar.get("value"), str) and all(
                scalar.get("value") == found.expected for _, found in group):
            was, scalar["value"] = scalar["value"], current  # the kernel compares this size with the scalar
            if self._holds(group, lambda names, found: evaluate(str(current), names) == found.got):
                return f"scalar {scalar['name']} = {current} (was {was})"
            scalar["value"] = was
            return None
        target = self._target(group, cxx, current)
        if target is None:
            return None
        if self._redefinable(arg, index, current, target, cxx):
            saved = copy.deepcopy(self.spec)
            self._redefine(str(current), target)
            if not spec_mod.validate(copy.deepcopy(self.spec), self.path) and self._check_size(arg, index, group):
                return f"{arg} shape#{index}: dim {current} = {target} (derived)"
            self.spec.clear()
            self.spec.update(saved)
        for partner in self._partners(arg):
            partner["shape"][index] = target
        if self._check_size(arg, index, group):
            return f"{arg} shape#{index}: {current} -> {target}"
        return None

    def _target(self, group: list, cxx: str | None, current) -> str | int | None:
        """What the size must be: the statement's C++ expression in spec terms, else (the expected value
        varying over cases) the one dim equal to it in every case, else the constant expected value."""
        expected = {found.expected for _, found in group}
        translated = self._translate(cxx) if cxx else None
        if translated is not None and str(translated) != str(current) and self._holds(
                group, lambda names, found: evaluate(str(translated), names) == found.expected):
            return translated
        if len(expected) > 1:
            label = group[0][1].label
            try:
                names = [self._names(case) for case, _ in group]
            except (ExprError, ValueError, KeyError, TypeError, ZeroDivisionError):
                return None
            dims = [*self.spec["dims"], *(self.spec.get("derived") or {})]
            same = [n for n in dims if n != str(current) and
                    all(ns.get(n) == found.expected for ns, (_, found) in zip(names, group))]
            preferred = [n for n in same if n == label] or [n for n in same if n == self.token_dim]
            pick = preferred or same
            return pick[0] if len(pick) == 1 else None
        value = expected.pop()
        return value if isinstance(value, int) and value > 0 else None

    def _redefinable(self, arg: str, index: int, current, target, cxx: str | None) -> bool:
        """Whether the drafted dim itself may become `target`: a free dim (not the sweep, not in the
        build), not used by `target`, whose other shape uses the C++ facts show to be the same size."""
        dim = str(current)
        if dim not in self.spec["dims"] or dim == self.token_dim or dim in names_in(str(target)):
            return False
        build = self.spec["build"]
        texts = [w.get("entry", "") for w in build.get("wrappers", [])] + [str(f) for f in build.get("extra_cuda_cflags", [])]
        if any(dim in names_in(hole) for t in texts for hole in re.findall(r"\{([^{}]+)\}", t)):
            return False
        own = {a["name"] for a in self._partners(arg)}
        others = [(a["name"], j) for a in self.spec["arguments"] if a["name"] not in own and a.get("kind") == "tensor"
                  for j, e in enumerate(a.get("shape") or []) if dim in names_in(str(e))]
        if not others:
            return True
        facts = self.facts()
        if cxx is None or facts is None:
            return False
        for other, j in others:
            entry = next(a["shape"][j] for a in self.spec["arguments"] if a["name"] == other)
            fact = facts.tensors.get(other)
            if str(entry) != dim or fact is None or not fact.shapes or any(
                    len(s) <= j or s[j] != cxx for s in fact.shapes):
                return False
        return True

    def _redefine(self, dim: str, target) -> None:
        del self.spec["dims"][dim]
        if dim in (self.spec.get("flags") or []):
            self.spec["flags"] = [f for f in self.spec["flags"] if f != dim]
            if not self.spec["flags"]:
                del self.spec["flags"]
        derived = dict(self.spec.get("derived") or {})
        later = names_in(str(target)) & set(derived)
        self.spec["derived"] = {**derived, dim: target} if later else {dim: target, **derived}
        shapes = self.spec["shapes"]
        for entry in shapes.get("models") or []:
            (entry.get("dims") or {}).pop(dim, None)
        shapes["edge"] = [{k: v for k, v in e.items() if k != dim} for e in shapes.get("edge") or []]

    def _check_size(self, arg: str, index: int, group: list) -> bool:
        a = next(x for x in self.spec["arguments"] if x["name"] == arg)
        return self._holds(group, lambda names, found: evaluate(str(a["shape"][index]), names) == found.expected)

    def stride(self, arg: str, group: list) -> str | None:
        """stride#0 of a tensor of two dims or more: its `row_stride` (the one strided view specs have)."""
        a = next(x for x in self.spec["arguments"] if x["name"] == arg)
        if group[0][1].index != 0 or len(a.get("shape") or []) < 2:
            return None
        old = a.get("row_stride")
        target = self._target(group, None, old)
        if target is None:
            return None
        a["row_stride"] = target
        if self._holds(group, lambda names, found: evaluate(str(target), names) == found.expected):
            return f"{arg} row_stride {old} -> {target}"
        a["row_stride"] = old
        if old is None:
            del a["row_stride"]
        return None

    # ---- dtypes
    def dtype(self, arg: str, group: list) -> str | None:
        """`options`: the spec's dtypes narrowed to the allowed ones (a `{dtype}` tensor), else the
        tensor's dtype set to the first allowed one specs can hold; `dtype` (another tensor bound the
        dtype): the expected one, `{dtype}` when it is each case's dtype."""
        first = group[0][1]
        a = next(x for x in self.spec["arguments"] if x["name"] == arg)
        old = a.get("dtype", "{dtype}")
        if first.kind == "options":
            allowed = [d for d in (spec_dtype(o) for o in first.options) if d]
            keep = [d for d in self.spec["dtypes"] if d in allowed]
            if old == "{dtype}" and keep:
                self.spec["dtypes"] = keep
                return f"dtypes -> {keep} (the kernel allows {', '.join(first.options)} for {arg})"
            new = allowed[0] if allowed else None
        else:
            expected = [spec_dtype(str(found.expected)) for _, found in group]
            per_case = len({case.dtype for case, _ in group}) > 1 and all(
                e == case.dtype for e, (case, _) in zip(expected, group))
            new = "{dtype}" if per_case else expected[0] if len(set(expected)) == 1 else None
        if new is None or new == old:
            return None
        for partner in self._partners(arg):
            partner["dtype"] = new
            integral = new == "bool" or new.startswith(("int", "uint"))
            if integral and (partner.get("init") or {}).get("dist", "normal") in ("normal", "uniform"):
                others = [(x["name"], x.get("shape") or []) for x in self.spec["arguments"]
                          if x.get("kind") == "tensor" and x["name"] != partner["name"]]
                partner["init"] = infer.tensor_init(partner["name"], new, partner.get("shape") or [], others,
                                                    self.token_dim)
        return f"{arg} dtype {old} -> {new}"

    # ---- C++ facts
    def facts(self) -> cxx_facts.EntryFacts | None:
        """The C++ facts of the spec's entry (libclang), once; None when they cannot be read."""
        if self._facts is False:
            self._facts = None
            wrapper = next((w for w in self.spec["build"].get("wrappers", []) if w.get("export") == self.spec["entry"]), None)
            kernel = self.tree.csrc_dir / self.spec["source"]["kernel_file"]
            if wrapper and kernel.is_file():
                try:
                    facts = cxx_facts.entry_facts(kernel, [str(self.tree.include_dir), str(self.tree.csrc_dir)],
                                                  wrapper["entry"], [str(self.tree.csrc_dir), str(kernel.parent)])
                except (AstraError, OSError, ValueError) as err:
                    facts = cxx_facts.EntryFacts(entry=wrapper["entry"], found=False, notes=[str(err)])
                self._facts = facts if facts.found else None
        return self._facts

    def _cxx_dim(self, arg: str, found: Mismatch, index: int) -> str | None:
        """The C++ size the kernel checks at `index`: the statement at FILE:LINE, else the only matcher of `arg`."""
        statement = source_statement(self.tree, found.file, found.line)
        if statement and len(statement[0]) > index:
            return statement[0][index]
        facts = self.facts()
        fact = facts.tensors.get(arg) if facts else None
        shapes = {s[index] for s in (fact.shapes if fact else []) if len(s) > index}
        return shapes.pop() if len(shapes) == 1 else None

    def _scalar_of(self, cxx: str | None) -> dict | None:
        bare = re.fullmatch(r"(?:static_cast<\w+>)?\(?\s*(\w+)\s*\)?", cxx.strip()) if cxx else None
        return next((a for a in self.spec["arguments"] if bare and a.get("kind") == "scalar"
                     and a["name"] == bare.group(1) and str(a.get("dtype", "")).startswith("int")), None)

    def _translate(self, cxx: str) -> str | None:
        """A C++ size expression in the spec's names: its dims' C++ origins (template arguments and
        SymbolicSizes, as the draft's dim notes say), its integer scalars, the entry's template
        arguments and the file's constexprs (astra.sglang.cxx_facts)."""
        table: dict[str, str] = {}
        for dim, doc in self.spec["dims"].items():
            if m := _DIM_SOURCE.search(str(doc)):
                table.setdefault(m.group(1), dim)
        for a in self.spec["arguments"]:
            value = a.get("value")
            if a.get("kind") == "scalar" and str(a.get("dtype", "")).startswith("int") and \
                    isinstance(value, (int, str)) and not isinstance(value, bool):
                table.setdefault(a["name"], str(value))
        known = set(self.spec["dims"]) | set(self.spec.get("derived") or {})
        facts = self.facts()
        if facts is not None:
            for param, value in facts.template_binding().items():
                hole = re.fullmatch(r"\{(\w+)\}", value.strip())
                if hole and hole.group(1) in known:
                    table.setdefault(param, hole.group(1))
                elif re.fullmatch(r"-?\d+", value.strip()):
                    table.setdefault(param, value.strip())
            for _ in range(3):  # constants defined from other constants
                for const, expr in facts.constants.items():
                    if const not in table and (value := cxx_to_spec(expr, table)) is not None:
                        table[const] = str(value)
        return cxx_to_spec(cxx, table)

    # ---- evaluation over the rejected cases
    def _names(self, case) -> dict:
        spec = spec_mod.KernelSpec(self.path, self.spec)
        dims = {k: v for k, v in case.dims.items() if k in self.spec["dims"]}
        names = spec.names_for(dims, case.dtype)
        for a in self.spec["arguments"]:
            if a.get("kind") == "scalar" and isinstance(a.get("value"), (int, str)) and not isinstance(a.get("value"), bool):
                names.setdefault(a["name"], a["value"] if isinstance(a["value"], int) else evaluate(a["value"], names))
        return names

    def _holds(self, group: list, test: Callable[[dict, Mismatch], bool]) -> bool:
        try:
            return all(test(self._names(case), found) for case, found in group)
        except (ExprError, ValueError, KeyError, TypeError, ZeroDivisionError):
            return False

    def _refresh(self) -> None:
        """Keep what follows from the arguments in step: the drafted byte formula, exclusions of cases gone."""
        if self.spec.get("bytes") == drafted_bytes(self.drafted_arguments):
            self.spec["bytes"] = drafted_bytes(self.spec["arguments"])
        spec = spec_mod.KernelSpec(self.path, self.spec)
        try:
            ids = {case.case_id(dtype) for case in spec.shape_cases() for dtype in spec.dtypes}
        except (ExprError, KeyError):
            return
        shapes = self.spec["shapes"]
        if shapes.get("exclude"):
            shapes["exclude"] = [e for e in shapes["exclude"] if isinstance(e, dict) and e.get("case") in ids]
