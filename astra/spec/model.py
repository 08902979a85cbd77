"""The kernel spec (`extracted_kernels/<name>/kernel.yaml`): loading, validation with one message per
mistake, and expansion into concrete cases. Format: docs/spec-format.md."""

from __future__ import annotations

import itertools
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path

import yaml

from astra import paths
from astra.errors import SpecError, UnknownKernel
from astra.spec import checks
from astra.spec.expr import DTYPE_BYTES, ExprError, evaluate, names_in, render

REQUIRED = ("name", "module", "source", "build", "entry", "dims", "dtypes", "arguments", "shapes",
            "tolerance", "bytes")
KINDS = ("tensor", "scalar", "string")
ROLES = ("in", "out", "inout")
DISTS = {"normal": (), "uniform": (), "randint": ("high",), "perm": ("high",), "arange": (),
         "const": ("value",)}


@dataclass
class Argument:
    name: str
    kind: str
    role: str = "in"
    shape: list = field(default_factory=list)
    dtype: str = "{dtype}"
    init: dict = field(default_factory=lambda: {"dist": "normal", "mean": 0.0, "std": 1.0})
    value: object = None
    alias: str | None = None  # an in-place call: this output is the tensor of an earlier argument
    doc: str | None = None


@dataclass
class ShapeCase:
    """One concrete point of the suite, before dtype-specific rendering."""

    label: str  # "Llama-3.1-8B/tp1" or "edge"
    dims: dict[str, int]
    edge: bool = False


@dataclass
class KernelSpec:
    path: Path
    raw: dict

    @property
    def name(self) -> str:
        return self.raw["name"]

    @property
    def dir(self) -> Path:
        return self.path.parent

    @property
    def module(self) -> str:
        return self.raw["module"]

    @property
    def entry(self) -> str:
        return self.raw["entry"]

    @property
    def dtypes(self) -> list[str]:
        return list(self.raw["dtypes"])

    @property
    def kernel_file(self) -> str:
        return self.raw["source"]["kernel_file"]

    @property
    def arguments(self) -> list[Argument]:
        return [Argument(**a) for a in self.raw["arguments"]]

    @property
    def reference_path(self) -> Path | None:
        ref = self.raw.get("reference")
        return (self.dir / ref) if ref else None

    def names_for(self, dims: dict, dtype: str) -> dict:
        names = dict(dims)
        names["dtype"] = dtype
        for key, expr in (self.raw.get("derived") or {}).items():
            names[key] = evaluate(expr, names)
        return names

    def shape_cases(self) -> list[ShapeCase]:
        """Model entries × token sweep, then edge shapes; duplicates removed, order kept."""
        shapes = self.raw["shapes"]
        token_dim = shapes.get("token_dim", "tokens")
        models = load_models()
        out: list[ShapeCase] = []
        seen: set[tuple] = set()
        for entry in shapes.get("models") or []:
            fields = dict(models[entry["model"]])
            fields["tp"] = entry.get("tp", 1)
            base = {k: _dim(evaluate(v, fields), f"shapes.models {entry['model']} dims.{k} = {v!r}")
                    for k, v in (entry.get("dims") or {}).items()}
            label = f"{entry['model']}/tp{fields['tp']}"
            for tokens in entry.get("tokens") or shapes.get("tokens") or [1]:
                dims = {token_dim: _dim(tokens, "shapes.tokens"), **base}
                key = tuple(sorted(dims.items()))
                if key not in seen:
                    seen.add(key)
                    out.append(ShapeCase(label, dims))
        for dims in shapes.get("edge") or []:
            dims = {k: _dim(v, f"shapes.edge {k}") for k, v in dims.items()}
            key = tuple(sorted(dims.items()))
            if key not in seen:
                seen.add(key)
                out.append(ShapeCase("edge", dims, edge=True))
        return out

    def token_count(self, dims: dict) -> int:
        return int(dims.get(self.raw["shapes"].get("token_dim", "tokens"), 1))


