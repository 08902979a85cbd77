"""What a kernel spec file may hold before validation looks at its meaning: a bounded size, YAML
without anchors or aliases (no "billion laughs"), and only the keys the format defines, each unknown
one answered with the nearest known key (`referense` must not silently turn the reference off); the
structure of `source`, `build`, `tolerance`, `shapes` and of an argument's optional fields; and the
`TODO(review)` markers a draft still holds."""

from __future__ import annotations

import difflib
import math
from pathlib import Path

from astra import input_files
from astra.spec.expr import DTYPE_BYTES, evaluate, names_in

MAX_BYTES = input_files.SPEC_BYTES  # 1 MiB: the largest committed spec is a few KiB

TOP = ("name", "module", "category", "description", "source", "build", "entry", "signature", "dims", "flags",
       "derived", "dtypes", "arguments", "shapes", "tolerance", "bytes", "bytes_read", "bytes_written", "reference")
SOURCE = ("sglang_version", "kernel_file", "repo_path", "sha256", "loader")
BUILD = ("cuda_files", "cpp_files", "extra_cuda_cflags", "extra_cflags", "extra_ldflags", "extra_include_paths",
         "extra_dependencies", "wrappers", "header_only")
WRAPPER = ("export", "entry", "lang")
SHAPES = ("tokens", "token_dim", "models", "edge", "constraints", "exclude")
MODEL_ENTRY = ("model", "tp", "dims", "tokens")
ARGUMENT = ("name", "kind", "role", "shape", "dtype", "init", "value", "doc", "alias", "present", "row_stride",
            "unordered", "counted")
INIT = ("dist", "mean", "std", "low", "high", "start", "step", "value", "large", "small")
TOLERANCE = ("atol", "rtol", "floor")
EXCLUDE = ("case", "reason")
REVIEW_MARKER = "TODO(review)"
EXACT_DTYPES = ("int64", "int32", "int16", "int8", "uint8", "bool")  # compared exactly: no tolerance


def read_yaml(path: Path) -> tuple[object, str | None]:
    """(the parsed document, None) or (None, why it cannot be read): a regular file of at most MAX_BYTES,
    strict YAML (no anchors or aliases, no key twice, bounded nesting; astra.input_files)."""
    try:
        return input_files.read_yaml(path, MAX_BYTES, what="a kernel spec"), None
    except input_files.Refused as err:
        return None, err.why


def unknown_keys(mapping: object, known: tuple[str, ...], where: str) -> list[str]:
    """One message per key of `mapping` that the format does not define, with a suggestion."""
    if not isinstance(mapping, dict):
        return []
    out = []
    for key in mapping:
        if key in known:
            continue
        close = difflib.get_close_matches(str(key), known, n=1)
        hint = f"; did you mean `{close[0]}`?" if close else f" (known: {', '.join(known)})"
        out.append(f"{where}: unknown key `{key}`{hint}")
    return out


def positive_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value > 0


def flag_value(value: object) -> bool:
    """A flag dim's value: 0 or 1 (a switch such as `neox`)."""
    return isinstance(value, int) and not isinstance(value, bool) and value in (0, 1)


def check_flags(flags: object, dim_names: list[str], token_dim: str) -> list[str]:
    """`flags:` lists the dims that are 0/1 switches; each names a dim once, and the token dim is none."""
    if flags is None:
        return []
    if not isinstance(flags, list) or not all(isinstance(f, str) for f in flags):
        return [f"`flags` must be a list of dim names (the dims that are 0/1 switches), not {flags!r}"[:200]]
    out = [f"flags: {f!r} is not one of the dims ({', '.join(dim_names)})" for f in flags if f not in dim_names]
    out += [f"flags: {f!r} is listed twice" for f in sorted({f for f in flags if flags.count(f) > 1})]
    if token_dim in flags:
        out.append(f"flags: {token_dim!r} is the token dim (the sweep sets it); a flag is a 0/1 switch")
    return out


