"""`astra apply PATCH (--sglang-src DIR | --installed) [--force] [--check]`: drop an Astra patch into SGLang.

The patch's trailers say which file it changes and the sha256 that file must have. The file is found in
the tree (a checkout's `python/sglang/...`, or an unpacked/installed package's `sglang/...`), its hash
compared, and the diff applied with `git apply` (`-p2` for a repo-layout patch, `-p1` for a package-layout
one, run at the directory that holds `sglang/`). After applying, the file must hash to
Astra-Patched-SHA256 (unless --force let a different base through).

Exit codes:
  0  applied (or, with --check, would apply; or the file already is the patched version)
  2  the patch does not apply to this tree (the file is missing, or `git apply --check` fails)
  3  not an SGLang tree, or no installed sglang package (astra.errors.SglangNotFound)
  6  git is not installed (astra.errors.ToolMissing)
  8  the file's sha256 differs from Astra-Base-SHA256 (pass --force to try anyway)
  9  not an Astra patch, or a corrupt/truncated/inconsistent one — including one that would change any
     file besides the one its trailers name (astra.patches.scope; the error names the extra paths)
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from astra.errors import BaseHashMismatch, PatchDoesNotApply, SglangNotFound
from astra.patches import patchfile
from astra.sglang import tree as sglang_tree
from astra.sglang.tree import SglangTree, sha256_file


@dataclass
class ApplyResult:
    target: Path
    status: str  # "applied" | "would apply" | "already applied"
    message: str


def tree_for(sglang_src: str | None, installed: bool) -> SglangTree:
    """The tree named by --sglang-src, or the installed package (--installed)."""
    if sglang_src:
        return sglang_tree.from_source(Path(sglang_src))
    if installed:
        tree = sglang_tree.find_installed()
        if tree is None:
            raise SglangNotFound("--installed: no sglang package with JIT kernels is importable from this Python; "
                                 "pip install sglang, or give a checkout with --sglang-src PATH")
        return tree
    raise SglangNotFound("say where to apply the patch: --sglang-src PATH (a checkout or unpacked package) "
                         "or --installed")


def apply(patch_path: Path, tree: SglangTree, *, force: bool = False, check_only: bool = False) -> ApplyResult:
    """Check the base hash and apply (or only check) the patch; raises the errors listed above."""
    patch = patchfile.parse(patch_path)
    target = tree.root / patch.package_path
    if not target.is_file():
        hint = ""
        if patch.csrc_rel and (tree.csrc_dir / patch.csrc_rel).is_file():
            hint = f"; this tree has it at {tree.package_path(tree.csrc_dir / patch.csrc_rel)}"
        raise PatchDoesNotApply(
            f"{patch.package_path} is not in {tree.describe()}{hint}: the patch was made for SGLang "
            f"{patch.sglang_version or '?'}; see `astra recheck {patch_path} --sglang {tree.version}`")
    sha = sha256_file(target)
    if sha == patch.patched_sha and sha != patch.base_sha:
        return ApplyResult(target, "already applied", f"{target} already is the patched version; nothing to do")
    if sha != patch.base_sha and not force:
        raise BaseHashMismatch(
            f"{target} has sha256 {sha[:12]}..., not the {patch.base_sha[:12]}... of SGLang "
            f"{patch.sglang_version or '?'}'s original that the patch was made for (edited, or another version); "
            f"`astra recheck {patch_path} --sglang-src DIR` says whether it still fits, --force tries anyway")
    ok, error = patchfile.git_apply(patch.text, tree.root, strip=patch.strip, check=True)
    if not ok:
        raise PatchDoesNotApply(f"{patch.path.name} does not apply to {target}: {error}")
    forced = "" if sha == patch.base_sha else " (base hash differed; --force)"
    if check_only:
        return ApplyResult(target, "would apply", f"{patch.path.name} applies cleanly to {target}{forced}")
    ok, error = patchfile.git_apply(patch.text, tree.root, strip=patch.strip)
    if not ok:
        raise PatchDoesNotApply(f"{patch.path.name} does not apply to {target}: {error}")
    after = sha256_file(target)
    result = "matches Astra-Patched-SHA256" if after == patch.patched_sha else f"sha256 {after[:12]}... (differs " \
        "from Astra-Patched-SHA256: the base was not the original; verify with `astra check`)"
    return ApplyResult(target, "applied", f"applied {patch.path.name} to {target}{forced}; the file {result}")