def _dim(value, where: str) -> int:
    """A dimension's value: a positive integer (an integral float is accepted), else an ExprError."""
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    if isinstance(value, bool) or not isinstance(value, int):
        raise ExprError(f"{where}: {value!r} is not an integer")
    if value <= 0:
        raise ExprError(f"{where}: {value} is not positive (dims are > 0)")
    return value


def spec_path(name: str) -> Path:
    return paths.specs_dir() / name / "kernel.yaml"


def available() -> list[str]:
    root = paths.specs_dir()
    return sorted(p.parent.name for p in root.glob("*/kernel.yaml"))


def load(name_or_path: str | Path) -> KernelSpec:
    """Load and validate a spec by name (extracted_kernels/<name>) or by path."""
    path = Path(name_or_path)
    if path.suffix not in (".yaml", ".yml"):
        path = spec_path(str(name_or_path))
    if not path.exists():
        have = ", ".join(available()) or "none"
        raise UnknownKernel(
            f"no kernel spec {str(name_or_path)!r} (looked for {path}); specs: {have}. "
            "Write a draft with `astra extract NAME`."
        )
    raw, why = checks.read_yaml(path)
    if why:
        raise SpecError(str(path), [why])
    try:
        problems = validate(raw, path)
    except (TypeError, AttributeError, KeyError, ValueError, IndexError) as err:  # a shape validate missed
        problems = [f"the spec does not have the structure docs/spec-format.md describes "
                    f"({type(err).__name__}: {str(err)[:120]})"]
    if problems:
        raise SpecError(str(path), problems)
    return KernelSpec(path=path, raw=raw)


@lru_cache(maxsize=1)
def load_models() -> dict:
    return yaml.safe_load((paths.DATA_DIR / "models.yaml").read_text())


def validate(raw, path: Path) -> list[str]:
    """Every mistake in the spec, one message each (empty list: valid)."""
    if not isinstance(raw, dict):
        return [f"the file must hold a mapping of fields (see docs/spec-format.md), not {type(raw).__name__}"]
    problems = checks.unknown_keys(raw, checks.TOP, "top level")
    problems += [f"missing field `{key}`" for key in REQUIRED if key not in raw]
    if problems:
        return problems
    if raw["name"] != path.parent.name:
        problems.append(f"`name: {raw['name']}` must equal the directory name `{path.parent.name}`")
    problems += _check_source(raw["source"])
    problems += _check_build(raw["build"])
    if not isinstance(raw["source"], dict) or not isinstance(raw["build"], dict):
        return problems
    dims = raw["dims"]
    if not isinstance(dims, dict) or not dims or not all(isinstance(d, str) for d in dims):
        problems.append("`dims` must map each dimension name to a one-line meaning")
        return problems
    if raw.get("derived") is not None and not (isinstance(raw["derived"], dict)
                                               and all(isinstance(k, str) for k in raw["derived"])):
        problems.append("`derived` must map names to expressions over dims")
        return problems
    dtypes = raw["dtypes"]
    if not isinstance(dtypes, list) or not dtypes or not all(isinstance(d, str) for d in dtypes):
        problems.append("`dtypes` must be a non-empty list of dtype names (the first is the timed dtype)")
        return problems
    shape_problems = checks.check_shapes(raw["shapes"], list(dims))
    problems += shape_problems
    for dt in dtypes:
        if dt not in DTYPE_BYTES:
            problems.append(f"dtypes: unknown dtype {dt!r} (known: {', '.join(DTYPE_BYTES)})")
    problems += _check_arguments(raw["arguments"], raw)
    if not isinstance(raw["entry"], str):
        problems.append("`entry` must be the name of the export the harness calls")
    exports = [w.get("export") for w in raw["build"].get("wrappers", []) if isinstance(w, dict)]
    if raw["build"].get("header_only", True) and raw["entry"] not in exports:
        problems.append(f"`entry: {raw['entry']}` is not among build.wrappers exports {exports}")
    problems += _check_tolerance(raw["tolerance"], dtypes)
    if raw.get("reference") is not None and not isinstance(raw["reference"], str):
        problems.append("`reference` must be a file name beside kernel.yaml, e.g. reference.py")
    elif raw.get("reference") and not (path.parent / raw["reference"]).is_file():
        problems.append(f"`reference: {raw['reference']}` names a file that does not exist beside kernel.yaml")
    if problems:
        return problems
    return _check_cases(KernelSpec(path=path, raw=raw))


