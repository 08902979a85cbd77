"""The JIT modules of one SGLang tree: call sites grouped by module name, with their sources resolved
and a static judgement of whether each builds for sm_90a (confirmed by a real build where one ran)."""

from __future__ import annotations

import json
import re
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path

from astra import input_files, paths
from astra.errors import UnknownKernel
from astra.input_files import Refused
from astra.sglang.discovery import CallSite, scan_tree
from astra.sglang.tree import SglangTree, read_tree_text, sha256_file

# Markers of code written for another GPU family, in a path or module name.
_OTHER_TARGET = re.compile(r"(sm_?1[0-2]\d|blackwell|gfx\d+|_hip\b|hip_|rocm|cdna)", re.I)
# Header-only dependencies SGLang resolves from other installed packages.


@dataclass
class JitModule:
    name: str
    category: str
    sources: list[str]  # relative to the tree's csrc (or absolute when outside it)
    exports: list[str]
    header_only: bool
    dependencies: list[str]
    sm90a: str  # "yes" | "no" | "needs-dep" | "built" | "build-failed"
    sm90a_reason: str
    call_sites: list[CallSite] = field(default_factory=list)


def _category(site: CallSite, sources: list[str]) -> str:
    parts = Path(site.file).parts
    if "ops" in parts and parts.index("ops") + 1 < len(parts) - 1:
        return parts[parts.index("ops") + 1]
    if "kda_kernels" in parts:
        return "kda"
    if sources and "/" in sources[0]:
        return sources[0].split("/")[0]
    return Path(site.file).stem


def resolve_source(tree: SglangTree, rel: str) -> Path | None:
    """Where a cuda/cpp file named at a call site lives (csrc first, then the other csrc dirs)."""
    if "{" in rel:
        return None
    candidate = Path(rel)
    if candidate.is_absolute():
        return candidate if candidate.exists() else None
    extra = getattr(tree, "loader_dirs", ())  # a bare csrc tree (tests, a checkout subset) has none
    roots = [tree.csrc_dir] + sorted(p for base in extra for p in base.rglob("csrc") if p.is_dir())
    for root in roots:
        if (root / rel).is_file():
            return root / rel
    return None


def source_roots(tree: SglangTree, rels: list[str]) -> list[str]:
    """The csrc directories other than the main one that hold files named at a call site (kernels
    SGLang keeps beside their loader, e.g. `kda_kernels/csrc`): they join the include path so the
    relative `#include` of such a file, and its own quoted includes, resolve as SGLang's do."""
    roots: list[str] = []
    for rel in rels:
        found = resolve_source(tree, rel)
        if found is None or Path(rel).is_absolute() or found.is_relative_to(tree.csrc_dir):
            continue
        root = str(found)[: -len(rel)].rstrip("/")
        if root not in roots:
            roots.append(root)
    return roots


_IF = re.compile(r"^\s*#\s*(if|ifdef|ifndef|elif|else|endif)\b(.*)$")


def _preprocessor_blocks_sm90(text: str) -> str | None:
    """The reason an `#error` fires when compiling this file for CUDA sm_90a, if one does."""
    stack: list[str] = []
    for line in text.splitlines():
        m = _IF.match(line)
        if m:
            kind, cond = m.group(1), m.group(2).strip()
            if kind in ("if", "ifdef", "ifndef"):
                stack.append(f"{kind} {cond}")
            elif kind in ("elif", "else") and stack:
                stack[-1] = f"{kind} {cond}"
            elif kind == "endif" and stack:
                stack.pop()
            continue
        if re.match(r"^\s*#\s*error\b", line) and stack and _condition_true_for_sm90(stack[-1]):
            msg = line.split("error", 1)[1].strip().strip('"')
            return f"#error for this target: {msg[:80]}"
    return None


def _condition_true_for_sm90(cond: str) -> bool:
    kind, _, expr = cond.partition(" ")
    if kind == "ifndef":
        return expr.strip() not in ("SGL_CUDA_ARCH", "__CUDACC__", "__CUDA_ARCH__")
    if kind == "ifdef":
        return expr.strip() in ("SGL_CUDA_ARCH", "__CUDACC__", "__CUDA_ARCH__")
    if kind == "else":
        return False  # unknowable without the matching #if; do not claim a block
    expr = re.sub(r"//.*$", "", expr)
    defined = {"SGL_CUDA_ARCH": True, "__CUDACC__": True, "__CUDA_ARCH__": True}
    expr = re.sub(r"defined\s*\(?\s*(\w+)\s*\)?", lambda m: "1" if defined.get(m.group(1)) else "0", expr)
    expr = expr.replace("SGL_CUDA_ARCH", "900").replace("&&", " and ").replace("||", " or ")
    expr = re.sub(r"!(?!=)", " not ", expr)
    expr = re.sub(r"\b[A-Za-z_]\w*\b", lambda m: m.group(0) if m.group(0) in ("and", "or", "not") else "0", expr)
    if re.search(r"\*\*|<<\s*\d{3,}", expr):  # no power in C; a huge shift would take the machine's memory
        return False
    try:
        return bool(eval(compile(expr, "<cond>", "eval"), {"__builtins__": {}}, {}))  # digits/operators only
    except (SyntaxError, TypeError, ValueError, NameError, ArithmeticError, RecursionError, MemoryError):
        return False


