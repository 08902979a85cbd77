"""`astra extract NAME`: a spec draft for a person to review, and a snapshot of the exact sources.

The snapshot (the module's files and every SGLang header they include, with sha256) goes to the
cache, never to git. The draft is filled from the call site (files, flags, wrappers, template
arguments), libclang's view of the C++ entry (parameters, TensorMatcher shapes) and conventions;
every guess is marked `TODO(review)` in the draft and listed in the command's output.
"""

from __future__ import annotations

import json
import re
import shutil
from dataclasses import dataclass, field
from pathlib import Path

import yaml

from astra import paths
from astra.sglang import registry, variants
from astra.sglang.includes import include_closure
from astra.sglang.tree import SglangTree, sha256_file

_SCALARS = {"float": "float32", "double": "float64", "int": "int32", "int32_t": "int32", "int64_t": "int64",
            "uint32_t": "int64", "bool": "bool", "size_t": "int64"}


@dataclass
class ExtractResult:
    draft: Path
    snapshot: Path
    files: list[str]
    notes: list[str] = field(default_factory=list)


def snapshot(tree: SglangTree, name: str, files: list[Path]) -> Path:
    manifest = {tree.package_path(f): sha256_file(f) for f in files}
    digest = __import__("hashlib").sha256(json.dumps(manifest, sort_keys=True).encode()).hexdigest()[:12]
    target = paths.sub("snapshots") / name / f"{tree.version}-{digest}"
    if not (target / "manifest.json").exists():
        for f in files:
            dest = target / tree.package_path(f)
            dest.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(f, dest)
        (target / "manifest.json").write_text(json.dumps(
            {"sglang_version": tree.version, "origin": tree.origin, "files": manifest}, indent=1))
    return target


def extract(tree: SglangTree, name: str, out_dir: Path | None = None) -> ExtractResult:
    module = registry.find(tree, name)
    site = module.call_sites[0]
    sources = [registry.resolve_source(tree, f) for f in site.cuda_files + site.cpp_files]
    missing = [f for f, p in zip(site.cuda_files + site.cpp_files, sources) if p is None]
    if missing:
        from astra.errors import AstraError

        raise AstraError(f"module {name}: cannot find source(s) {missing} in {tree.describe()}")
    files = include_closure(tree, sources)
    snap = snapshot(tree, name, files)
    guess = variants.guess(site)
    notes = [f"template argument `{s}` = {guess.values[s]} was guessed" for s in guess.guessed]
    notes += [f"template argument `{s}` has no default; fill it in" for s in guess.unresolved]
    spec, more = draft_spec(tree, module, sources[0], guess)
    notes += more
    out = out_dir or paths.drafts_dir() / _safe(name)
    out.mkdir(parents=True, exist_ok=True)
    draft = out / ("kernel.yaml" if not (out / "kernel.yaml").exists() else "kernel.draft.yaml")
    header = "# Draft written by `astra extract`; review every TODO(review) before use.\n"
    header += "".join(f"# TODO(review): {n}\n" for n in notes)
    draft.write_text(header + yaml.safe_dump(spec, sort_keys=False, width=110))
    return ExtractResult(draft, snap, [tree.package_path(f) for f in files], notes)


def _safe(name: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.-]", "_", name)