def _check_source(source) -> list[str]:
    if not isinstance(source, dict):
        return ["`source` must be a mapping (sglang_version, kernel_file, repo_path, sha256)"]
    out = checks.unknown_keys(source, checks.SOURCE, "source")
    out += [f"source: missing `{k}`" for k in ("sglang_version", "kernel_file", "repo_path", "sha256")
           if k not in source]
    sha = str(source.get("sha256", ""))
    if "sha256" in source and (len(sha) != 64 or any(c not in "0123456789abcdef" for c in sha)):
        out.append("source.sha256 must be 64 lowercase hex characters")
    return out


def _check_build(build) -> list[str]:
    if not isinstance(build, dict):
        return ["`build` must be a mapping (cuda_files, wrappers, flags)"]
    out = checks.unknown_keys(build, checks.BUILD, "build")
    if not build.get("cuda_files") and not build.get("cpp_files"):
        out.append("build: list the sources in `cuda_files` (or `cpp_files`), as SGLang's call site does")
    for key in ("cuda_files", "cpp_files", "extra_cuda_cflags", "extra_cflags", "extra_ldflags"):
        if key in build and not isinstance(build[key], list):
            out.append(f"build.{key} must be a list")
    wrappers = build.get("wrappers", [])
    if build.get("header_only", True) and not wrappers:
        out.append("build.wrappers: a header-only module needs at least one {export, entry}")
    for i, w in enumerate(wrappers if isinstance(wrappers, list) else []):
        if not isinstance(w, dict) or not isinstance(w.get("export"), str) or not isinstance(w.get("entry"), str):
            out.append(f"build.wrappers[{i}] must have `export` and `entry`")
        else:
            out += checks.unknown_keys(w, checks.WRAPPER, f"build.wrappers[{i}]")
    return out


def _check_arguments(args, raw) -> list[str]:
    if not isinstance(args, list) or not args:
        return ["`arguments` must be a non-empty list, in call order"]
    out, names = [], set()
    known = set(raw["dims"]) | set((raw.get("derived") or {})) | {"dtype"}
    for i, a in enumerate(args):
        where = f"arguments[{i}]" + (f" ({a.get('name')})" if isinstance(a, dict) and a.get("name") else "")
        if not isinstance(a, dict) or not isinstance(a.get("name"), str):
            out.append(f"{where}: needs a `name`")
            continue
        if a["name"] in names:
            out.append(f"{where}: duplicate argument name")
        names.add(a["name"])
        out += checks.unknown_keys(a, checks.ARGUMENT, where)
        kind = a.get("kind")
        if kind not in KINDS:
            out.append(f"{where}: kind must be one of {KINDS}, not {kind!r}")
            continue
        if a.get("role", "in") not in ROLES:
            out.append(f"{where}: role must be one of {ROLES}, not {a.get('role')!r}")
        if a.get("alias") is not None:
            out += _check_alias(a, args[:i], where)
        if kind == "tensor":
            if not isinstance(a.get("shape"), list) or not a["shape"]:
                out.append(f"{where}: a tensor needs `shape`, a list of expressions over dims")
            else:
                for e in a["shape"]:
                    missing = names_in(str(e)) - known
                    if missing:
                        out.append(f"{where}: shape entry {e!r} uses unknown name(s) {sorted(missing)}")
            init = a.get("init", {"dist": "normal"})
            dist = init.get("dist") if isinstance(init, dict) else None
            out += checks.unknown_keys(init, checks.INIT, f"{where}.init")
            if not isinstance(dist, str) or dist not in DISTS:
                out.append(f"{where}: init.dist must be one of {sorted(DISTS)}, not {dist!r}")
            else:
                for req in DISTS[dist]:
                    if req not in init:
                        out.append(f"{where}: init `{dist}` needs `{req}`")
        elif a.get("role", "in") != "in":
            out.append(f"{where}: a {kind} argument can only be an input (role: in)")
        elif "value" not in a:
            out.append(f"{where}: a {kind} argument needs `value`")
    return out