def _positive_ints(values: object, where: str) -> list[str]:
    if not isinstance(values, list) or not values:
        return [f"{where} must be a non-empty list of positive integers"]
    bad = [v for v in values if not positive_int(v)]
    return [f"{where}: {bad[0]!r} is not a positive integer (token counts and dims are > 0)"] if bad else []


def check_shapes(shapes: object, dim_names: list[str], flags: tuple[str, ...] = ()) -> list[str]:
    """The structure of `shapes:` (its values are checked when the suite is expanded); `flags` are the dims
    that take 0 or 1."""
    if not isinstance(shapes, dict):
        return [f"`shapes` must be a mapping ({', '.join(SHAPES)}), not {type(shapes).__name__}"]
    out = unknown_keys(shapes, SHAPES, "shapes")
    if "tokens" in shapes:
        out += _positive_ints(shapes["tokens"], "shapes.tokens")
    if "token_dim" in shapes and shapes["token_dim"] not in dim_names:
        out.append(f"shapes.token_dim {shapes['token_dim']!r} is not one of the dims ({', '.join(dim_names)})")
    models = shapes.get("models")
    if models is not None and not isinstance(models, list):
        out.append("shapes.models must be a list of {model, tp, dims} entries")
    for i, entry in enumerate(models if isinstance(models, list) else []):
        where = f"shapes.models[{i}]"
        if not isinstance(entry, dict) or not isinstance(entry.get("model"), str):
            out.append(f"{where} must be a mapping with `model` (a name from astra/data/models.yaml), "
                       f"not {entry!r}"[:200])
            continue
        out += unknown_keys(entry, MODEL_ENTRY, where)
        if "tp" in entry and not positive_int(entry["tp"]):
            out.append(f"{where}.tp must be a positive integer, not {entry['tp']!r}")
        if "tokens" in entry:
            out += _positive_ints(entry["tokens"], f"{where}.tokens")
        if "dims" in entry and not isinstance(entry["dims"], dict):
            out.append(f"{where}.dims must map dim names to expressions over the model's fields")
    edge = shapes.get("edge")
    if edge is not None and not isinstance(edge, list):
        out.append("shapes.edge must be a list of {dim: value} mappings")
    for i, dims in enumerate(edge if isinstance(edge, list) else []):
        if not isinstance(dims, dict):
            out.append(f"shapes.edge[{i}] must map every dim to a positive integer, not {dims!r}"[:200])
            continue
        out += unknown_keys(dims, tuple(dim_names), f"shapes.edge[{i}]")
        out += [f"shapes.edge[{i}].{k}: {v!r} is not " + ("0 or 1 (a flag)" if k in flags else "a positive integer")
                for k, v in dims.items() if not (flag_value(v) if k in flags else positive_int(v))]
    constraints = shapes.get("constraints")
    if constraints is not None and (not isinstance(constraints, list)
                                    or not all(isinstance(c, str) for c in constraints)):
        out.append("shapes.constraints must be a list of expression strings")
    return out + _check_exclude(shapes.get("exclude"))


def _check_exclude(exclude: object) -> list[str]:
    """`shapes.exclude`: [{case: "<case id>", reason: "<why>"}], as the GPU probe writes it."""
    if exclude is None:
        return []
    if not isinstance(exclude, list):
        return ['shapes.exclude must be a list of {case: "<case id>", reason: "<why>"} entries']
    out, seen = [], set()
    for i, entry in enumerate(exclude):
        where = f"shapes.exclude[{i}]"
        if not isinstance(entry, dict):
            out.append(f'{where} must be a mapping {{case: "<case id>", reason: "<why>"}}, not {entry!r}'[:200])
            continue
        out += unknown_keys(entry, EXCLUDE, where)
        for key in EXCLUDE:
            if not isinstance(entry.get(key), str) or not entry[key].strip():
                out.append(f"{where}.{key} must be a non-empty string"
                           + (" (a case id as `astra spec-check` and verdicts print it, "
                              "e.g. Llama-3.1-8B/tp1/bfloat16/tokens=1,hidden=4096)" if key == "case" else
                              " (why the case is left out, e.g. the kernel's own error message)"))
        if isinstance(entry.get("case"), str):
            if entry["case"] in seen:
                out.append(f"{where}: case {entry['case']!r} is excluded twice")
            seen.add(entry["case"])
    return out


