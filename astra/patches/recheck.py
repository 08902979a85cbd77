"""`astra recheck PATCH... --sglang VERSION`: after an SGLang upgrade, does each Astra patch still drop in,
is it still correct, and is it still faster? Made to run in CI.

Per patch, against the new tree:
  1. where the kernel file is: "present" at the patch's path, "moved" (the same csrc/-relative path in
     another layout, else a same-named file under csrc/; the new path is reported), or "gone";
  2. whether the diff applies to it: "exact" (`git apply --check`), "fuzz" (`git apply --check -C1`,
     else GNU `patch --dry-run --fuzz=2`; the method is reported) or "no";
  3. which of the kernel's sources changed since the patch's SGLang version (file + include closure);
  4. with a CUDA GPU, and when the diff applies: the patched kernel verified against the NEW original
     (correctness, per-shape speed, sanitizer) by the one acceptance rule (`harness.verified_faster`),
     and the new original timed against the old one per shape (each in its own worker). Without a GPU
     these parts say "not run: no CUDA GPU"; with `no_gpu` (`--no-gpu`) they are not run at all.

Exit code per patch, and for the command the most severe over all patches, in this order:
  2  a patch no longer applies as it is (`git apply` of the patch fails: the file is gone, moved, or
     changed so that only a fuzzy apply or none works);
  1  a correctness or speed regression (the patched kernel is incorrect on the new version, or no
     longer verified faster than the new original);
  11 could not verify (astra.errors.CouldNotVerify): the sources were not compared (the patch's base
     version is unavailable, or its file there is not the patch's base), or the GPU checks did not run
     (no GPU, or the spec failed to load), or compute-sanitizer did not run cleanly. `--no-gpu` accepts
     a source-only recheck: no GPU is then fine, but uncompared sources still give 11;
  0  all well.
A known failure beats an unknown: 2 > 1 > 11 > 0. Corrupt patches, and patches that would change any
file besides the one they name, stop the command first (exit 9), as `astra apply` does.
"""

from __future__ import annotations

import shutil
import tempfile
from dataclasses import asdict, dataclass, field
from pathlib import Path

from astra.errors import AstraError, CouldNotVerify
from astra.patches import message as patch_message
from astra.patches import patchfile, versions
from astra.sglang import tree as sglang_tree
from astra.sglang.tree import SglangTree, sha256_file
from astra.spec import jobs
from astra.spec import model as spec_mod
from harness import verified_faster, verify_job

OK, REGRESSION, NO_LONGER_APPLIES = 0, 1, 2
COULD_NOT_VERIFY = CouldNotVerify.exit_code
SEVERITY = (OK, COULD_NOT_VERIFY, REGRESSION, NO_LONGER_APPLIES)  # least to most severe
NO_GPU_FLAG = "not run: --no-gpu (source-only recheck)"


def worst(*codes: int) -> int:
    """The most severe of the exit codes (2 > 1 > 11 > 0)."""
    return max(codes, key=SEVERITY.index, default=OK)


@dataclass
class PatchCheck:
    """The recheck of one patch (JSON as is; markdown by astra.recheck_report)."""

    patch: str
    spec: str
    kernel_file: str
    base_version: str | None
    location: str = "gone"  # present | moved | gone
    new_path: str | None = None  # package path in the new tree
    same_name: list[str] = field(default_factory=list)  # every same-named file under csrc/
    file_changed: bool | None = None  # the file's sha256 differs from Astra-Base-SHA256
    applies: str = "no"  # exact | fuzz | no
    apply_method: str | None = None
    apply_error: str | None = None
    sources: dict | None = None  # versions.compare_sources(old, new), or None with sources_note
    sources_note: str | None = None
    gpu: dict = field(default_factory=dict)
    exit_code: int = OK
    problems: list[str] = field(default_factory=list)
    unverified: list[str] = field(default_factory=list)  # why it could not be verified (exit 11)


