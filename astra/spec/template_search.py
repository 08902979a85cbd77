"""Template values the build decides: check a draft's variants with nvcc on the CPU and, when the
original does not compile, search for template arguments that do.

`settle(tree, module, spec, ...)` post-processes the spec that astra.spec.draft returns:
1. every build variant of the draft is compiled (astra.spec.template_check: nvcc `--cubin`, cached
   under $ASTRA_HOME/template-checks);
2. if the main one fails, the entry's template arguments become slots (astra.spec.template_args:
   `{dim}` holes, also through a derived name that only renames a dim, guessed literals and type
   arguments, enum and template-template parameters, mapped onto the parameters the sources declare;
   an argument list that is missing, too long or too short is repaired first, from the call site's
   symbols of the same names); astra.sglang.source_facts reads the conditions that apply to the
   entry (its own kernel and what it instantiates, `if constexpr` branches as guards) and
   astra.sglang.assert_solver proposes values: an assert's equality gives its parameter's value (or
   computes it from the others), bounds and `% k == 0` give candidates and rule out the rest, then the
   models' values of the dim's meaning and powers of two, the nearest to the drafted ones first. Each
   proposal is compiled until one builds or the budget (compiles, cached ones free) is spent; a failed
   static_assert rules out the values it names, a failed bound its whole failing side;
3. the values found go into the spec (a `derived` constant, the entry's literal, the sweep's value
   when the token dim is one an equality computes), a dtype whose variants alone fail is dropped,
   and cases of variants that still fail go to `shapes.exclude` with the compiler's reason. Every
   change is a review note saying what was tried. What cannot build for the target whatever the
   values (PTX ptxas refuses for sm_90a, a static_assert on the architecture, a loader that raises
   for major 9) is said as "does not build for sm_90a: <reason>".
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field, replace
from pathlib import Path

from astra.sglang import assert_solver, registry
from astra.sglang.constexpr_eval import evaluate
from astra.sglang.tree import SglangTree
from astra.spec import jobs
from astra.spec.expr import ExprError, render
from astra.spec.model import KernelSpec
from astra.spec.template_args import (
    TYPES,
    ArgList,
    EntrySources,
    Slot,
    cxx_value,
    lists_with_params,
    rebuild,
    render_entry,
    show,
    slots,
    used_outside_entry,
)
from astra.spec.template_check import (
    CHECK_ARCH,
    CheckResult,
    arch_limit,
    check_request,
    check_variants,
    failed_assert,
    failed_condition,
    loader_refusal,
    nvcc_available,
    spec_requests,
)
from astra.text import one_line
from harness.building.nvcc_build import BuildRequest

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
        self.notes: list[str] = []  # what writing the values found changed besides the entry

    def check(self, keys: list[str] | None = None) -> dict[str, CheckResult]:
        """Compile the draft's variants `keys` (None: all) as the spec stands now; a result nvcc had
        to produce (not a cached one) counts against the budget."""
        results = check_variants(self.spec, self.tree, keys, self.workers)
        self.compiles += sum(not r.cached for r in results.values())
        return results

    def check_request(self, request: BuildRequest) -> CheckResult:
        """Compile one build request (a variant with candidate template arguments), counted likewise."""
        result = check_request(request)
        self.compiles += not result.cached
        return result

    def request_of(self, variant: str) -> BuildRequest | None:
        """The build request of the draft's variant `variant` (None: no such variant)."""
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
    export = spec["build"]["wrappers"][0]["export"]
    if "{" in export:  # no compile can help: the exported symbol itself is unnamed
        out.notes.append(f"not checked: the wrapper's export name `{export}` is a loader variable, not a "
                         f"value the spec can give (the loader builds one module per value of it)")
        out.builds = False
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
    """{dtype: the build variant of its first case}: one compile per dtype tells whether it builds."""
    out: dict[str, str] = {}
    for case in cases:
        out.setdefault(case.dtype, case.variant)
    return out


