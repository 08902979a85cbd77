"""Assemble a spec draft for one JIT module from the evidence (see astra.spec.infer).

`draft_module(tree, module)` returns the spec as a dict plus review notes: the entry's facts
(`module_facts`, the best described export first), its dims (astra.spec.draft_dims), its arguments
(astra.spec.draft_arguments), the relations its host checks state (astra.spec.host_relations), and
the cases (astra.spec.draft_cases): models by what the dims mean (astra.spec.meanings) and by the
runtime's gates on head sizes, dims moved where a check asks; cases whose tensors would exceed
`MAX_CASE_BYTES` are left out of the sweep.
"""

from __future__ import annotations

import os
import re

from astra.errors import BadInput
from astra.sglang import cxx_facts, registry, variants
from astra.sglang.tree import SglangTree, sha256_file
from astra.spec import evidence, meanings, presence
from astra.spec.argument_kinds import offsets_init, type_aliases
from astra.spec.draft_arguments import build_arguments, index_constraints, main_dtypes
from astra.spec.draft_arguments import bytes_expr as _bytes  # the name astra.verify.message_repair imports
from astra.spec.draft_cases import MAX_CASE_BYTES, fill_models, gate_models
from astra.spec.draft_dims import Dims, bind_template, dims_from_facts, token_dim_of
from astra.spec.draft_tables import lead_as_tokens, table_shape
from astra.spec.draft_traffic import distinct_scatter_indices
from astra.spec.expr import names_in
from astra.spec.host_relations import Relations, cond_env, host_relations, scalar_placeholder

__all__ = ["MAX_CASE_BYTES", "draft_module", "infer_error", "module_facts"]


def _defines(flags: list[str]) -> dict[str, str]:
    out = {}
    for flag in flags:
        if flag.startswith("-D") and "{" not in flag:
            name, _, value = flag[2:].partition("=")
            out[name] = value or "1"
    return out


def module_facts(tree: SglangTree, module: registry.JitModule) -> list[tuple[int, cxx_facts.EntryFacts]]:
    """(wrapper index, facts) of each CUDA export, the best described first."""
    site = module.call_sites[0]
    guess = variants.guess(site)
    source = registry.resolve_source(tree, site.cuda_files[0]) if site.cuda_files else None
    if source is None:
        return []
    roots = [str(tree.csrc_dir), str(source.parent)]
    loader = tree.root / site.file
    hints = re.findall(r"[\"']([A-Z]\w+)[\"']", loader.read_text(errors="replace")) if loader.is_file() else []
    out = []
    for i, (_, entry, lang) in enumerate(guess.wrappers):
        if lang != "cuda":
            continue
        facts = cxx_facts.entry_facts(source, [str(tree.include_dir), str(tree.csrc_dir)], entry, roots,
                                      _defines(guess.extra_cuda_cflags), hints)
        out.append((i, facts))
    def score(item):
        facts = item[1]
        shaped = sum(1 for t in facts.tensors.values() if t.shapes)
        return (facts.found, shaped == len(facts.tensors) and shaped > 0, shaped, -item[0])
    return sorted(out, key=score, reverse=True)