def check_tensor_options(arg: dict, where: str, known: set[str]) -> list[str]:
    """An argument's `present` (bool or expr), `row_stride` (int or expr; values are checked per case) and
    `unordered` (a bool, on an output)."""
    out = []
    if "counted" in arg and (not isinstance(arg["counted"], bool) or arg.get("kind") != "tensor"):
        out.append(f"{where}: `counted` is true or false, on a tensor (false: its size is left out of the "
                   f"drafted `bytes`), not {arg['counted']!r}")
    if "unordered" in arg and (not isinstance(arg["unordered"], bool) or arg.get("kind") != "tensor"
                               or arg["unordered"] and arg.get("role") not in ("out", "inout")):
        out.append(f"{where}: `unordered` is true or false, on an `out` or `inout` tensor (its order along the "
                   f"last dim is not part of the result), not {arg['unordered']!r} on a {arg.get('role', 'in')} "
                   f"{arg.get('kind')}")
    for key, what in (("present", "true, false or an expression over dims (e.g. `num_experts > 1`)"),
                      ("row_stride", "a positive integer or an expression over dims (e.g. `(q_heads + 2 * "
                                     "kv_heads) * head_dim`)")):
        if key not in arg:
            continue
        value = arg[key]
        if arg.get("kind") != "tensor":
            out.append(f"{where}: `{key}` applies to tensor arguments only")
        elif arg.get("alias") is not None:
            out.append(f"{where}: an alias is the very tensor of {arg['alias']!r}; give `{key}` there, not here")
        elif isinstance(value, bool) and key == "present" or positive_int(value) and key == "row_stride":
            continue
        elif not isinstance(value, str) or not value.strip():
            out.append(f"{where}: `{key}` must be {what}, not {value!r}")
        elif names_in(value) - known:
            out.append(f"{where}: {key} {value!r} uses unknown name(s) {sorted(names_in(value) - known)}")
    return out


def check_byte_split(raw: dict, known: set[str]) -> list[str]:
    """`bytes_read` and `bytes_written` (optional): both or neither, each an expression (or a non-negative
    integer) over dims, derived names and dtype; their values are checked per case (`byte_split_problem`)."""
    given = [key for key in ("bytes_read", "bytes_written") if raw.get(key) is not None]
    if len(given) == 1:
        other = "bytes_written" if given[0] == "bytes_read" else "bytes_read"
        return [f"`{given[0]}` needs `{other}` too (give both, adding up to `bytes`, or neither: then `bytes` is "
                "split by the arguments' roles)"]
    out = []
    for key in given:
        value = raw[key]
        if isinstance(value, int) and not isinstance(value, bool) and value >= 0:
            continue
        if not isinstance(value, str) or not value.strip():
            out.append(f"`{key}` must be an expression over dims (bytes), not {value!r}"[:200])
        elif names_in(value) - known:
            out.append(f"`{key}` {value!r} uses unknown name(s) {sorted(names_in(value) - known)}")
    return out


def byte_split_problem(raw: dict, names: dict) -> str | None:
    """In one case: `bytes_read` and `bytes_written` are non-negative integers adding up to `bytes`."""
    if raw.get("bytes_read") is None or raw.get("bytes_written") is None:
        return None
    total, parts = evaluate(raw["bytes"], names), [evaluate(raw[k], names) for k in ("bytes_read", "bytes_written")]
    if any(isinstance(v, bool) or not isinstance(v, int) or v < 0 for v in parts):
        return f"bytes_read and bytes_written must give non-negative integers, not {parts[0]!r} and {parts[1]!r}"
    if parts[0] + parts[1] != total:
        return (f"bytes_read {parts[0]} + bytes_written {parts[1]} = {parts[0] + parts[1]}, not bytes {total!r}: "
                "they split the bytes the kernel must move")
    return None