def _judge(tree: SglangTree, name: str, sites: list[CallSite], resolved: list[Path | None]) -> tuple[str, str]:
    site = sites[0]
    files = site.cuda_files + site.cpp_files
    if any(p is None for p in resolved):
        missing = [f for f, p in zip(files, resolved) if p is None]
        return "no", f"source not found: {', '.join(missing)}"
    other = _OTHER_TARGET.search(" ".join([name, *files, site.file]))
    if other:
        return "no", f"written for another target ({other.group(0)})"
    if any("hip" in g.lower() and not g.startswith("not") for g in site.guards):
        return "no", "loaded only on ROCm"
    for path in resolved:
        try:
            reason = _preprocessor_blocks_sm90(read_tree_text(path))
        except Refused as err:  # a FIFO, a link to /dev/zero, a huge file
            return "no", f"source {path.name}: {err.why}"
        if reason:
            return "no", reason
    if site.extra_dependencies:
        return "needs-dep", "needs headers of " + ", ".join(site.extra_dependencies)
    return "yes", "static check"


def _build_records(tree: SglangTree) -> dict[str, dict]:
    """Results of real builds (`astra build`), which override the static judgement. A record file that
    cannot be read (not a regular file, too large, not a JSON object) counts as none: the builds are
    recorded anew."""
    path = paths.sub("build-records") / paths.safe_name(f"{tree.version}-{tree.origin}.json")
    if not path.exists():
        return {}
    try:
        records = input_files.read_json(path, input_files.RECORD_BYTES, what="a build record")
    except input_files.Refused:
        return {}
    if not isinstance(records, dict):
        return {}
    return {k: v for k, v in records.items() if isinstance(v, dict) and {"ok", "reason"} <= set(v)}


def record_build(tree: SglangTree, name: str, arch: str, ok: bool, reason: str) -> None:
    path = paths.sub("build-records") / paths.safe_name(f"{tree.version}-{tree.origin}.json")
    records = _build_records(tree)
    records[f"{name}@{arch}"] = {"ok": ok, "reason": reason}
    path.write_text(json.dumps(records, indent=1, sort_keys=True))


_MODULES: dict[tuple[str, str, str], tuple[JitModule, ...]] = {}  # a tree's modules, found once per process


def _modules_cached(root: str, version: str, origin: str, progress=None) -> tuple[JitModule, ...]:
    key = (root, version, origin)
    if key not in _MODULES:
        if len(_MODULES) >= 8:
            _MODULES.pop(next(iter(_MODULES)))
        _MODULES[key] = _find_modules(SglangTree(Path(root), version, origin), progress)
    return _MODULES[key]


def _find_modules(tree: SglangTree, progress) -> tuple[JitModule, ...]:
    by_name: dict[str, list[CallSite]] = {}
    for site in scan_tree(tree, progress):
        by_name.setdefault(site.module_name, []).append(site)
    modules = []
    for name, sites in sorted(by_name.items()):
        site = sites[0]
        files = site.cuda_files + site.cpp_files
        resolved = [resolve_source(tree, f) for f in files]
        status, reason = _judge(tree, name, sites, resolved)
        sources = [
            (p.relative_to(tree.csrc_dir).as_posix() if p and p.is_relative_to(tree.csrc_dir) else str(p or f))
            for f, p in zip(files, resolved)
        ]
        exports = sorted({w.export for s in sites for w in s.wrappers})
        modules.append(JitModule(name, _category(site, sources), sources, exports, site.header_only,
                                 sorted(set(site.extra_dependencies)), status, reason, sites))
    return tuple(modules)


def modules(tree: SglangTree, arch: str = "sm_90a", progress=None) -> list[JitModule]:
    """The tree's JIT modules (found once per process); `progress(done, total)` counts the loader files read."""
    out = [replace(m) for m in
           _modules_cached(str(tree.root), tree.version, tree.origin, progress)]
    records = _build_records(tree)
    for m in out:
        record = records.get(f"{m.name}@{arch}")
        if record is not None:
            m.sm90a = "built" if record["ok"] else "build-failed"
            m.sm90a_reason = record["reason"]
    return out


def is_template(name: str) -> bool:
    """Whether a module or export name has parts SGLang fills in at run time (`store_{name}`): the call site
    builds it from the loader's arguments, which discovery keeps as source text in braces."""
    return "{" in name and "}" in name


def module_record(tree: SglangTree, module: JitModule) -> dict:
    """A module as `astra list --json` (and the MCP `list` tool) give it: its fields without the call sites,
    whether its name is a template, and the sha256 of each of its sources."""
    record = {k: v for k, v in asdict(module).items() if k != "call_sites"}
    return {**record, "name_is_template": is_template(module.name), "files": source_hashes(tree, module)}


def find(tree: SglangTree, name: str) -> JitModule:
    mods = modules(tree)
    for m in mods:
        if m.name == name:
            return m
    for m in mods:  # a draft's folder name: the module name with `{`, `}` and the like as `_`
        if re.sub(r"[^A-Za-z0-9_.-]", "_", m.name) == name:
            return m
    close = [m.name for m in mods if name in m.name or m.name in name][:5]
    hint = f"; did you mean {', '.join(close)}?" if close else "; run `astra list` to see them"
    raise UnknownKernel(f"no JIT module named {name!r} in SGLang {tree.version}{hint}")


def file_hashes(tree: SglangTree, files: list[Path]) -> dict[str, str]:
    return {tree.repo_path(f): sha256_file(f) for f in files}


def source_hashes(tree: SglangTree, module: JitModule) -> dict[str, str]:
    """sha256 of each of the module's own source files, by its path in the SGLang repository layout."""
    site = module.call_sites[0]
    found = [resolve_source(tree, f) for f in site.cuda_files + site.cpp_files]
    return file_hashes(tree, [p for p in found if p is not None])
