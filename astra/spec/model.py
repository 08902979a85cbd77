"""The kernel spec (`extracted_kernels/<name>/kernel.yaml`): loading, validation with one message per
mistake, and expansion into concrete cases. Format: docs/spec-format.md."""

from __future__ import annotations

import itertools
import math
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
ROLES = ("in", "out", "inout", "scratch")
DISTS = {"normal": (), "uniform": (), "randint": ("high",), "perm": ("high",), "arange": (),
         "const": ("value",)}
MAX_CASES = 4096  # cases of one suite: (token counts per model entry + edge shapes) x dtypes


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
    present: bool | str = True  # an optional tensor: passed as None where this is false
    row_stride: int | str | None = None  # a strided view: the stride of dim 0 in elements
    unordered: bool = False  # an output whose order along the last dim is not part of the result
    counted: bool = True  # False: left out of the drafted `bytes` (astra extract: its shape is a guess)


@dataclass
class ShapeCase:
    """One concrete point of the suite, before dtype-specific rendering."""

    label: str  # "Llama-3.1-8B/tp1" or "edge"
    dims: dict[str, int]
    edge: bool = False

    def case_id(self, dtype: str) -> str:
        """The case's id (verdicts, `shapes.exclude`): "<label>/<dtype>/<dim>=<value>,..."."""
        return f"{self.label}/{dtype}/" + ",".join(f"{k}={v}" for k, v in self.dims.items())


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
    def excluded(self) -> dict[str, str]:
        """Case id -> reason, from `shapes.exclude` (cases the GPU probe found the kernel refuses)."""
        return {e["case"]: e["reason"] for e in self.raw["shapes"].get("exclude") or []}

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

    @property
    def flags(self) -> tuple[str, ...]:
        """The dims that are 0/1 switches (`flags:`); every other dim is > 0."""
        return tuple(self.raw.get("flags") or ())

    def shape_cases(self) -> list[ShapeCase]:
        """Model entries × token sweep, then edge shapes; duplicates removed, order kept."""
        shapes = self.raw["shapes"]
        token_dim = shapes.get("token_dim", "tokens")
        models = load_models()
        flags = self.flags
        out: list[ShapeCase] = []
        seen: set[tuple] = set()
        for entry in shapes.get("models") or []:
            fields = dict(models[entry["model"]])
            fields["tp"] = entry.get("tp", 1)
            base = {k: _dim(evaluate(v, fields), f"shapes.models {entry['model']} dims.{k} = {v!r}", k in flags)
                    for k, v in (entry.get("dims") or {}).items()}
            label = f"{entry['model']}/tp{fields['tp']}"
            for tokens in entry.get("tokens") or shapes.get("tokens") or [1]:
                dims = {token_dim: _dim(tokens, "shapes.tokens"), **base}
                key = tuple(sorted(dims.items()))
                if key not in seen:
                    seen.add(key)
                    out.append(ShapeCase(label, dims))
        for dims in shapes.get("edge") or []:
            dims = {k: _dim(v, f"shapes.edge {k}", k in flags) for k, v in dims.items()}
            key = tuple(sorted(dims.items()))
            if key not in seen:
                seen.add(key)
                out.append(ShapeCase("edge", dims, edge=True))
        return out

    def token_count(self, dims: dict) -> int:
        return int(dims.get(self.raw["shapes"].get("token_dim", "tokens"), 1))


def _dim(value, where: str, flag: bool = False) -> int:
    """A dimension's value: a positive integer, or 0 or 1 for a flag (an integral float is accepted), else
    an ExprError."""
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    if isinstance(value, bool) or not isinstance(value, int):
        raise ExprError(f"{where}: {value!r} is not an integer")
    if flag and value not in (0, 1):
        raise ExprError(f"{where}: {value} is not 0 or 1 (the dim is listed in `flags`)")
    if value <= 0 and not flag:
        raise ExprError(f"{where}: {value} is not positive (dims are > 0; a 0/1 switch is listed in `flags`)")
    return value


def arg_present(arg: Argument, names: dict) -> bool:
    """Whether a tensor argument is passed in a case (`present`: a bool or an expression; default true)."""
    value = arg.present if isinstance(arg.present, bool) else evaluate(arg.present, names)
    if not isinstance(value, bool):
        raise ExprError(f"{arg.name}: present {arg.present!r} gives {value!r}, not true or false "
                        "(write a condition over dims, e.g. `num_experts > 1`)")
    return value


def arg_row_stride(arg: Argument, shape: list[int], names: dict) -> int | None:
    """The stride of dim 0 of a strided view in a case (None: contiguous); at least one row's elements."""
    if arg.row_stride is None:
        return None
    value = _dim(evaluate(arg.row_stride, names), f"{arg.name}: row_stride {arg.row_stride!r}")
    row = math.prod(shape[1:])
    if value < row:
        raise ExprError(f"{arg.name}: row_stride {arg.row_stride!r} is {value}, below the {row} elements of one "
                        f"row ({' x '.join(map(str, shape[1:]))}); it is the stride of dim 0: at least the product "
                        f"of the other dims")
    return value


def resolve_path(name_or_path: str | Path) -> Path:
    """The kernel.yaml of a spec name (extracted_kernels/<name>) or the path itself."""
    path = Path(name_or_path)
    return path if path.suffix in (".yaml", ".yml") else spec_path(str(name_or_path))


def spec_path(name: str) -> Path:
    return paths.specs_dir() / name / "kernel.yaml"


def available() -> list[str]:
    root = paths.specs_dir()
    return sorted(p.parent.name for p in root.glob("*/kernel.yaml"))


