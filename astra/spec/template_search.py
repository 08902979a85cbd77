"""Template values the build decides: check a draft's variants with nvcc on the CPU and, when the
original does not compile, search for template arguments that do.

`settle(tree, module, spec, ...)` post-processes the spec that astra.spec.draft returns:
1. every build variant of the draft is compiled (astra.spec.template_check: nvcc `--cubin`, cached
   under $ASTRA_HOME/template-checks);
2. if the main one fails, the entry's template arguments become slots (astra.spec.template_args:
   `{dim}` holes and guessed literals, mapped onto the parameters the sources declare; an argument
   list that is missing, too long or too short is repaired first); astra.sglang.static_asserts
   proposes values (what the static_asserts, `if constexpr`s and host checks name, the models' values
   of the dim's meaning, powers of two; the nearest to the drafted ones first), and each proposal is
   compiled until one builds or the budget is spent, every failed static_assert ruling out the values
   it names;
3. the values found go into the spec (a `derived` constant or the entry's literal), a dtype whose
   variants alone fail is dropped, and cases of variants that still fail go to `shapes.exclude` with
   the compiler's reason. Every change is a review note saying what was tried.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from pathlib import Path

from astra.report.safe_text import one_line
from astra.sglang import registry, static_asserts
from astra.sglang.tree import SglangTree
from astra.spec import jobs
from astra.spec.expr import ExprError, render
from astra.spec.model import KernelSpec
from astra.spec.template_args import (
    ArgList,
    EntrySources,
    Slot,
    cxx_value,
    enum_literal,
    lists_with_params,
    rebuild,
    render_entry,
    show,
    slots,
    used_outside_entry,
)
from astra.spec.template_check import (
    CheckResult,
    check_request,
    check_variants,
    failed_assert,
    nvcc_available,
    spec_requests,
)
from harness.build import BuildRequest

__all__ = ["DEFAULT_BUDGET", "CheckResult", "Settlement", "check_request", "check_variants", "nvcc_available",
           "settle"]

DEFAULT_BUDGET = 8  # compiles per module after the first round


@dataclass
class Settlement:
    """What `settle` did: the review notes, whether the main variant now builds, compiles run."""

    notes: list[str] = field(default_factory=list)
    builds: bool | None = None  # None: not checked (nvcc missing, no variant)
    compiles: int = 0
    changed: bool = False


class _Context:
    """One settle call: the draft, its sources' facts, the compile budget and count."""

    def __init__(self, tree: SglangTree, module: registry.JitModule, spec: dict, workers: int, budget: int):
        self.tree, self.spec, self.workers, self.budget = tree, spec, workers, budget
        self.sources = EntrySources.read(tree, module, spec)
        self.compiles = 0

    def check(self, keys: list[str] | None = None) -> dict[str, CheckResult]:
        results = check_variants(self.spec, self.tree, keys, self.workers)
        self.compiles += sum(not r.cached for r in results.values())
        return results

    def check_request(self, request: BuildRequest) -> CheckResult:
        result = check_request(request)
        self.compiles += not result.cached
        return result

    def request_of(self, variant: str) -> BuildRequest | None:
        return next((req for key, req in spec_requests(self.spec, self.tree) if key == variant), None)


def settle(tree: SglangTree, module: registry.JitModule, spec: dict, *, workers: int = 1,
           budget: int = DEFAULT_BUDGET) -> Settlement:
    """Check the draft `spec` of `module` with nvcc and fix its template values in place (see the module
    docstring). Never raises for the kernel's sake: what could not be settled is a note."""
    out = Settlement()
    if not nvcc_available():
        return out
    try:
        ks = KernelSpec(path=Path("draft.yaml"), raw=spec)
        cases, _ = jobs.cases(ks)
    except (ExprError, KeyError, ValueError, TypeError) as err:
        out.notes.append(f"build check skipped: the draft's cases cannot be made ({one_line(err, 200)})")
        return out
    if not cases or len(spec["build"].get("wrappers") or []) != 1:
        return out
    ctx = _Context(tree, module, spec, workers, budget)
    by_dtype = _first_variant_per_dtype(cases)
    results = ctx.check(list(dict.fromkeys(by_dtype.values())))
    main = spec["dtypes"][0]
    first = results.get(by_dtype.get(main))
    if first is not None and not first.ok:
        passing = [dt for dt, key in by_dtype.items() if results[key].ok]
        if passing:
            _drop_dtypes(spec, [dt for dt in by_dtype if dt not in passing], results, by_dtype, out)
        else:
            _search(ctx, ks, cases, first, out)
    elif first is not None:
        failing = [dt for dt, key in by_dtype.items() if not results[key].ok]
        if failing:
            _drop_dtypes(spec, failing, results, by_dtype, out)
    if out.builds is None:
        out.builds = bool(first and first.ok) or out.changed
    if out.builds:
        _exclude_failing_variants(ctx, out)
    out.compiles = ctx.compiles
    return out


def _first_variant_per_dtype(cases) -> dict[str, str]:
    out: dict[str, str] = {}
    for case in cases:
        out.setdefault(case.dtype, case.variant)
    return out


def _drop_dtypes(spec: dict, failing: list[str], results, by_dtype, out: Settlement) -> None:
    kept = [dt for dt in spec["dtypes"] if dt not in failing]
    if not kept:
        return
    spec["dtypes"] = kept
    for dt in failing:
        out.notes.append(f"dtype {dt} dropped: the original does not build for it (nvcc: "
                         f"{results[by_dtype[dt]].error})")
    out.changed, out.builds = True, True


