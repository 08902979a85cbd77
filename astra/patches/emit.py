"""Emitting a verified candidate as a patch that drops into SGLang (`git format-patch` form).

`emit_patch` writes two files with the same change and the same message:
  - `<name>-sglang-<version>-<sha8>.patch`: paths of the SGLang git repository (`python/sglang/...`),
    for `git am` / `git apply` in a checkout;
  - `<name>-sglang-<version>-<sha8>.package.patch`: paths of an installed package (`sglang/...`),
    for `git apply` (or `patch -p1`) in site-packages.
Both are made by the real git CLI in a throw-away repository. The message (astra.patch_message) carries
the per-shape evidence and the trailers `astra apply` and `astra recheck` read.

A patch is refused (no files, a one-line reason) unless the verdict shows the candidate verified faster
by the one acceptance rule (`harness.judge.acceptance.verified_faster`: correct, sanitizer clean, no shape
slower beyond noise, a band faster beyond its noise band), the candidate differs from the original, the
verdict names this kernel, and compute-sanitizer ran cleanly (some tool ran, nothing skipped, no
findings) — unless the caller passes `sanitizer_required=False` (`astra patch --no-sanitizer`, or an optimize
run with --no-sanitizer): then the message says "compute-sanitizer: not run (--no-sanitizer)" and carries
the trailer `Astra-Sanitizer: skipped`. Findings refuse a patch always.

After writing, both files are read back by `patchfile.parse` (the reader `astra apply` uses): git must see
exactly one change, to the kernel file (`git apply --numstat`/`--summary`); else both files are removed and
NotAnAstraPatch (exit 9) says what else the patch would have changed.
`astra patch NAME --candidate FILE --verdict VERDICT.json` exits 0 when it wrote both files, 1 when refused.
"""

from __future__ import annotations

import hashlib
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path

from astra.errors import AstraError, BadInput, NotAnAstraPatch
from astra.patches import message as patch_message
from astra.patches import patchfile
from astra.patches.patchfile import git_exe
from astra.sglang.tree import SglangTree, sha256_file
from astra.spec.model import KernelSpec
from astra.verify.runner import SCREEN_NOTE
from harness import Verdict, verified_faster
from harness.judge.acceptance import SLOWDOWN_THRESHOLD

_GIT_CONFIG = ["-c", "commit.gpgsign=false", "-c", "core.hooksPath=/dev/null", "-c", "core.autocrlf=false"]
MAX_SLOWDOWN_THRESHOLD = 0.10  # `--threshold`: a shape may be at most this much slower (beyond noise): 0 to 10%


