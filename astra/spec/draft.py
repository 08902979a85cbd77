"""Assemble a spec draft for one JIT module from the evidence (see astra.spec.infer).

`draft_module(tree, module)` returns the spec as a dict plus review notes. The suite takes models by
what the dims mean (astra.spec.meanings) and by the runtime's gates on head sizes; cases whose
tensors would exceed `MAX_CASE_BYTES` are left out of the sweep.
"""

from __future__ import annotations

import re
from pathlib import Path

from astra.sglang import cxx_facts, registry, variants
from astra.sglang.tree import SglangTree, sha256_file
from astra.spec import evidence, infer, meanings
from astra.spec.expr import ExprError, evaluate

MAX_CASE_BYTES = 3 << 29  # 1.5 GiB of tensors per case
_EPS = re.compile(r"eps|epsilon", re.I)


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
    candidates = module_facts(tree, module)
    if export:
        candidates = [c for c in candidates if guess.wrappers[c[0]][0] == export] or candidates
    if not candidates or not candidates[0][1].found:
        why = candidates[0][1].notes[0] if candidates and candidates[0][1].notes else "no CUDA export"
        raise infer_error(module.name, why)
    index, facts = candidates[0]
    export_name = guess.wrappers[index][0]
    raw_entry = site.wrappers[index].entry
    entry, binding, dim_symbols, more = infer.bind_template(facts, raw_entry, site.template_args, guess.values)
    notes += more
    dims = infer._Dims()
    shapes = infer.dims_from_facts(facts, binding, dims)
    token_dim = infer.token_dim_of(shapes, dims)
    ev = evidence.wrapper_evidence(tree, site, export_name, [p for p, _ in facts.params])
    unshaped = [n for n in facts.tensors if n not in shapes]
    fallback = [token_dim or dims.add_free("tokens", "tokens"), dims.add_free("hidden", "hidden size")]
    for name in unshaped:
        like = ev.like(name) if ev else None
        if like in shapes:
            shapes[name] = list(shapes[like])
            notes.append(f"tensor `{name}`: shape of `{like}`, as the wrapper allocates it ({ev.where})")
            continue
        shapes[name] = list(fallback)
        if facts.tensors[name].optional:
            notes.append(f"optional tensor `{name}`: no check found; drafted as None (present: false)")
        else:
            notes.append(f"tensor `{name}`: no TensorMatcher check found; shape guessed as {fallback}")
    token_dim = token_dim or fallback[0]
    main_dtypes = _main_dtypes(ev)
    arguments, dtype_used = _arguments(facts, binding, shapes, token_dim, ev, notes,
                                       int_main=bool(main_dtypes) and not main_dtypes[0].startswith(("float", "bf")))
    used, used_derived = _used_dims(arguments, dims, token_dim, entry)
    for d in used:
        if d != token_dim and meanings.meaning_of(d) is None:
            notes.append(f"dim `{d}` ({dims.free[d]}): meaning unknown, given 128")
    dim_meanings = {d: meanings.meaning_of(d) for d in used if d != token_dim}
    models = meanings.pick_models({m.key for m in dim_meanings.values() if m}, module.category)
    constraints, verdict = evidence.runtime_constraints(tree, module) if runtime else ([], "not looked up")
    models = _gate_models(models, constraints, dim_meanings, notes)
    source = registry.resolve_source(tree, site.cuda_files[0])
    rel = source.relative_to(tree.csrc_dir).as_posix() if source.is_relative_to(tree.csrc_dir) else str(source)
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
        "derived": {d: e for d, e in dims.derived.items() if d in used_derived},
        "dtypes": (main_dtypes or ["bfloat16", "float16"]) if dtype_used else ["bfloat16"],
        "arguments": arguments,
        "shapes": {"token_dim": token_dim, "tokens": meanings.TOKENS, "models": [], "edge": []},
        "tolerance": {"bfloat16": {"atol": 1.0e-2, "rtol": 1.0e-2, "floor": 1.0e-2},
                      "float16": {"atol": 1.0e-3, "rtol": 1.0e-3, "floor": 1.0e-3},
                      "float32": {"atol": 1.0e-5, "rtol": 1.0e-5, "floor": 1.0e-5}},
        "bytes": _bytes(arguments),
    }
    _fill_models(spec, models, dim_meanings, token_dim, notes)
    return spec, notes


def infer_error(name: str, why: str):
    from astra.errors import AstraError

    return AstraError(f"module {name}: cannot draft a spec: {why}")


def _safe(name: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.-]", "_", name)


