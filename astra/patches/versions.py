"""Comparing one kernel across two SGLang trees: its source (the file and its include closure) and, on a
GPU, its per-shape speed (each tree's original benched in its own worker process).

Used by `astra diff-versions NAME --from A --to B` and by `astra recheck`.
"""

from __future__ import annotations

import difflib
from pathlib import Path

from astra.sglang.includes import include_closure
from astra.sglang.tree import SglangTree, sha256_file
from astra.spec.model import KernelSpec
from harness import Verdict

NO_GPU = "not run: no CUDA GPU"


def gpu_status() -> str | None:
    """None when a CUDA GPU is usable, else why not (the text reports print)."""
    try:
        import torch
    except ImportError:
        return "not run: torch is not installed"
    return None if torch.cuda.is_available() else NO_GPU


def locate_kernel(tree: SglangTree, csrc_rel: str) -> tuple[Path | None, list[Path]]:
    """(the file at `csrc_rel` under the tree's csrc/, or the best same-named file; all same-named files)."""
    direct = tree.csrc_dir / csrc_rel
    found = sorted(tree.csrc_dir.rglob(Path(csrc_rel).name))
    if direct.is_file():
        return direct, found
    if not found:
        return None, []
    want = Path(csrc_rel).parts

    def shared_suffix(path: Path) -> int:
        parts = path.relative_to(tree.csrc_dir).parts
        n = 0
        while n < min(len(parts), len(want)) and parts[-1 - n] == want[-1 - n]:
            n += 1
        return n

    return max(found, key=lambda p: (shared_suffix(p), -len(p.parts))), found


def diffstat(old: str, new: str) -> tuple[int, int]:
    """(lines added, lines removed) from old to new."""
    added = removed = 0
    for line in difflib.unified_diff(old.splitlines(), new.splitlines(), lineterm="", n=0):
        if line.startswith("+") and not line.startswith("+++"):
            added += 1
        elif line.startswith("-") and not line.startswith("---"):
            removed += 1
    return added, removed


def compare_sources(old_tree: SglangTree, old_file: Path, new_tree: SglangTree, new_file: Path) -> dict:
    """The kernel file and every SGLang file it includes, keyed by path below the JIT directory
    (`csrc/...`, `include/...`, the same in both layouts): sha256 on each side and a diff stat."""
    def closure(tree: SglangTree, path: Path) -> dict[str, Path]:
        return {p.relative_to(tree.jit_dir.resolve()).as_posix() if p.is_relative_to(tree.jit_dir.resolve())
                else tree.package_path(p): p for p in (q.resolve() for q in include_closure(tree, [path]))}

    old_files, new_files = closure(old_tree, old_file), closure(new_tree, new_file)
    kernel_key_old = next(iter(old_files))
    kernel_key_new = next(iter(new_files))
    files = [_entry("kernel", kernel_key_old, kernel_key_new, old_files[kernel_key_old], new_files[kernel_key_new])]
    for key in sorted((set(old_files) | set(new_files)) - {kernel_key_old, kernel_key_new}):
        files.append(_entry("include", key, key, old_files.get(key), new_files.get(key)))
    changed = [f for f in files if f["status"] != "same"]
    return {"from": old_tree.version, "to": new_tree.version, "kernel": files[0], "files": files,
            "changed": [f["path"] for f in changed],
            "summary": f"{len(changed)} of {len(files)} files (kernel + includes) changed" if changed
            else f"none of {len(files)} files (kernel + includes) changed"}


def _entry(role: str, old_key: str, new_key: str, old: Path | None, new: Path | None) -> dict:
    old_sha = sha256_file(old) if old else None
    new_sha = sha256_file(new) if new else None
    status = "added" if old is None else "removed" if new is None else "same" if old_sha == new_sha else "changed"
    added, removed = diffstat(old.read_text(errors="replace") if old else "",
                              new.read_text(errors="replace") if new else "") if status != "same" else (0, 0)
    path = new_key if old_key == new_key else f"{old_key} -> {new_key}"
    return {"role": role, "path": path, "status": status, "old_sha256": old_sha, "new_sha256": new_sha,
            "added": added, "removed": removed}


def bench_original(spec: KernelSpec, tree: SglangTree, kernel_rel: str | None = None) -> Verdict:
    """The tree's original kernel over the spec's timed shapes, in a fresh worker process (GPU)."""
    from astra.verify import runner

    return runner.bench_original(spec, tree, runner.CheckOptions(sanitizer=False), kernel_rel=kernel_rel)


def compare_medians(old: Verdict, new: Verdict) -> list[dict]:
    """Per shape and mode: the original's median in each version and new/old (> 1: upstream got slower)."""
    def medians(verdict: Verdict) -> dict[tuple[str, str], float]:
        return {(c.id, mode): t.orig.median_us for c in verdict.cases for mode, t in c.timings.items()
                if t.orig.median_us}

    before, after = medians(old), medians(new)
    return [{"id": key[0], "mode": key[1], "old_us": before[key], "new_us": after[key],
             "new_over_old": after[key] / before[key]} for key in before if key in after]


def diff_versions(spec: KernelSpec, old_tree: SglangTree, new_tree: SglangTree) -> dict:
    """Source comparison always; per-shape speed in both versions when a GPU is here."""
    old_file, _ = locate_kernel(old_tree, spec.kernel_file)
    new_file, _ = locate_kernel(new_tree, spec.kernel_file)
    result: dict = {"name": spec.name, "from": old_tree.version, "to": new_tree.version}
    missing = [t.version for t, f in ((old_tree, old_file), (new_tree, new_file)) if f is None]
    if missing:
        result["sources"] = None
        result["note"] = f"{spec.kernel_file} is not in SGLang {', '.join(missing)}"
        result["speed"] = {"run": False, "reason": "not run: the kernel file is missing in one version"}
        return result
    result["sources"] = compare_sources(old_tree, old_file, new_tree, new_file)
    why_not = gpu_status()
    if why_not:
        result["speed"] = {"run": False, "reason": why_not}
        return result
    rel_old = old_file.relative_to(old_tree.csrc_dir).as_posix()
    rel_new = new_file.relative_to(new_tree.csrc_dir).as_posix()
    old_v, new_v = bench_original(spec, old_tree, rel_old), bench_original(spec, new_tree, rel_new)
    result["speed"] = {"run": True, "how": "each version's original benched in its own worker process, one "
                       "after the other on the same GPU; differences within ~2% are noise",
                       "status": {"from": old_v.status, "to": new_v.status},
                       "reason": {"from": old_v.reason, "to": new_v.reason},
                       "gpu": new_v.env.get("gpu"), "shapes": compare_medians(old_v, new_v)}
    return result