def draft_spec(tree: SglangTree, module: registry.JitModule, kernel_path: Path,
               guess: variants.GuessedVariant) -> tuple[dict, list[str]]:
    site = module.call_sites[0]
    export, entry, _ = guess.wrappers[0] if guess.wrappers else (module.name, "", "cuda")
    params, shapes, notes = _entry_parameters(tree, kernel_path, entry)
    mutated = {a for c in site.callers for a in (c.mutates_args or [])}
    dims: dict[str, str] = {}
    arguments = []
    for pname, ptype in params:
        if "TensorView" in ptype or "Tensor" in ptype:
            shape = shapes.get(pname)
            if shape is None:
                shape = ["tokens", "width"]
                notes.append(f"argument `{pname}`: shape unknown (no TensorMatcher found); guessed [tokens, width]")
            shape = [_dim_name(s, pname, i) for i, s in enumerate(shape)]
            for s in shape:
                if re.fullmatch(r"[A-Za-z_]\w*", s):
                    dims.setdefault(s, "TODO(review): meaning")
            role = "inout" if pname in mutated else ("out" if re.match(r"(out|output|dst)\b|.*_out$", pname) else "in")
            arguments.append({"name": pname, "kind": "tensor", "shape": shape, "dtype": "{dtype}", "role": role,
                              "init": {"dist": "normal", "mean": 0.0, "std": 1.0}})
        else:
            scalar = _SCALARS.get(ptype.replace("const", "").strip(), "float32")
            value = 1.0e-6 if "eps" in pname else (1.0 if scalar.startswith("float") else 1)
            arguments.append({"name": pname, "kind": "scalar", "dtype": scalar, "value": value})
            notes.append(f"scalar `{pname}` ({ptype}) = {value}: check the value SGLang passes")
    dims.setdefault("tokens", "number of tokens")
    entry_tmpl = entry.replace("bf16_t", "{cpp_dtype(dtype)}")
    sha = sha256_file(kernel_path)
    rel = kernel_path.relative_to(tree.csrc_dir).as_posix() if kernel_path.is_relative_to(tree.csrc_dir) else str(kernel_path)
    tensor_bytes = [("2 * " if a["role"] == "inout" else "")
                    + f"({' * '.join(a['shape'])}) * elt({'dtype' if a['dtype'] == '{dtype}' else repr(a['dtype'])})"
                    for a in arguments if a["kind"] == "tensor"]
    if any(a["kind"] == "tensor" for a in arguments):
        notes.append("roles were inferred (in, unless SGLang's custom op mutates it or it is named like an "
                     "output): check which arguments the kernel writes")
    spec = {
        "name": _safe(module.name), "module": module.name, "category": module.category,
        "description": "TODO(review): what the kernel computes and its in-place contract.",
        "source": {"sglang_version": tree.version, "kernel_file": rel, "repo_path": tree.repo_path(kernel_path),
                   "sha256": sha, "loader": f"{site.file}:{site.loader}"},
        "build": {"cuda_files": site.cuda_files, "cpp_files": site.cpp_files,
                  "extra_cuda_cflags": guess.extra_cuda_cflags, "extra_cflags": site.extra_cflags,
                  "extra_ldflags": site.extra_ldflags,
                  "wrappers": [{"export": e, "entry": en.replace("bf16_t", "{cpp_dtype(dtype)}"), **({"lang": "cpp"} if l == "cpp" else {})}
                               for e, en, l in guess.wrappers]},
        "entry": export, "signature": None, "dims": dims, "dtypes": ["bfloat16"],
        "arguments": arguments,
        "shapes": {"tokens": [1, 8, 32, 128, 256, 1024, 4096, 16384],
                   "models": [{"model": "Llama-3.1-8B", "tp": 1,
                               "dims": {d: "hidden_size" for d in dims if d != "tokens"}}],
                   "edge": [{**{d: 128 for d in dims}, "tokens": t} for t in (1, 127, 1025)]},
        "tolerance": {"bfloat16": {"atol": 1.0e-2, "rtol": 1.0e-2, "floor": 1.0e-2}},
        "bytes": " + ".join(tensor_bytes) or "0",
    }
    if entry_tmpl != entry:
        notes.append("the dtype template argument became {cpp_dtype(dtype)}")
    return spec, notes


def _dim_name(dim: str, tensor: str, index: int) -> str:
    """A spec dim for one TensorMatcher dimension: token-like symbols become `tokens`, wildcards
    (-1) get a name of their own, literals stay numbers."""
    if dim in ("N", "M", "num_tokens", "B"):
        return "tokens"
    if re.fullmatch(r"\d+", dim):
        return dim
    if re.fullmatch(r"[A-Za-z_]\w*", dim):
        return dim
    return f"{tensor}_dim{index}"


def _entry_parameters(tree: SglangTree, kernel_path: Path, entry: str):
    """(params, tensor shapes by name, notes) of the C++ entry, read with libclang."""
    from astra.sglang import cuda_parse

    notes: list[str] = []
    cls, _, method = entry.rpartition("::")
    cls_name = re.sub(r"<.*", "", cls).split("::")[-1]
    parsed = cuda_parse.parse_source(kernel_path, [str(tree.include_dir), str(tree.csrc_dir)])
    if parsed.diagnostics:
        notes.append(f"libclang reported {len(parsed.diagnostics)} error(s): {parsed.diagnostics[0]}")
    method = re.sub(r"<.*", "", method)
    match = None
    for host in parsed.host_entries:
        host_class = (host.class_name or "").split("::")[-1]
        if host.name.split("::")[-1] == method and (host_class == cls_name or (not cls and not host_class)):
            match = host
            break
    if match is None:
        notes.append(f"no C++ entry `{entry}` found by libclang; arguments need to be written by hand")
        return [], {}, notes
    params = [(p.name, p.type) for p in match.params]
    shapes: dict[str, list] = {}
    for tc in parsed.tensor_constraints:
        if tc.verify and tc.function == match.qualified_name:
            shapes[tc.verify] = [str(d).strip().strip('"') for d in tc.dims]
    return params, shapes, notes