def _drop_dtypes(spec: dict, failing: list[str], results, by_dtype, out: Settlement) -> None:
    """Drop the dtypes `failing` from the spec (with a note quoting nvcc for each) when another dtype
    builds: the kernel does not support them. Nothing changes when no dtype would be left."""
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
    """Search template arguments for the main dtype's first case when its drafted ones (`first`) do not
    compile (step 2 of the module docstring): the entry's slots and their candidates, narrowed by the
    static_asserts (only the entry's own ones when all of them together have no solution), are
    proposed by astra.sglang.assert_solver and compiled one assignment at a time within the budget;
    each failure adds a nogood (`_nogood`) and reorders a bound's candidates to the side that may
    pass. The first that builds is written into the spec (`_apply`); otherwise `out` says why none
    did (the target cannot build it at all, no value meets the asserts, or what was tried)."""
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
    limit = arch_limit(first.log) or _loader_refuses(ctx)  # PTX the target lacks: no value helps
    if base is None or limit or (not found and not repairs):
        limit = limit or _arch_limit(ctx, first)
        out.notes.append(f"does not build for sm_{CHECK_ARCH}: {limit}" if limit else
                         f"the original does not build with the drafted template arguments and none of them "
                         f"can be searched (nvcc: {first.error})")
        out.builds = False
        return
    facts = ctx.sources.facts
    drafted = {s.param.name: s.candidates for s in found}
    candidates = assert_solver.narrow(drafted, fixed, facts)
    if found and (not all(candidates.values()) or assert_solver.solve(candidates, fixed, facts) is None):
        facts = facts.strict()  # the asserts of what only some paths instantiate may not hold together
        candidates = assert_solver.narrow(drafted, fixed, facts)
    nogoods: list[dict] = []
    tried: list[str] = []
    last = first
    start, failed = ctx.compiles, set()
    for _ in range(4 * ctx.budget):  # the budget counts compiles: a cached result costs nothing
        if ctx.compiles - start >= ctx.budget:
            break
        assignment = assert_solver.solve(candidates, fixed, facts, nogoods) if found else {}
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
            _apply(ctx, lists, found, assignment, fixed)
            note = (f"template arguments chosen by compiling the original (nvcc --cubin): {shown}"
                    + (f"; {'; '.join(ctx.notes)}" if ctx.notes else "")
                    + (f"; {'; '.join(repairs)}" if repairs else "")
                    + f"; the drafted ones failed: {first.error}")
            if tried:
                note += f"; also tried: {'; '.join(tried[:4])}"
            out.notes.append(note)
            out.builds = out.changed = True
            return
        last = result
        tried.append(f"{shown} ({result.error[:140]})")
        if not found or arch_limit(result.log):
            break
        nogood = _nogood(ctx, result, {**fixed, **assignment}, set(assignment), facts)
        nogoods.append(nogood)
        cond = failed_condition(result.log) or ""
        again = cond in failed
        failed.add(cond)
        for name, bad in nogood.items():  # past a bound the assert names (or, failing again, reaches): the
            if isinstance(bad, tuple) and (again or re.search(rf"\b{name}\b", cond)):  # value furthest next
                past = sorted(v for v in candidates[name] if not assert_solver.rules_out(v, bad))
                past = past if bad[0] == ">=" else past[::-1]
                candidates[name] = past + [v for v in candidates[name] if v not in past]
    out.builds = False
    limit = _arch_limit(ctx, last)
    empty = [n for n, values in candidates.items() if not values]
    head = (f"does not build for sm_{CHECK_ARCH}: {limit} ({ctx.compiles} compile(s))" if limit else
            f"no template arguments found that compile ({ctx.compiles} compile(s))"
            + (f"; no value of {', '.join(empty)} meets the static_asserts that name it" if empty else ""))
    out.notes.append(f"{head}; drafted values: {first.error}" + (f"; tried: {'; '.join(tried[:4])}" if tried else "")
                     + ("" if last is first or limit else f"; last: {last.error}"))