def _dim_doc(d: str, dims: "infer._Dims", token_dim: str) -> str:
    if d == token_dim:
        return f"number of tokens (the sweep); from {dims.free.get(d, d)}"
    m = meanings.meaning_of(d)
    return f"{m.key if m else 'size'}; from {dims.free.get(d) or 'a fixed size'}"


def _used_dims(arguments: list[dict], dims: "infer._Dims", token_dim: str, entry: str) -> tuple[list[str], list[str]]:
    """(free dims, derived dims) that the arguments and the entry use."""
    from astra.spec.expr import names_in

    used: dict[str, None] = {token_dim: None}
    derived: dict[str, None] = {}
    for hole in re.findall(r"\{([^{}]+)\}", entry):
        for n in names_in(hole):
            if n in dims.free:
                used.setdefault(n)
    for a in arguments:
        exprs = list(a.get("shape", [])) + [str(v) for v in (a.get("init") or {}).values()]
        if a["kind"] == "scalar" and isinstance(a.get("value"), str):
            exprs.append(a["value"])
        for e in exprs:
            for n in names_in(str(e)):
                if n in dims.derived:
                    derived.setdefault(n)
                    for m in names_in(dims.derived[n]):
                        used.setdefault(m)
                elif n in dims.free:
                    used.setdefault(n)
    return [d for d in used if d in dims.free or d == token_dim], list(derived)


def _main_dtypes(ev) -> list[str]:
    """The dtypes the case sweep takes: the wrapper's docstring list, else ints when the tensor that
    carries the dtype is an index or a length, else none (bf16 and fp16)."""
    if ev is None:
        return []
    if ev.dtypes():
        listed = ev.dtypes()
        return [d for d in listed if d in ("bfloat16", "float16", "float32")] or listed
    carrier = ev.dtype_tensor()
    if carrier and (infer._INDEX_NAMES.search(carrier) or infer._LEN_NAMES.search(carrier)):
        return ["int64", "int32"]
    return []


def _arguments(facts, binding, shapes, token_dim, ev, notes, int_main: bool = False) -> tuple[list[dict], bool]:
    arguments: list[dict] = []
    dtype_used = False
    tensor_shapes = [(n, shapes[n]) for n in facts.tensors]
    all_dims = {d for _, s in tensor_shapes for d in s}
    for name, ctype in facts.params:
        if name in facts.tensors:
            fact = facts.tensors[name]
            dtype, certain = infer._tensor_dtype(fact, binding)
            dtype_used |= dtype == "{dtype}"
            if not certain:
                notes.append(f"tensor `{name}`: dtype {dtype} taken from pointer casts or by default")
            others = [(n, s) for n, s in tensor_shapes if n != name]
            role = "out" if fact.mutable_cast and not fact.const_cast else "in"
            if ev and name in ev.mutated():
                role = "scratch" if re.search(r"workspace|scratch|tmp|buffer", name) else "inout"
            init_dtype = "int64" if int_main and dtype == "{dtype}" else dtype
            arg = {"name": name, "kind": "tensor", "shape": shapes[name], "dtype": dtype, "role": role,
                   "init": infer.tensor_init(name, init_dtype, shapes[name], others, token_dim)}
            if fact.optional:
                arg["present"] = bool(fact.shapes)
                if fact.shapes:
                    notes.append(f"tensor `{name}` is optional (None allowed); drafted as present")
            arguments.append(arg)
        else:
            index = [p for p, _ in facts.params].index(name)
            passed = ev.scalar(index, shapes) if ev else None
            arguments.append(_scalar(name, ctype, all_dims, passed, notes))
    return arguments, dtype_used


def _scalar(name: str, ctype: str, all_dims: set[str], default, notes: list[str]) -> dict:
    if re.search(r"string|String|char\s*\*", ctype):
        value = default if isinstance(default, str) else "silu"
        if not isinstance(default, str):
            notes.append(f"string `{name}` ({ctype}) = {value!r}: a guess; check the value SGLang passes")
        return {"name": name, "kind": "string", "value": value}
    if isinstance(default, str) and not re.fullmatch(r"[A-Za-z_][\w ()*+/-]*", default):
        default = None  # a string literal where a number is expected: not evidence
    dtype = infer.scalar_dtype(ctype)
    if isinstance(default, str) or (default is not None and not dtype.startswith("int")):
        value = bool(default) if dtype == "bool" else default
        return {"name": name, "kind": "scalar", "dtype": dtype, "value": value}
    ident = infer._ident(name)
    target = ident if ident in all_dims else None
    if target is None:
        m = meanings.meaning_of(name)
        target = next((d for d in all_dims if m and meanings.meaning_of(d) == m), None)
    if target is not None and dtype.startswith("int"):
        return {"name": name, "kind": "scalar", "dtype": dtype, "value": target}
    if default is not None:
        return {"name": name, "kind": "scalar", "dtype": dtype, "value": default}
    if dtype == "bool":
        value = False
    elif _EPS.search(name):
        value = 1.0e-6
    elif dtype.startswith("float"):
        value = 1.0
    else:
        value = 0 if re.search(r"pad|offset|start|layer|id$", name) else 1
    notes.append(f"scalar `{name}` ({ctype}) = {value}: a guess; check the value SGLang passes")
    return {"name": name, "kind": "scalar", "dtype": dtype, "value": value}