def check_threshold(value: object) -> float:
    """The slowdown threshold if it is a number from 0 to MAX_SLOWDOWN_THRESHOLD, else BadInput (exit 12): NaN
    would compare false and let every slower shape through, a negative or large one would gut the rule."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 <= value <= MAX_SLOWDOWN_THRESHOLD:
        raise BadInput(f"--threshold {value}: give the slowdown a shape may have, from 0 to "
                       f"{MAX_SLOWDOWN_THRESHOLD:g} ({100 * MAX_SLOWDOWN_THRESHOLD:g}%; default "
                       f"{SLOWDOWN_THRESHOLD:g})")
    return float(value)


@dataclass
class PatchResult:
    repo_patch: Path | None
    package_patch: Path | None
    refused: str | None = None


def refusal(verdict: Verdict, *, spec_name: str | None = None, slowdown_threshold: float = SLOWDOWN_THRESHOLD,
            sanitizer_required: bool = True) -> str | None:
    """Why this verdict does not support a patch (one line), or None: the one acceptance rule
    (`harness.judge.acceptance.verified_faster`), plus that the verdict names this kernel and that
    compute-sanitizer ran cleanly (unless `sanitizer_required` is False)."""
    check_threshold(slowdown_threshold)
    if spec_name and verdict.name and verdict.name != spec_name:
        return f"the verdict is for kernel {verdict.name!r}, not {spec_name!r}"
    if SCREEN_NOTE in (verdict.notes or []):
        return f"{SCREEN_NOTE}; run `astra check` without --quick first"
    findings = verdict.sanitizer.get("findings") or []
    if findings:
        first = findings[0]
        return f"compute-sanitizer found {len(findings)} problem(s); first: {first.get('tool')}: {first.get('message')}"
    decision = verified_faster(verdict, threshold=slowdown_threshold)
    if not decision.ok:
        return decision.reason
    if sanitizer_required and not patch_message.sanitizer_clean(verdict):
        report = verdict.sanitizer or {}
        why = ("it was not run" if not report.get("runs")
               else f"it did not run cleanly ({report.get('skipped')})")
        return (f"compute-sanitizer did not check this candidate: {why}; check it again with the sanitizer, "
                "or pass --no-sanitizer to emit the patch without it (the patch then says so)")
    return None


def emit_patch(spec: KernelSpec, tree: SglangTree, candidate_text: str, verdict: Verdict, out_dir: Path, *,
               slowdown_threshold: float = SLOWDOWN_THRESHOLD, why: str | None = None,
               sanitizer_required: bool = True) -> PatchResult:
    """Write the repo-layout and package-layout patches for a verified candidate, or say why not."""
    reason = refusal(verdict, spec_name=spec.name, slowdown_threshold=slowdown_threshold,
                     sanitizer_required=sanitizer_required)
    original_path = tree.csrc_dir / spec.kernel_file
    if not original_path.is_file():
        raise AstraError(f"{spec.kernel_file} is not in {tree.describe()}; give the tree the candidate was "
                         "checked against (--sglang VERSION or --sglang-src PATH)")
    original = original_path.read_bytes()
    patched = candidate_text.encode("utf-8")
    if reason is None and patched == original:
        reason = "the candidate is identical to the original file"
    if reason is not None:
        return PatchResult(None, None, refused=reason)
    repo_path, package_path = tree.repo_path(original_path), tree.package_path(original_path)
    base_sha, patched_sha = sha256_file(original_path), hashlib.sha256(patched).hexdigest()
    label = verdict.candidate_label or "candidate"
    text = patch_message.message(
        spec_name=spec.name, verdict=verdict,
        why=why or f"Replace {spec.kernel_file} with the verified candidate `{label}`.",
        repo_path=repo_path, package_path=package_path, base_sha=base_sha, patched_sha=patched_sha,
        sglang_version=tree.version, tolerance=spec.raw.get("tolerance") or {},
        sanitizer_required=sanitizer_required)
    repo_text, package_text = _format_patch(repo_path, original, patched, text)
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    stem = f"{spec.name}-sglang-{tree.version}-{patched_sha[:8]}"
    repo_patch, package_patch = out_dir / f"{stem}.patch", out_dir / f"{stem}.package.patch"
    repo_patch.write_text(repo_text)
    package_patch.write_text(package_text)
    _check_written(repo_patch, package_patch, repo_path, package_path)
    return PatchResult(repo_patch, package_patch)


def _check_written(repo_patch: Path, package_patch: Path, repo_path: str, package_path: str) -> None:
    """Read both files back as `astra apply` would: each changes exactly its kernel file, nothing else.
    On any failure both files are removed and NotAnAstraPatch says why."""
    try:
        for file, layout, path in ((repo_patch, "repo", repo_path), (package_patch, "package", package_path)):
            parsed = patchfile.parse(file)
            if parsed.layout != layout or parsed.diff_path != path:
                raise NotAnAstraPatch(f"{file}: the emitted patch changes {parsed.diff_path}, not {path}")
    except NotAnAstraPatch as err:
        repo_patch.unlink(missing_ok=True)
        package_patch.unlink(missing_ok=True)
        raise NotAnAstraPatch(f"refused to emit a patch that fails Astra's own check (removed): {err}") from None


def _git(repo: Path, *args: str) -> str:
    proc = subprocess.run([git_exe(), *_GIT_CONFIG, *args], cwd=repo, capture_output=True, text=True)
    if proc.returncode != 0:
        raise AstraError(f"git {args[0]} failed while making the patch: {proc.stderr.strip()[:300]}")
    return proc.stdout


def _format_patch(repo_path: str, original: bytes, patched: bytes, message: str) -> tuple[str, str]:
    """(repo-layout patch, package-layout patch) of one commit made in a throw-away repository."""
    with tempfile.TemporaryDirectory(prefix="astra-patch-") as tmp:
        repo = Path(tmp)
        _git(repo, "init", "-q")
        if not _configured(repo, "user.name") or not _configured(repo, "user.email"):
            _git(repo, "config", "user.name", "Astra")
            _git(repo, "config", "user.email", "astra@localhost")
        target = repo / repo_path
        target.parent.mkdir(parents=True)
        target.write_bytes(original)
        _git(repo, "add", repo_path)
        _git(repo, "commit", "-q", "-m", f"SGLang original of {repo_path}")
        target.write_bytes(patched)
        (repo / ".astra-message").write_text(message)
        _git(repo, "commit", "-q", "--cleanup=verbatim", "-F", ".astra-message", "--", repo_path)
        # Explicit options, so a user's git configuration (diff.noprefix, diff.context, ...) cannot change the form.
        form = ["format-patch", "-1", "--stdout", "--no-color", "-U3", "--src-prefix=a/", "--dst-prefix=b/"]
        repo_text = _git(repo, *form)
        package_text = _git(repo, *form, "--relative=python")
    return repo_text, package_text


def _configured(repo: Path, key: str) -> bool:
    proc = subprocess.run([git_exe(), "config", "--get", key], cwd=repo, capture_output=True, text=True)
    return proc.returncode == 0 and bool(proc.stdout.strip())