def recheck(patch_paths: list[Path], tree: SglangTree, *, old_tree_for=None, no_gpu: bool = False) -> dict:
    """Recheck every patch against `tree`; {sglang, gpu, source_only, exit_code, patches: [PatchCheck dicts]}.

    `old_tree_for(version)` gives the tree a patch was made against (default: its wheel, downloaded once).
    `no_gpu`: a source-only recheck (the GPU checks are not run, and that is not "could not verify").
    """
    patches = [patchfile.parse(p) for p in patch_paths]  # corrupt or smuggling input stops here (exit 9)
    old_tree_for = old_tree_for or sglang_tree.from_wheel
    gpu_reason = NO_GPU_FLAG if no_gpu else versions.gpu_status()
    checks = [check_one(p, tree, old_tree_for=old_tree_for, gpu_reason=gpu_reason, no_gpu=no_gpu)
              for p in patches]
    return {"sglang": {"version": tree.version, "origin": tree.origin, "root": str(tree.root)},
            "gpu": "not used (--no-gpu)" if no_gpu else gpu_reason or "available", "source_only": no_gpu,
            "exit_code": worst(*(c.exit_code for c in checks)),
            "patches": [asdict(c) for c in checks]}


def check_one(patch: patchfile.AstraPatch, tree: SglangTree, *, old_tree_for, gpu_reason: str | None,
              no_gpu: bool = False) -> PatchCheck:
    result = PatchCheck(patch=str(patch.path), spec=patch.spec, kernel_file=patch.repo_path,
                        base_version=patch.sglang_version)
    target = tree.root / patch.package_path
    same_name: list[Path] = []
    if not target.is_file():
        target, same_name = versions.locate_kernel(tree, patch.csrc_rel or Path(patch.package_path).name)
        result.location = "moved" if target is not None else "gone"
    else:
        result.location = "present"
        same_name = sorted(tree.csrc_dir.rglob(target.name))
    result.same_name = [tree.package_path(p) for p in same_name]
    if target is None:
        result.problems.append(f"{patch.package_path} is gone from SGLang {tree.version} "
                               "(no file of that name under csrc/)")
        result.exit_code = NO_LONGER_APPLIES
        result.gpu = {"run": False, "reason": "not run: the kernel file is gone"}
        return result
    result.new_path = tree.package_path(target)
    result.file_changed = sha256_file(target) != patch.base_sha
    patched_text = _try_apply(patch, target, result)
    if result.location == "moved":
        result.problems.append(f"the kernel file moved to {result.new_path}: "
                               f"re-emit the patch for SGLang {tree.version}")
    if result.applies != "exact":
        result.problems.append(f"the diff applies {'only with fuzz' if result.applies == 'fuzz' else 'not at all'}"
                               + (f": {result.apply_error}" if result.apply_error else ""))
    if result.location != "present" or result.applies != "exact":
        result.exit_code = NO_LONGER_APPLIES
    old_tree, old_file = _old_tree(patch, old_tree_for, result)
    if old_tree is not None and old_file is not None:
        result.sources = versions.compare_sources(old_tree, old_file, tree, target)
    else:
        result.unverified.append(result.sources_note or "the sources were not compared")
    if patched_text is None:
        result.gpu = {"run": False, "reason": "not run: the patch does not apply"}
    elif gpu_reason:
        result.gpu = {"run": False, "reason": gpu_reason}
        if not no_gpu:
            result.unverified.append(f"GPU checks {gpu_reason} (pass --no-gpu to accept a source-only recheck)")
    else:
        result.gpu = _gpu_checks(patch, tree, target, patched_text, old_tree, old_file)
        if result.gpu.get("regression"):
            result.problems.append(result.gpu["regression"])
            result.exit_code = worst(result.exit_code, REGRESSION)
        elif not result.gpu.get("run"):
            result.unverified.append(f"GPU checks {result.gpu.get('reason', 'not run')}")
        elif not result.gpu.get("sanitizer_clean", True):
            result.unverified.append(f"{result.gpu.get('sanitizer')} (the sanitizer did not run cleanly)")
    if result.unverified:
        result.exit_code = worst(result.exit_code, COULD_NOT_VERIFY)
    return result


