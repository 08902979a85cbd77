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
from astra.spec import draft as drafting

DRAFT_HEADER = "# Draft written by `astra extract`"
PROBED_MARK = "# Probed by `astra probe`"  # the header line the probe writes above a draft it rewrote


@dataclass
class ExtractResult:
    draft: Path
    snapshot: Path
    files: list[str]
    notes: list[str] = field(default_factory=list)


def snapshot(tree: SglangTree, name: str, files: list[Path]) -> Path:
    manifest = {tree.package_path(f): sha256_file(f) for f in files}
    digest = __import__("hashlib").sha256(json.dumps(manifest, sort_keys=True).encode()).hexdigest()[:12]
    # names from the tree (a module name, a version) become one path component each: never `..` nor `/`
    target = paths.sub("snapshots") / paths.safe_name(name) / paths.safe_name(f"{tree.version}-{digest}")
    if not (target / "manifest.json").exists():
        for f in files:
            dest = target / tree.package_path(f)
            dest.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(f, dest)
        (target / "manifest.json").write_text(json.dumps(
            {"sglang_version": tree.version, "origin": tree.origin, "files": manifest}, indent=1))
    return target


def extract(tree: SglangTree, name: str, out_dir: Path | None = None, export: str | None = None,
            build_check: bool = True) -> ExtractResult:
    module = registry.find(tree, name)
    site = module.call_sites[0]
    sources = [registry.resolve_source(tree, f) for f in site.cuda_files + site.cpp_files]
    missing = [f for f, p in zip(site.cuda_files + site.cpp_files, sources) if p is None]
    if missing:
        from astra.errors import AstraError

        raise AstraError(f"module {name}: cannot find source(s) {missing} in {tree.describe()}")
    files = include_closure(tree, sources)
    guess = variants.guess(site)
    notes = [f"template argument `{s}` has no default; fill it in" for s in guess.unresolved]
    spec, more = drafting.draft_module(tree, module, export=export)  # refuses an unknown --export first
    snap = snapshot(tree, name, files)
    notes += more
    if build_check:  # template values the compiler decides (nvcc --cubin on this machine, cached)
        from astra.spec import template_search

        settled = template_search.settle(tree, module, spec)
        notes += settled.notes
        if settled.changed:
            from astra.spec.draft_cases import refit_tokens

            notes += refit_tokens(spec)
    out = out_dir or paths.drafts_dir() / _safe(name)
    out.mkdir(parents=True, exist_ok=True)
    draft = out / "kernel.yaml"
    if draft.exists() and not draft.read_text(errors="replace").startswith(DRAFT_HEADER):
        draft = out / "kernel.draft.yaml"  # a person edited kernel.yaml: never overwrite a review
    else:
        (out / "probe.json").unlink(missing_ok=True)  # evidence of an earlier draft does not carry over
    header = DRAFT_HEADER + "; review every TODO(review) before use.\n"
    header += "".join(f"# TODO(review): {n}\n" for n in notes)
    draft.write_text(header + dump_yaml(spec))
    return ExtractResult(draft, snap, [tree.package_path(f) for f in files], notes)


class _Dumper(yaml.SafeDumper):
    """Short lists of scalars (shapes, token sweeps, file lists) and small flat mappings (init,
    tolerance entries) on one line, as a person writes a spec."""


def _list(dumper, data):
    flow = all(isinstance(x, (str, int, float, bool)) for x in data) and len(data) <= 16
    return dumper.represent_sequence("tag:yaml.org,2002:seq", data, flow_style=flow)


def _dict(dumper, data):
    flow = 0 < len(data) <= 6 and all(isinstance(v, (str, int, float, bool)) for v in data.values()) and \
        sum(len(str(k)) + len(str(v)) for k, v in data.items()) < 90
    return dumper.represent_mapping("tag:yaml.org,2002:map", data.items(), flow_style=flow)


_Dumper.add_representer(list, _list)
_Dumper.add_representer(dict, _dict)


def dump_yaml(data: dict) -> str:
    return yaml.dump(data, Dumper=_Dumper, sort_keys=False, width=120, allow_unicode=False)


def _safe(name: str) -> str:
    """A draft's folder name: the module name with `{`, `}`, `/` and the like as `_` (never `.` or `..`)."""
    return paths.safe_name(re.sub(r"[^A-Za-z0-9_.-]", "_", name))


def single_gpu_modules(tree: SglangTree, progress=None) -> list[str]:
    """Modules that build for sm_90a and run on one GPU (multi-GPU communication set aside)."""
    return [m.name for m in registry.modules(tree, progress=progress)
            if m.sm90a in ("yes", "built") and m.category != "communication"]


def extract_many(tree: SglangTree, names: list[str] | None = None, jobs: int | None = None, build_check: bool = True,
                 progress=None) -> list[tuple[str, Path | None, list[str], str | None]]:
    """Draft every named module (default: every single-GPU sm_90a module), libclang parses in
    `jobs` spawned processes (default: every CPU core). Returns (name, draft, notes, error) in the order of
    the names; `progress(done, total)` is called once the modules are known (0 done) and as each is drafted.

    The workers' temporary files (template checks, nvcc's intermediates) go under one folder this process
    owns (TMPDIR of the workers) and removes on the way out, so a worker killed with this process leaves
    nothing behind."""
    import multiprocessing
    import os
    import shutil
    import tempfile
    from concurrent.futures import ProcessPoolExecutor, as_completed

    from harness.worker import children

    names = names or single_gpu_modules(tree)
    jobs = max(1, min(jobs or os.cpu_count() or 1, len(names)))
    work = [(str(tree.root), tree.version, tree.origin, n, build_check) for n in names]
    results: dict[str, tuple] = {}

    def drafted(result) -> None:
        results[result[0]] = result
        if progress is not None:
            progress(len(results), len(work))

    if progress is not None:
        progress(0, len(work))
    if jobs == 1:
        for w in work:
            drafted(_extract_one(w))
        return [results[n] for n in names]
    tempfile.gettempdir()  # fixed now, before TMPDIR points at the workers' folder
    scratch = tempfile.mkdtemp(prefix="astra-extract-")
    saved = os.environ.get("TMPDIR")
    # inherited by the workers, spawned as the pool needs them (and by their nvcc); this process's own
    # temporary folder was fixed at its first use
    os.environ["TMPDIR"] = scratch
    try:
        # spawn, not fork: libclang parses on helper threads
        with ProcessPoolExecutor(jobs, mp_context=multiprocessing.get_context("spawn"),
                                 initializer=children.die_with_parent, initargs=(os.getpid(),)) as pool:
            for future in as_completed([pool.submit(_extract_one, w) for w in work]):
                drafted(future.result())
    finally:
        if saved is None:
            os.environ.pop("TMPDIR", None)
        else:
            os.environ["TMPDIR"] = saved
        shutil.rmtree(scratch, ignore_errors=True)
    return [results[n] for n in names]


def _extract_one(work: tuple) -> tuple[str, Path | None, list[str], str | None]:
    from astra.errors import AstraError

    root, version, origin, name, build_check = work
    tree = SglangTree(Path(root), version, origin)
    try:
        result = extract(tree, name, build_check=build_check)
    except (AstraError, ValueError, KeyError, IndexError, TypeError) as err:
        return name, None, [], f"{type(err).__name__}: {str(err)[:200]}"
    return name, result.draft, result.notes, None