def _arch_limit(ctx: _Context, result: CheckResult) -> str | None:
    """Why `result` fails for the target whatever the template arguments: PTX the target lacks, or a
    failed static_assert that reads the architecture (`sizeof(T) * N <= kMaxVecBytes`, kMaxVecBytes set
    by SGL_ARCH_BLACKWELL_OR_GREATER)."""
    if limit := arch_limit(result.log):
        return limit
    cond = failed_assert(result.log)
    arch = sorted(n for n in ctx.sources.facts.depends(cond) if _ARCH_NAME.search(n)) if cond else []
    return f"a static_assert that depends on the architecture ({', '.join(arch)}) fails: {result.error}" if arch \
        else None


def _loader_refuses(ctx: _Context) -> str | None:
    """Why the module's Python loader refuses an sm_90a GPU (it raises for major 9), if it does: no
    template argument can help then (astra.spec.template_check.loader_refusal)."""
    site = ctx.sources.site
    try:
        return loader_refusal((ctx.tree.root / site.file).read_text(errors="replace"), site.loader)
    except OSError:
        return None


_ARCH_NAME = re.compile(r"(^|_)ARCH(_|$)|BLACKWELL|HOPPER|^__CUDA_ARCH")


def _nogood(ctx: _Context, result: CheckResult | None, env: dict, names: set[str], facts) -> dict:
    """The values a failed compile rules out: those of the parameters its failed static_assert (or the
    constexpr definition its error is in) names through constexpr definitions, else the whole assignment;
    a failed bound rules out its whole failing side (`n * size <= budget` failing at n=4: n >= 4)."""
    cond = failed_condition(result.log if result else "")
    named = facts.depends(cond) & names if cond else set()
    typed = {n for n in names if env[n] in TYPES and re.search(rf"\b{env[n]}\b", result.error if result else "")}
    if not named:
        return {n: env[n] for n in (typed or names)}  # an error about a type: the type arguments that are it
    side = assert_solver.failing_side(cond, env, facts, named)
    return {n: (side[n], env[n]) if n in side and type(env[n]) is int else env[n] for n in named}


def _apply(ctx: _Context, lists: list[ArgList], found: list[Slot], assignment: dict, fixed: dict) -> None:
    """Write the values found into the spec: literals into the entry, a changed dim as a derived
    constant, an enum's or a template's hole as its value (the dim dropped when nothing else uses it),
    a computed token dim as the sweep's value."""
    spec = ctx.spec
    wrapper = spec["build"]["wrappers"][0]
    final = [lst.copy() for lst in lists]
    tokens = []
    for slot in found:
        value = assignment[slot.param.name]
        lst = final[slot.list_index]
        if slot.kind in ("dim", "token") and value == slot.value:
            continue
        if slot.kind == "dim":
            _fix_dim(spec, slot.dim, int(value))
        elif slot.kind == "token":
            tokens.append(slot)
        elif slot.kind == "type":
            lst.args[slot.arg_index] = cxx_value(slot, value)
            _retype_argument(ctx, slot, value)
        elif slot.kind in ("enum", "template") and slot.dim:
            lst.args[slot.arg_index] = cxx_value(slot, value)
            if not used_outside_entry(spec, slot.dim):
                _drop_dim(spec, slot.dim)
            if slot.kind == "template":
                _fix_member_dims(ctx, slot.param.name, value)
        else:
            lst.args[slot.arg_index] = cxx_value(slot, value)
    wrapper["entry"] = rebuild(wrapper["entry"], final)
    for slot in tokens:
        _fix_token(ctx, slot, found, assignment, fixed)