def _check_alias(arg: dict, earlier: list, where: str) -> list[str]:
    """`alias: NAME`: an out/inout tensor that is the same tensor as an earlier tensor argument."""
    target = next((e for e in earlier if isinstance(e, dict) and e.get("name") == arg["alias"]), None)
    if target is None or target.get("kind") != "tensor":
        return [f"{where}: alias {arg['alias']!r} must name an earlier tensor argument"]
    if arg.get("kind") != "tensor" or arg.get("role") not in ("out", "inout"):
        return [f"{where}: only an out/inout tensor can alias another argument"]
    if arg.get("shape") != target.get("shape") or arg.get("dtype", "{dtype}") != target.get("dtype", "{dtype}"):
        return [f"{where}: an alias must have the shape and dtype of {arg['alias']!r}"]
    return []


def _check_tolerance(tol, dtypes) -> list[str]:
    if not isinstance(tol, dict):
        return ["`tolerance` must map each dtype to {atol, rtol, floor}"]
    out = checks.unknown_keys(tol, tuple(DTYPE_BYTES), "tolerance")
    for dt in dtypes:
        entry = tol.get(dt)
        if not isinstance(entry, dict):
            out.append(f"tolerance: no entry for dtype {dt}")
            continue
        out += checks.unknown_keys(entry, checks.TOLERANCE, f"tolerance.{dt}")
        for k in ("atol", "rtol", "floor"):
            if not isinstance(entry.get(k), (int, float)) or entry[k] < 0:
                out.append(f"tolerance.{dt}.{k} must be a non-negative number")
    return out


def _check_cases(spec: KernelSpec) -> list[str]:
    """Expand the suite once: every expression must evaluate and every constraint must hold."""
    out: list[str] = []
    try:
        cases = spec.shape_cases()
    except KeyError as err:
        return [f"shapes.models: unknown model {err} (known: {', '.join(load_models())})"]
    except ExprError as err:
        return [f"shapes: {err}"]
    if not cases:
        return ["shapes: no cases (give `models` with `tokens`, or `edge`)"]
    constraints = spec.raw["shapes"].get("constraints") or []
    failed: set[str] = set()
    for case, dtype in itertools.product(cases, spec.dtypes):
        dims_missing = set(spec.raw["dims"]) - set(case.dims)
        if dims_missing:
            out.append(f"shape {case.label} {case.dims}: no value for dim(s) {sorted(dims_missing)}")
            continue
        try:
            names = spec.names_for(case.dims, dtype)
            for c in constraints:
                if not evaluate(c, names):
                    out.append(f"shape {case.label} {case.dims}: violates constraint `{c}`")
            evaluate(spec.raw["bytes"], names)
            for w in spec.raw["build"].get("wrappers", []):
                render(w["entry"], names)
            for a in spec.arguments:
                if a.kind == "tensor":
                    [evaluate(e, names) for e in a.shape]
        except ExprError as err:
            if str(err) not in failed:  # the same broken expression is one mistake, named at its first shape
                failed.add(str(err))
                out.append(f"shape {case.label} {case.dims} ({dtype}): {err}")
        out = list(dict.fromkeys(out))  # the same mistake seen for another dtype is one mistake
        if len(out) > 20:
            out.append("... (more problems of the same kind not shown)")
            break
    return out