def _bytes(arguments: list[dict]) -> str:
    terms = []
    for a in arguments:
        if a["kind"] != "tensor":
            continue
        size = " * ".join(f"({s})" if not re.fullmatch(r"\w+", str(s)) else str(s) for s in a["shape"])
        elt = "elt(dtype)" if a["dtype"] == "{dtype}" else f"elt('{a['dtype']}')"
        terms.append(f"{'2 * ' if a['role'] == 'inout' else ''}{size} * {elt}")
    return " + ".join(terms) or "0"


def _gate_models(models, constraints: list[dict], dim_meanings: dict, notes: list[str]) -> list[tuple[str, int]]:
    """Keep the models whose dims satisfy the runtime's gates (e.g. `head_size not in (64, 128, 256,
    512)` sends only Phi-3's 96 here); when none of the usual ones does, look through every model."""
    from astra.spec.model import load_models

    if not constraints:
        return models
    all_models = load_models()

    def fits(model: str, tp: int) -> bool:
        fields = {**all_models[model], "tp": tp}
        for c in constraints:
            wanted = meanings.meaning_of(c["name"])
            for d, m in dim_meanings.items():
                if wanted is None or m is None or m.key != wanted.key:
                    continue
                value, _ = meanings.value_for(m, fields, tp)
                try:
                    value = int(evaluate(str(value), fields))
                except ExprError:
                    continue
                if not evidence.satisfies(value, c):
                    return False
        return True

    kept = [m for m in models if fits(*m)]
    if not kept:
        kept = [(m, 1) for m in all_models if fits(m, 1)][:3]
        if kept:
            notes.append(f"models chosen by the runtime's gates: {[m for m, _ in kept]}")
    return kept or models


def _fill_models(spec: dict, models, dim_meanings: dict, token_dim: str, notes: list[str]) -> None:
    from astra.spec.model import KernelSpec, load_models

    all_models = load_models()
    entries = []
    for model, tp in models:
        fields = all_models[model]
        entry_dims = {}
        for d, m in dim_meanings.items():
            value, _ = meanings.value_for(m, fields, tp)
            entry_dims[d] = value
        entries.append({"model": model, "tp": tp, "dims": entry_dims})
    spec["shapes"]["models"] = entries
    probe = KernelSpec(path=Path("draft.yaml"), raw=spec)
    for entry in entries:
        fields = {**all_models[entry["model"]], "tp": entry["tp"]}
        kept = []
        for tokens in meanings.TOKENS:
            try:
                names = {token_dim: tokens, **{k: evaluate(v, fields) if isinstance(v, str) else v
                                               for k, v in entry["dims"].items()}}
                names = probe.names_for(names, spec["dtypes"][0])
                total = sum(_numel(a["shape"], names) * 2 for a in spec["arguments"] if a["kind"] == "tensor")
            except (ExprError, KeyError, ZeroDivisionError):
                continue
            if 0 < total <= MAX_CASE_BYTES:
                kept.append(tokens)
        entry["tokens"] = kept
    dropped = [e["model"] for e in entries if not e["tokens"]]
    spec["shapes"]["models"] = [e for e in entries if e["tokens"]]
    if dropped:
        notes.append(f"models {dropped}: every token count is over {MAX_CASE_BYTES >> 20} MiB of tensors or invalid")
    if not spec["shapes"]["models"]:
        small = {d: 64 for d in spec["dims"] if d != token_dim}
        spec["shapes"]["edge"] = [{token_dim: t, **small} for t in (1, 16, 128)]
        notes.append("no model configuration fits: edge shapes with every dim 64 were used")


def _numel(shape: list, names: dict) -> int:
    n = 1
    for s in shape:
        n *= int(evaluate(str(s), names))
    return n