def draft_module(tree: SglangTree, module: registry.JitModule, export: str | None = None,
                 runtime: bool = True) -> tuple[dict, list[str]]:
    """(spec, review notes) for `module`; `runtime=False` skips SGLang's runtime call sites."""
    site = module.call_sites[0]
    guess = variants.guess(site)
    notes = [f"template argument `{s}` = {guess.values[s]} was guessed from its name" for s in guess.guessed]
    exports = sorted({w[0] for w in guess.wrappers})
    if export and export not in exports:  # before libclang reads anything
        raise BadInput(f"--export {export}: module {module.name} has no export of that name (its exports: "
                       f"{', '.join(exports) or 'none'}); leave --export out for the best described one")
    candidates = module_facts(tree, module)
    if export:
        candidates = [c for c in candidates if guess.wrappers[c[0]][0] == export]
        if not candidates:
            raise BadInput(f"--export {export}: not a CUDA export of module {module.name} that Astra can read; "
                           "leave --export out for the best described one")
    if not candidates or not candidates[0][1].found:
        why = candidates[0][1].notes[0] if candidates and candidates[0][1].notes else "no CUDA export"
        raise infer_error(module.name, why)
    index, facts = candidates[0]
    export_name = guess.wrappers[index][0]
    raw_entry = site.wrappers[index].entry
    entry, binding, dim_symbols, more = bind_template(facts, raw_entry, site.template_args, guess.values, guess.fixed)
    notes += more
    source = registry.resolve_source(tree, site.cuda_files[0])
    for alias, target in (type_aliases(source.read_text(errors="replace")) if source else {}).items():
        binding.setdefault(alias, target)  # with_dtype<RID_T>() where the file says `using RID_T = int64_t;`
    dims = Dims()
    shapes = dims_from_facts(facts, binding, dims)
    token_dim = token_dim_of(shapes, dims)
    ev = evidence.wrapper_evidence(tree, site, export_name, [p for p, _ in facts.params])
    unshaped = [n for n in facts.tensors if n not in shapes]
    matched_token_dim = token_dim
    fallback = [token_dim or dims.add_free("tokens", "tokens"), dims.add_free("hidden", "hidden size")]
    shape_guessed: set[str] = set()  # tensors still at the fallback shape: left out of `bytes`
    for name in unshaped:
        like = ev.like(name) if ev else None
        if like in shapes:
            shapes[name] = list(shapes[like])
            notes.append(f"tensor `{name}`: shape of `{like}`, as the wrapper allocates it ({ev.where})")
            continue
        named = None if facts.tensors[name].optional else table_shape(facts, name, fallback, dims)
        if named:
            shapes[name] = named
            notes.append(f"tensor `{name}`: shape {named} from the sizes its entry reads (rows: a table)")
            continue
        shapes[name] = list(fallback)
        if facts.tensors[name].optional:
            notes.append(f"optional tensor `{name}`: no check found; drafted as None (present: false)")
        else:
            shape_guessed.add(name)
            notes.append(f"tensor `{name}`: no TensorMatcher check found; shape guessed as {fallback}")
    token_dim = token_dim or fallback[0]
    sweep_dtypes = main_dtypes(ev)
    int_main = bool(sweep_dtypes) and not sweep_dtypes[0].startswith(("float", "bf"))
    guessed: set[str] = set()
    arguments, _ = build_arguments(facts, binding, shapes, token_dim, ev, [], int_main=int_main, guessed=guessed)
    rel = _host_relations(facts, binding, dims, shapes, arguments, token_dim, guessed)
    if matched_token_dim is None:
        lead_as_tokens(rel, dims, token_dim, notes)
    for name, shape in rel.reshaped.items():
        shapes[name] = shape
        shape_guessed.discard(name)
        notes[:] = [n for n in notes if not n.startswith(f"tensor `{name}`: no TensorMatcher")]
        notes.append(f"tensor `{name}`: shape {shape} from its host checks")
    notes += rel.notes
    arguments, dtype_used = build_arguments(facts, binding, shapes, token_dim, ev, notes, int_main=int_main,
                                            promoted=rel.promoted)
    for scalar, dim in ((s, d) for s, d in rel.promoted.items() if not d.isdigit()):
        notes.append(f"scalar `{scalar}` became dim `{dim}`: a host check constrains it")
    notes += offsets_init(arguments, dims.derived, token_dim)
    for a in arguments:
        if a["name"] in rel.present:
            a["present"] = rel.present[a["name"]]
            notes[:] = [n for n in notes if not n.startswith(f"tensor `{a['name']}` is optional (None allowed)")]
    distinct_scatter_indices(arguments, notes)
    _uncount_guessed(arguments, shape_guessed, notes)
    checks = rel.constraints + index_constraints(arguments)
    used, used_derived = _used_dims(arguments, dims, token_dim, entry)
    checks = _expressible(checks, dims, used, used_derived)
    for d in used:
        if d != token_dim and meanings.meaning_of(d) is None:
            notes.append(f"dim `{d}` ({dims.free[d]}): meaning unknown, given 128")
    dim_meanings = {d: meanings.meaning_of(d) for d in used if d != token_dim}
    models = meanings.pick_models({m.key for m in dim_meanings.values() if m}, module.category)
    constraints, verdict = evidence.runtime_constraints(tree, module) if runtime else ([], "not looked up")
    models = gate_models(models, constraints, dim_meanings, notes)
    rel = os.path.relpath(source, tree.csrc_dir)  # `../../kda_kernels/csrc/...` for a kernel beside its loader
    spec = {
        "name": _safe(module.name), "module": module.name, "category": module.category,
        "description": f"TODO(review): what `{export_name}` computes. Drafted from {facts.qualified_name} "
                       f"({len(facts.tensors)} tensors, {len(facts.sizes)} symbolic sizes). Runtime: {verdict}"
                       + "".join(f"; {c['name']} {c['op']} {c['values']}" for c in constraints),
        "source": {"sglang_version": tree.version, "kernel_file": rel, "repo_path": tree.repo_path(source),
                   "sha256": sha256_file(source), "loader": f"{site.file}:{site.loader}"},
        "build": {"cuda_files": site.cuda_files, "cpp_files": site.cpp_files,
                  "extra_cuda_cflags": guess.extra_cuda_cflags, "extra_cflags": site.extra_cflags,
                  "extra_ldflags": site.extra_ldflags,
                  "wrappers": [{"export": export_name, "entry": entry}]},
        "entry": export_name, "signature": None,
        "dims": {d: _dim_doc(d, dims, token_dim) for d in used},
        "derived": _ordered({d: e for d, e in dims.derived.items() if d in used_derived}),
        "dtypes": (sweep_dtypes or ["bfloat16", "float16"]) if dtype_used else ["bfloat16"],
        "arguments": arguments,
        "shapes": {"token_dim": token_dim, "tokens": meanings.TOKENS, "models": [], "edge": []},
        "tolerance": {"bfloat16": {"atol": 1.0e-2, "rtol": 1.0e-2, "floor": 1.0e-2},
                      "float16": {"atol": 1.0e-3, "rtol": 1.0e-3, "floor": 1.0e-3},
                      "float32": {"atol": 1.0e-5, "rtol": 1.0e-5, "floor": 1.0e-5}},
        "bytes": _bytes(arguments),
    }
    fill_models(spec, models, dim_meanings, token_dim, notes, checks)
    if checks:
        spec["shapes"]["constraints"] = checks
    return spec, notes


