"""What a kernel spec file may hold before validation looks at its meaning: a bounded size, YAML
without anchors or aliases (no "billion laughs"), and only the keys the format defines, each unknown
one answered with the nearest known key (`referense` must not silently turn the reference off)."""

from __future__ import annotations

import difflib
from pathlib import Path

import yaml

MAX_BYTES = 1 << 20  # 1 MiB: the largest committed spec is a few KiB

TOP = ("name", "module", "category", "description", "source", "build", "entry", "signature", "dims", "derived",
       "dtypes", "arguments", "shapes", "tolerance", "bytes", "reference")
SOURCE = ("sglang_version", "kernel_file", "repo_path", "sha256", "loader")
BUILD = ("cuda_files", "cpp_files", "extra_cuda_cflags", "extra_cflags", "extra_ldflags", "extra_include_paths",
         "extra_dependencies", "wrappers", "header_only")
WRAPPER = ("export", "entry", "lang")
SHAPES = ("tokens", "token_dim", "models", "edge", "constraints")
MODEL_ENTRY = ("model", "tp", "dims", "tokens")
ARGUMENT = ("name", "kind", "role", "shape", "dtype", "init", "value", "doc", "alias")
INIT = ("dist", "mean", "std", "low", "high", "start", "step", "value", "large", "small")
TOLERANCE = ("atol", "rtol", "floor")


class _NoAliasLoader(yaml.SafeLoader):
    """SafeLoader that refuses anchors and aliases: a spec never needs them, and an alias bomb
    expands to gigabytes from a few hundred bytes."""

    def compose_node(self, parent, index):
        if self.check_event(yaml.AliasEvent):
            event = self.peek_event()
            raise yaml.composer.ComposerError(
                None, None, f"YAML aliases (*{event.anchor}) are not allowed in a kernel spec; write the value out",
                event.start_mark)
        event = self.peek_event()
        anchor = getattr(event, "anchor", None)
        if anchor is not None:
            raise yaml.composer.ComposerError(
                None, None, f"YAML anchors (&{anchor}) are not allowed in a kernel spec; write the value out",
                event.start_mark)
        return super().compose_node(parent, index)


def read_yaml(path: Path) -> tuple[object, str | None]:
    """(the parsed document, None) or (None, why it cannot be read) — bounded in size and work."""
    try:
        size = path.stat().st_size
    except OSError as err:
        return None, f"cannot read the file ({err.strerror or err})"
    if size > MAX_BYTES:
        return None, f"the file is {size:,} bytes; a kernel spec is at most {MAX_BYTES:,} bytes (1 MiB)"
    try:
        text = path.read_bytes().decode("utf-8")
    except OSError as err:
        return None, f"cannot read the file ({err.strerror or err})"
    except UnicodeDecodeError as err:
        return None, f"not UTF-8 text ({err.reason} at byte {err.start})"
    try:
        return yaml.load(text, Loader=_NoAliasLoader), None  # noqa: S506 - a SafeLoader subclass
    except yaml.YAMLError as err:
        mark = getattr(err, "problem_mark", None)
        where = f" at line {mark.line + 1}" if mark else ""
        return None, f"not valid YAML{where}: {getattr(err, 'problem', None) or err}"
    except RecursionError:
        return None, "not valid YAML: nested too deeply"


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


def _positive_ints(values: object, where: str) -> list[str]:
    if not isinstance(values, list) or not values:
        return [f"{where} must be a non-empty list of positive integers"]
    bad = [v for v in values if not positive_int(v)]
    return [f"{where}: {bad[0]!r} is not a positive integer (token counts and dims are > 0)"] if bad else []


def check_shapes(shapes: object, dim_names: list[str]) -> list[str]:
    """The structure of `shapes:` (its values are checked when the suite is expanded)."""
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
        out += [f"shapes.edge[{i}].{k}: {v!r} is not a positive integer" for k, v in dims.items()
                if not positive_int(v)]
    constraints = shapes.get("constraints")
    if constraints is not None and (not isinstance(constraints, list)
                                    or not all(isinstance(c, str) for c in constraints)):
        out.append("shapes.constraints must be a list of expression strings")
    return out