def _try_apply(patch: patchfile.AstraPatch, target: Path, result: PatchCheck) -> str | None:
    """Apply the diff to a copy of `target` placed at the patch's own path: exact, then fuzzy.
    Records the outcome on `result`; returns the patched text, or None when nothing applies."""
    with tempfile.TemporaryDirectory(prefix="astra-recheck-") as tmp:
        work = Path(tmp) / "tree"
        copy = work / patch.diff_path
        copy.parent.mkdir(parents=True)  # (GNU patch gets only the parsed diff, never the whole mail)
        shutil.copyfile(target, copy)
        ok, error = patchfile.git_apply(patch.text, work, check=True)
        if ok:
            result.applies, result.apply_method = "exact", "git apply --check"
            patchfile.git_apply(patch.text, work)
            return copy.read_text()
        result.apply_error = error
        ok, _ = patchfile.git_apply(patch.text, work, check=True, context=1)
        if ok:
            result.applies, result.apply_method = "fuzz", "git apply --check -C1"
            patchfile.git_apply(patch.text, work, context=1)
            return copy.read_text()
        if patchfile.gnu_patch():
            ok, message = patchfile.gnu_patch_apply(patch.diff_text, work, dry_run=True)
            if ok:
                result.applies, result.apply_method = "fuzz", "patch --dry-run --fuzz=2"
                patchfile.gnu_patch_apply(patch.diff_text, work)
                return copy.read_text()
            result.apply_method = "git apply --check; git apply --check -C1; patch --dry-run --fuzz=2"
        else:
            result.apply_method = "git apply --check; git apply --check -C1 (GNU patch not installed)"
        result.applies = "no"
        return None


def _old_tree(patch: patchfile.AstraPatch, old_tree_for, result: PatchCheck):
    """The tree the patch was made against and its kernel file, or (None, None) with a note why not."""
    if not patch.sglang_version:
        result.sources_note = "the patch names no Astra-SGLang-Version; sources not compared"
        return None, None
    try:
        old_tree = old_tree_for(patch.sglang_version)
    except AstraError as err:
        result.sources_note = f"SGLang {patch.sglang_version} (the patch's base) is not available: {err}"
        return None, None
    old_file = old_tree.root / patch.package_path
    if not old_file.is_file() or sha256_file(old_file) != patch.base_sha:
        result.sources_note = (f"SGLang {patch.sglang_version}'s {patch.package_path} is not the patch's base "
                               "(made from a checkout?); sources not compared")
        return old_tree, None
    return old_tree, old_file


def _gpu_checks(patch, tree: SglangTree, target: Path, patched_text: str, old_tree, old_file) -> dict:
    """Verify the patched kernel against the new original, and time the new original against the old."""
    from astra.verify.runner import timeout_for

    try:
        spec = spec_mod.load(patch.spec)
    except AstraError as err:
        return {"run": False, "reason": f"not run: {err}"}
    rel = target.relative_to(tree.csrc_dir).as_posix()
    job = jobs.make_job(spec, tree, candidate_source=patched_text, label=patch.path.name, kernel_rel=rel)
    verdict = verify_job(job, timeout_s=timeout_for(job))
    out = {"run": True, "gpu": verdict.env.get("gpu"), "status": verdict.status,
           "reason": verdict.reason, "correct": verdict.correct,
           "band_speedups": verdict.band_speedups, "slower_shapes": verdict.slower_shapes,
           "speedups": [{"id": c.id, "mode": m, "speedup": t.speedup} for c in verdict.timed_cases()
                        for m, t in c.timings.items()]}
    out["sanitizer"] = patch_message.sanitizer_text(verdict)
    out["sanitizer_clean"] = patch_message.sanitizer_clean(verdict)
    decision = verified_faster(verdict)
    if verdict.status != "correct" or not verdict.correct:
        out["regression"] = f"the patched kernel fails on SGLang {tree.version}: {verdict.reason}"
    elif not decision.ok:
        out["regression"] = (f"the patched kernel is no longer verified faster than SGLang {tree.version}'s "
                             f"original: {decision.reason}")
    if old_file is None:
        out["upstream"] = {"run": False, "reason": "not run: the patch's base version is not available"}
    else:
        old_rel = old_file.relative_to(old_tree.csrc_dir).as_posix()
        old_v = versions.bench_original(spec, old_tree, old_rel)
        new_v = versions.bench_original(spec, tree, rel)
        out["upstream"] = {"run": True, "how": "each version's original in its own worker, same GPU; within ~2% "
                           "is noise", "shapes": versions.compare_medians(old_v, new_v)}
    return out