def _uncount_guessed(arguments: list[dict], guessed: set[str], notes: list[str]) -> None:
    """`counted: false` on each tensor whose shape is still the fallback guess (astra.spec.draft_traffic:
    the floor counts only what is known), said in its note."""
    for a in arguments:
        if a["name"] in guessed and a.get("kind") == "tensor":
            a["counted"] = False
            notes.append(f"tensor `{a['name']}`: left out of `bytes` (counted: false): its shape is a guess, and "
                         "the floors count only known sizes")


def infer_error(name: str, why: str):
    from astra.errors import AstraError

    return AstraError(f"module {name}: cannot draft a spec: {why}")


def _safe(name: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.-]", "_", name)


def _dim_doc(d: str, dims: Dims, token_dim: str) -> str:
    if d == token_dim:
        return f"number of tokens (the sweep); from {dims.free.get(d, d)}"
    m = meanings.meaning_of(d)
    return f"{m.key if m else 'size'}; from {dims.free.get(d) or 'a fixed size'}"


def _used_dims(arguments: list[dict], dims: Dims, token_dim: str, entry: str) -> tuple[list[str], list[str]]:
    """(free dims, derived dims) that the arguments and the entry use (derived ones through each other)."""
    used: dict[str, None] = {token_dim: None}
    derived: dict[str, None] = {}

    def use(expr: str, depth: int = 0) -> None:
        for n in names_in(str(expr)):
            if n in dims.derived and depth < 16:
                if n not in derived:
                    derived.setdefault(n)
                    use(dims.derived[n], depth + 1)
            elif n in dims.free:
                used.setdefault(n)

    for hole in re.findall(r"\{([^{}]+)\}", entry):
        use(hole)
    for a in arguments:
        exprs = list(a.get("shape", [])) + [str(v) for v in (a.get("init") or {}).values()]
        if a["kind"] == "scalar" and isinstance(a.get("value"), str):
            exprs.append(a["value"])
        if a["kind"] == "tensor" and isinstance(a.get("present"), str):
            exprs.append(a["present"])
        for e in exprs:
            use(e)
    return [d for d in used if d in dims.free or d == token_dim], list(derived)


def _ordered(derived: dict[str, str]) -> dict[str, str]:
    """Derived dims in an order that defines each before it is used."""
    out: dict[str, str] = {}
    pending = dict(derived)
    while pending:
        ready = [d for d, e in pending.items() if not (names_in(e) & set(pending) - {d})]
        for d in ready or list(pending):
            out[d] = pending.pop(d)
    return out


def _host_relations(facts, binding, dims, shapes, arguments, token_dim, guessed: set[str]) -> Relations:
    """The entry's host checks read in the draft's terms (see host_relations)."""
    scalars: dict[str, object] = {}
    present: dict[str, bool] = {}
    for a in arguments:
        if a["kind"] == "tensor":
            present[a["name"]] = a.get("present", True) is not False
        elif a["kind"] == "scalar":
            value = a.get("value")
            if a["name"] in guessed and a.get("dtype", "").startswith("int") and value not in (0, None):
                value = scalar_placeholder(a["name"])
            scalars[a["name"]] = value
    optional = {a["name"]: present[a["name"]] for a in arguments if a["kind"] == "tensor" and "present" in a}
    chosen = presence.choose(facts, optional, lambda o: cond_env(facts, binding, dims, shapes, scalars, {**present, **o}))
    notes: list[str] = []
    for a in arguments:
        if chosen and a["name"] in chosen and chosen[a["name"]] != optional[a["name"]]:
            a["present"] = present[a["name"]] = chosen[a["name"]]
            notes.append(f"optional tensor `{a['name']}`: drafted as {'present' if a['present'] else 'None'}, "
                         "as the entry's has_value() checks require")
    env = cond_env(facts, binding, dims, shapes, scalars, present)
    rel = host_relations(facts, env, dims, token_dim, guessed)
    rel.notes[:0] = notes
    rel.present = {n: v for n, v in (chosen or {}).items() if v != optional[n]}
    return rel


def _expressible(constraints: list[str], dims, used: list[str], used_derived: list[str]) -> list[str]:
    """The constraints over dims the spec has (derived dims they need are added to `used_derived`)."""
    out = []
    for c in dict.fromkeys(constraints):
        names = names_in(c) - {"dtype"}
        closure, stack = set(), list(names)
        while stack:
            n = stack.pop()
            if n in closure:
                continue
            closure.add(n)
            if n in dims.derived:
                stack += list(names_in(dims.derived[n]))
        if all(n in used or n in dims.derived for n in closure) and all(n in used for n in closure
                                                                        if n not in dims.derived):
            out.append(c)
            used_derived += [n for n in closure if n in dims.derived and n not in used_derived]
    return out