def load(name_or_path: str | Path) -> KernelSpec:
    """Load and validate a spec by name (extracted_kernels/<name>) or by path."""
    path = resolve_path(name_or_path)
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
    problems += checks.check_source(raw["source"])
    problems += checks.check_build(raw["build"])
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
    token_dim = raw["shapes"].get("token_dim", "tokens") if isinstance(raw["shapes"], dict) else "tokens"
    flag_problems = checks.check_flags(raw.get("flags"), list(dims), token_dim)
    problems += flag_problems
    flags = () if flag_problems else tuple(raw.get("flags") or ())
    shape_problems = checks.check_shapes(raw["shapes"], list(dims), flags)
    problems += shape_problems
    if not shape_problems:
        problems += _check_suite_size(raw["shapes"], len(dtypes))
    for dt in dtypes:
        if dt not in DTYPE_BYTES:
            problems.append(f"dtypes: unknown dtype {dt!r} (known: {', '.join(DTYPE_BYTES)})")
    problems += [f"dtypes: {dt} is listed twice (each dtype is checked once; the first is the timed one)"
                 for dt in sorted({d for d in dtypes if dtypes.count(d) > 1})]
    problems += _check_arguments(raw["arguments"], raw)
    problems += checks.check_byte_split(raw, set(dims) | set(raw.get("derived") or {}) | {"dtype"})
    if not isinstance(raw["entry"], str):
        problems.append("`entry` must be the name of the export the harness calls")
    exports = [w.get("export") for w in raw["build"].get("wrappers", []) if isinstance(w, dict)]
    if raw["build"].get("header_only", True) and raw["entry"] not in exports:
        problems.append(f"`entry: {raw['entry']}` is not among build.wrappers exports {exports}")
    problems += checks.check_tolerance(raw["tolerance"], dtypes)
    if raw.get("reference") is not None and not isinstance(raw["reference"], str):
        problems.append("`reference` must be a file name beside kernel.yaml, e.g. reference.py")
    elif raw.get("reference") and not (path.parent / raw["reference"]).is_file():
        problems.append(f"`reference: {raw['reference']}` names a file that does not exist beside kernel.yaml")
    if problems:
        return problems
    return _check_cases(KernelSpec(path=path, raw=raw))


def _check_suite_size(shapes: dict, dtype_count: int) -> list[str]:
    """At most MAX_CASES cases, counted before the suite is expanded (duplicates included)."""
    sweep = shapes.get("tokens") or [1]
    points = sum(len(entry.get("tokens") or sweep) for entry in shapes.get("models") or [])
    points += len(shapes.get("edge") or [])
    if points * dtype_count <= MAX_CASES:
        return []
    return [f"shapes: {points:,} shapes x {dtype_count} dtype(s) = {points * dtype_count:,} cases; a suite is at "
            f"most {MAX_CASES:,} cases (fewer token counts, models or edge shapes)"]


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
        out += checks.check_tensor_options(a, where, known)
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
    if target.get("role") == "scratch":
        return [f"{where}: alias {arg['alias']!r} names a scratch tensor (never compared); alias an in/inout tensor"]
    if arg.get("kind") != "tensor" or arg.get("role") not in ("out", "inout"):
        return [f"{where}: only an out/inout tensor can alias another argument"]
    if arg.get("shape") != target.get("shape") or arg.get("dtype", "{dtype}") != target.get("dtype", "{dtype}"):
        return [f"{where}: an alias must have the shape and dtype of {arg['alias']!r}"]
    return []


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
            total = evaluate(spec.raw["bytes"], names)
            if (isinstance(total, bool) or not isinstance(total, (int, float)) or not total > 0) \
                    and "bytes" not in failed:  # one mistake, named at its first shape
                failed.add("bytes")
                out.append(f"shape {case.label} {case.dims} ({dtype}): bytes {spec.raw['bytes']!r} gives {total!r}; "
                           "the bytes the kernel must move are a positive number (they set the floors)")
            split = checks.byte_split_problem(spec.raw, names)
            if split and "bytes split" not in failed:  # one mistake, named at its first shape
                failed.add("bytes split")
                out.append(f"shape {case.label} {case.dims} ({dtype}): {split}")
            for w in spec.raw["build"].get("wrappers", []):
                render(w["entry"], names)
            for a in spec.arguments:
                if a.kind == "tensor" and arg_present(a, names):
                    arg_row_stride(a, [evaluate(e, names) for e in a.shape], names)
        except ExprError as err:
            if str(err) not in failed:  # the same broken expression is one mistake, named at its first shape
                failed.add(str(err))
                out.append(f"shape {case.label} {case.dims} ({dtype}): {err}")
        out = list(dict.fromkeys(out))  # the same mistake seen for another dtype is one mistake
        if len(out) > 20:
            out.append("... (more problems of the same kind not shown)")
            break
    return out + _check_exclusions(spec, cases)


def _check_exclusions(spec: KernelSpec, cases: list[ShapeCase]) -> list[str]:
    """Every `shapes.exclude` entry names a case of the suite, and some case is left."""
    ids = {case.case_id(dtype) for case in cases for dtype in spec.dtypes}
    excluded = spec.excluded
    out = [f"shapes.exclude: no case has id {case_id!r} (did the shapes change?); remove the entry or fix the id "
           f"(<label>/<dtype>/<dim>=<value>,... as verdicts name cases, e.g. {min(ids)!r})"
           for case_id in excluded if case_id not in ids]
    if ids and ids <= set(excluded):
        out.append("shapes.exclude leaves no case to check; remove entries or add shapes")
    return out