def check_source(source) -> list[str]:
    if not isinstance(source, dict):
        return ["`source` must be a mapping (sglang_version, kernel_file, repo_path, sha256)"]
    out = unknown_keys(source, SOURCE, "source")
    out += [f"source: missing `{k}`" for k in ("sglang_version", "kernel_file", "repo_path", "sha256")
            if k not in source]
    if Path(str(source.get("kernel_file", ""))).is_absolute():
        out.append(f"source.kernel_file {source['kernel_file']} is an absolute path, which holds on one machine only: "
                   "give it relative to the tree's jit csrc folder (`../../kda_kernels/csrc/...` for a kernel kept "
                   "beside its loader), or re-extract the draft with `astra extract NAME`")
    sha = str(source.get("sha256", ""))
    if "sha256" in source and (len(sha) != 64 or any(c not in "0123456789abcdef" for c in sha)):
        out.append("source.sha256 must be 64 lowercase hex characters")
    return out


def check_build(build) -> list[str]:
    if not isinstance(build, dict):
        return ["`build` must be a mapping (cuda_files, wrappers, flags)"]
    out = unknown_keys(build, BUILD, "build")
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
            out += unknown_keys(w, WRAPPER, f"build.wrappers[{i}]")
    return out


def check_tolerance(tol, dtypes: list[str]) -> list[str]:
    """An entry for every dtype of `dtypes`; entries for other known float dtypes (an output's own dtype,
    e.g. float8_e4m3fn) are allowed; integer and bool outputs are exact, so they take none."""
    if not isinstance(tol, dict):
        return ["`tolerance` must map each dtype to {atol, rtol, floor}"]
    out = unknown_keys(tol, tuple(DTYPE_BYTES), "tolerance")
    out += [f"tolerance: no entry for dtype {dt}" for dt in dtypes
            if dt not in EXACT_DTYPES and not isinstance(tol.get(dt), dict)]
    for dt, entry in tol.items():
        if dt not in DTYPE_BYTES or (dt in dtypes and not isinstance(entry, dict)):
            continue
        if dt in EXACT_DTYPES:
            out.append(f"tolerance.{dt}: {dt} outputs are compared exactly; remove this entry")
            continue
        if not isinstance(entry, dict):
            out.append(f"tolerance.{dt} must be a mapping {{atol, rtol, floor}}, not {entry!r}"[:200])
            continue
        out += unknown_keys(entry, TOLERANCE, f"tolerance.{dt}")
        for k in TOLERANCE:
            value = entry.get(k)
            if isinstance(value, bool) or not isinstance(value, (int, float)) or value < 0:
                out.append(f"tolerance.{dt}.{k} must be a non-negative number")
            elif not math.isfinite(value):  # .inf would accept anything, .nan nothing
                out.append(f"tolerance.{dt}.{k} must be a finite number, not {value!r}")
    return out


def review_markers(path: Path) -> list[str]:
    """One line per `TODO(review)` left in a spec file's raw text (comments included), with its line number
    (none for a file that cannot be read or is too large: loading it reports that)."""
    try:
        text = input_files.read_bytes(path, MAX_BYTES).decode("utf-8", errors="replace")
    except input_files.Refused:
        return []
    out = []
    for number, line in enumerate(text.splitlines(), 1):
        if REVIEW_MARKER in line:
            snippet = line.strip()
            snippet = snippet if len(snippet) <= 100 else snippet[:100] + "..."
            out.append(f"line {number}: {REVIEW_MARKER} not resolved: {snippet!r}; review it, then delete the "
                       "marker (or pass --draft to check a draft)")
    return out