def _retype_argument(ctx: _Context, slot: Slot, value: str) -> None:
    """The tensor a guessed type argument was for (`indices` for `indices_dtype`) takes the type found."""
    stem = re.sub(r"_?dtype$", "", str(slot.dim or ""))
    for arg in ctx.spec["arguments"]:
        if arg.get("kind") == "tensor" and arg["name"] == stem and arg.get("dtype") != TYPES[value]:
            ctx.notes.append(f"argument {stem} is now {TYPES[value]} (was {arg.get('dtype')}; its init needs review)")
            arg["dtype"] = TYPES[value]


def _fix_member_dims(ctx: _Context, param: str, chosen: str) -> None:
    """Dims the draft read from a member of the template argument (`Trait1::K`, Trait1 = Trait<1>)
    become that member's value in the class template chosen."""
    facts = ctx.sources.facts
    for dim, doc in list(ctx.spec["dims"].items()):
        m = re.search(r"`(\w+)::(\w+)`", str(doc))
        if not m:
            continue
        head = re.match(r"\s*(\w+)", facts.aliases.get(m.group(1), m.group(1)))
        value = facts.member(chosen, m.group(2)) if head and head.group(1) == param else None
        if isinstance(value, int) and not isinstance(value, bool) and value > 0:
            _fix_dim(ctx.spec, dim, value)
            ctx.notes.append(f"dim {dim} = {chosen}::{m.group(2)} = {value}")


def _fix_token(ctx: _Context, slot: Slot, found: list[Slot], assignment: dict, fixed: dict) -> None:
    """The sweep's dim is a template argument that a static_assert's equality computes from the others
    (`NC == NUM_RED_LOG + NUM_GPUS`): each model entry's tokens (and each edge shape's) become that value."""
    spec = ctx.spec
    expr = assert_solver.dependents([s.param.name for s in found], ctx.sources.facts).get(slot.param.name)
    ks = KernelSpec(path=Path("draft.yaml"), raw=spec)
    values: dict[str, int] = {}
    for case in ks.shape_cases():
        names = ks.names_for(case.dims, spec["dtypes"][0])
        env = {**fixed, **assignment, **{s.param.name: names[s.dim] for s in found if s.dim in names and s is not slot}}
        value = evaluate(expr, env, ctx.sources.facts) if expr else None
        if isinstance(value, int) and value > 0:
            values.setdefault(case.label if not case.edge else f"edge{len(values)}", value)
            if case.edge:
                for edge in spec["shapes"].get("edge") or []:
                    if all(edge.get(k) == v for k, v in case.dims.items() if k != slot.dim):
                        edge[slot.dim] = value
    for entry in spec["shapes"].get("models") or []:
        label = f"{entry['model']}/tp{entry.get('tp', 1)}"
        if label in values:
            entry["tokens"] = [values[label]]
    spec["shapes"]["tokens"] = [next(iter(values.values()), assignment[slot.param.name])]
    ctx.notes.append(f"the sweep's dim {slot.dim} is template argument {slot.param.name}, which the static_asserts "
                     f"compute ({slot.param.name} == {expr}): its tokens are now that value per model "
                     f"({', '.join(f'{k}: {v}' for k, v in values.items())})")


def _fix_dim(spec: dict, dim: str, value: int) -> None:
    """`dim` becomes a derived constant (first, so other derived names may use it)."""
    _drop_dim(spec, dim)
    spec["derived"] = {dim: str(value), **{k: v for k, v in (spec.get("derived") or {}).items() if k != dim}}


def _drop_dim(spec: dict, dim: str) -> None:
    """Remove `dim` from the spec's dims and from every model entry and edge shape that gives it."""
    spec["dims"].pop(dim, None)
    if dim in (spec.get("flags") or []):
        spec["flags"] = [f for f in spec["flags"] if f != dim]
        if not spec["flags"]:
            del spec["flags"]
    for entry in spec["shapes"].get("models") or []:
        (entry.get("dims") or {}).pop(dim, None)
    for entry in spec["shapes"].get("edge") or []:
        entry.pop(dim, None)