def _exclude_failing_variants(ctx: _Context, out: Settlement) -> None:
    """Check every variant of the (settled) spec; the cases of those that fail go to shapes.exclude."""
    try:
        ks = KernelSpec(path=Path("draft.yaml"), raw=ctx.spec)
        cases, _ = jobs.cases(ks)
    except (ExprError, KeyError, ValueError, TypeError):
        return
    results = ctx.check(list(dict.fromkeys(c.variant for c in cases)))
    bad = {key: r for key, r in results.items() if not r.ok}
    if not bad or len(bad) == len(results):
        return
    shapes = ctx.spec["shapes"]
    excluded = list(shapes.get("exclude") or [])
    known = {e.get("case") for e in excluded if isinstance(e, dict)}
    for case in cases:
        if case.variant in bad and case.id not in known:
            excluded.append({"case": case.id, "reason": f"does not build: {bad[case.variant].error}"})
    shapes["exclude"] = excluded
    out.notes.append(f"{len(bad)} of {len(results)} build variant(s) do not compile; their cases are excluded "
                     f"(e.g. {next(iter(bad))}: {next(iter(bad.values())).error})")


def _search(ctx: _Context, ks: KernelSpec, cases, first: CheckResult, out: Settlement) -> None:
    spec = ctx.spec
    wrapper = spec["build"]["wrappers"][0]
    entry0 = wrapper["entry"]
    case = next(c for c in cases if c.dtype == spec["dtypes"][0])
    names = ks.names_for(case.dims, case.dtype)
    base = ctx.request_of(case.variant)
    lists, repairs = lists_with_params(ctx.sources, entry0)
    try:
        found, fixed = slots(ctx.sources, lists, names)
    except ExprError as err:
        found, fixed = [], {}
        repairs.append(f"(the entry does not render: {one_line(err, 100)})")
    if base is None or (not found and not repairs):
        out.notes.append(f"the original does not build with the drafted template arguments and none of them "
                         f"can be searched (nvcc: {first.error})")
        out.builds = False
        return
    nogoods: list[dict] = []
    candidates = {s.param.name: s.candidates for s in found}
    tried: list[str] = []
    last = first
    for _ in range(ctx.budget):
        assignment = static_asserts.solve(candidates, fixed, ctx.sources.facts, nogoods) if found else {}
        if assignment is None:
            break
        entry = render_entry(entry0, lists, found, assignment)
        try:
            rendered = render(entry, names)
        except ExprError:
            break
        result = ctx.check_request(replace(base, cuda_wrappers=[(wrapper["export"], rendered)]))
        shown = ", ".join(f"{n}={show(v)}" for n, v in assignment.items()) or rendered
        if result.ok:
            _apply(ctx, lists, found, assignment)
            note = (f"template arguments chosen by compiling the original (nvcc --cubin): {shown}"
                    + (f"; {'; '.join(repairs)}" if repairs else "")
                    + f"; the drafted ones failed: {first.error}")
            if tried:
                note += f"; also tried: {'; '.join(tried[:4])}"
            out.notes.append(note)
            out.builds = out.changed = True
            return
        last = result
        tried.append(f"{shown} ({result.error[:140]})")
        if not found:
            break
        nogoods.append(_nogood(ctx, result, assignment))
    out.builds = False
    out.notes.append(f"no template arguments found that compile ({ctx.compiles} compile(s)); drafted values: "
                     f"{first.error}" + (f"; tried: {'; '.join(tried[:4])}" if tried else "")
                     + ("" if last is first else f"; last: {last.error}"))


def _nogood(ctx: _Context, result: CheckResult | None, assignment: dict) -> dict:
    """The values a failed compile rules out: those of the parameters its failed static_assert names
    (through constexpr definitions), else the whole assignment."""
    cond = failed_assert(result.log if result else "")
    if cond:
        named = ctx.sources.facts.depends(cond) & set(assignment)
        if named:
            return {n: assignment[n] for n in named}
    return dict(assignment)


def _apply(ctx: _Context, lists: list[ArgList], found: list[Slot], assignment: dict) -> None:
    """Write the values found into the spec: literals into the entry, a changed dim as a derived
    constant, an enum's hole as its enumerator (the dim dropped when nothing else uses it)."""
    spec = ctx.spec
    wrapper = spec["build"]["wrappers"][0]
    final = [lst.copy() for lst in lists]
    for slot in found:
        value = assignment[slot.param.name]
        lst = final[slot.list_index]
        if slot.kind == "dim" and value == slot.value:
            continue
        if slot.kind == "dim":
            _fix_dim(spec, slot.dim, int(value))
        elif slot.kind == "enum" and slot.dim:
            lst.args[slot.arg_index] = enum_literal(slot, value)
            if not used_outside_entry(spec, slot.dim):
                _drop_dim(spec, slot.dim)
        else:
            lst.args[slot.arg_index] = cxx_value(slot, value)
    wrapper["entry"] = rebuild(wrapper["entry"], final)


def _fix_dim(spec: dict, dim: str, value: int) -> None:
    """`dim` becomes a derived constant (first, so other derived names may use it)."""
    _drop_dim(spec, dim)
    spec["derived"] = {dim: str(value), **{k: v for k, v in (spec.get("derived") or {}).items() if k != dim}}


def _drop_dim(spec: dict, dim: str) -> None:
    spec["dims"].pop(dim, None)
    for entry in spec["shapes"].get("models") or []:
        (entry.get("dims") or {}).pop(dim, None)
    for entry in spec["shapes"].get("edge") or []:
        entry.pop(dim, None)
