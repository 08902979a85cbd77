"""`astra apply`: base-hash check, --force, --check, package layout, --installed, and bad patches
(exit codes in astra/apply_cmd.py). Patches carry SYNTHETIC verdicts (see tests/astra/patches/patch_helpers.py)."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from astra.patches.emit import emit_patch
from astra.spec import model as spec_mod
from tests.astra.patches import patch_helpers as h

pytestmark = pytest.mark.network  # the 0.5.23 wheel is downloaded on first use


def astra(*args, env=None):
    proc = subprocess.run([sys.executable, "-m", "astra.cli", *args], capture_output=True, text=True, env=env)
    return proc.returncode, proc.stdout, proc.stderr


def one_line(err: str, needle: str) -> None:
    assert "Traceback" not in err and needle in err, err
    assert len(err.strip().splitlines()) == 1, err


@pytest.fixture(scope="module")
def patches(sglang_0523, tmp_path_factory):
    result = emit_patch(spec_mod.load("fused_add_rmsnorm"), sglang_0523, h.candidate(sglang_0523),
                        h.synthetic_verdict(), tmp_path_factory.mktemp("patches"))
    assert result.refused is None
    return result


@pytest.fixture
def repo(sglang_0523, tmp_path):
    return h.sglang_repo(sglang_0523, tmp_path / "sglang")


def test_apply_check_then_apply_then_again(patches, repo, sglang_0523):
    target = repo / h.REPO_PATH
    original = target.read_text()
    code, out, err = astra("apply", str(patches.repo_patch), "--sglang-src", str(repo), "--check")
    assert code == 0 and "applies cleanly" in out, err
    assert target.read_text() == original
    code, out, err = astra("apply", str(patches.repo_patch), "--sglang-src", str(repo))
    assert code == 0 and "matches Astra-Patched-SHA256" in out, err
    assert target.read_text() == h.candidate(sglang_0523)
    code, out, _ = astra("apply", str(patches.repo_patch), "--sglang-src", str(repo))
    assert code == 0 and "already is the patched version" in out


def test_hash_mismatch_refused_unless_forced(patches, repo, sglang_0523):
    target = repo / h.REPO_PATH
    target.write_text(target.read_text() + "// a local edit\n")
    code, _, err = astra("apply", str(patches.repo_patch), "--sglang-src", str(repo))
    assert code == 8
    one_line(err, "the patch was made for (edited, or another version)")
    assert "--force" in err
    code, out, err = astra("apply", str(patches.repo_patch), "--sglang-src", str(repo), "--force")
    assert code == 0 and "--force" in out, err
    assert target.read_text() == h.candidate(sglang_0523) + "// a local edit\n"


def test_package_layout_and_installed(patches, sglang_0523, tmp_path):
    root = h.package_tree(sglang_0523, tmp_path / "site")
    code, out, err = astra("apply", str(patches.package_patch), "--sglang-src", str(root), "--check")
    assert code == 0, err
    env = {**os.environ, "PYTHONPATH": str(root)}  # the fake package is what `import sglang` would find
    code, out, err = astra("apply", str(patches.repo_patch), "--installed", env=env)  # repo layout: -p2
    assert code == 0 and "matches Astra-Patched-SHA256" in out, err
    assert (root / "sglang/kernels/jit/csrc" / h.KERNEL_REL).read_text() == h.candidate(sglang_0523)


def test_truncated_patch(patches, repo, tmp_path):
    text = patches.repo_patch.read_text().splitlines(keepends=True)
    for name, keep in (("cut_in_diff.patch", text[:-6]), ("cut_in_message.patch", text[:20])):
        bad = tmp_path / name
        bad.write_text("".join(keep))
        code, _, err = astra("apply", str(bad), "--sglang-src", str(repo))
        assert code == 9
        one_line(err, "corrupt patch")


def test_not_an_astra_patch(repo, tmp_path):
    target = repo / h.REPO_PATH
    target.write_text(target.read_text().replace("namespace sglang {", "namespace sglang {  // x"))
    plain = tmp_path / "plain.patch"
    plain.write_text(h.git(repo, "diff"))
    code, _, err = astra("apply", str(plain), "--sglang-src", str(repo))
    assert code == 9
    one_line(err, "not an Astra patch")


def test_patch_for_another_kernel(patches, repo, tmp_path):
    """A diff for rmsnorm.cuh under fused_add_rmsnorm's trailers: refused before anything is touched."""
    other = "python/sglang/kernels/jit/csrc/elementwise/rmsnorm.cuh"
    bad = tmp_path / "other.patch"
    bad.write_text(patches.repo_patch.read_text().replace(f"a/{h.REPO_PATH}", f"a/{other}")
                   .replace(f"b/{h.REPO_PATH}", f"b/{other}"))
    code, _, err = astra("apply", str(bad), "--sglang-src", str(repo))
    assert code == 9
    one_line(err, f"its trailers name {h.REPO_PATH} but its diff changes {other}")


def test_kernel_missing_from_tree(patches, sglang_0510):
    """0.5.23's patch on 0.5.10 (the old sglang/jit_kernel layout): the file is elsewhere; exit 2."""
    code, _, err = astra("apply", str(patches.repo_patch), "--sglang-src", str(sglang_0510.root), "--check")
    assert code == 2
    one_line(err, "this tree has it at sglang/jit_kernel/csrc/elementwise/fused_add_rmsnorm.cuh")
    assert "astra recheck" in err


def test_not_a_tree_and_nothing_installed(patches, tmp_path):
    code, _, err = astra("apply", str(patches.repo_patch), "--sglang-src", str(tmp_path))
    assert code == 3
    one_line(err, "not an SGLang tree")
    code, _, err = astra("apply", str(patches.repo_patch), "--installed",
                         env={**os.environ, "PYTHONPATH": str(tmp_path)})
    if code == 3:  # (a machine with sglang installed would find it)
        one_line(err, "no sglang package")


# ---- patches change only what they name (docs/threat-model.md)


def refused_unchanged(patch, root, needle, *args):
    """`astra apply` (and --check) of `patch` in `root` exits 9 with one line holding `needle`; nothing changes."""
    before = h.snapshot(root)
    for extra in (("--check",), ()):
        code, out, err = astra("apply", str(patch), "--sglang-src", str(root), *extra, *args)
        assert code == 9, (out, err)
        one_line(err, needle)
    assert h.snapshot(root) == before


@pytest.mark.parametrize("create", [False, True])
def test_smuggled_plain_hunk_refused(patches, repo, tmp_path, create):
    """A plain `---/+++/@@` hunk appended after the signature: plain `git apply` WOULD run it (shown in a
    throw-away copy), `astra apply` refuses it and names the extra path; the tree is unchanged."""
    h.add_evil_target(repo, "python/")
    h.git(repo, "add", "-A")
    h.git(repo, "commit", "-q", "-m", "the file the hunk attacks")
    evil = f"python/{h.EVIL_REL}"
    bad = tmp_path / "smuggled.patch"
    bad.write_text(patches.repo_patch.read_text() + h.plain_hunk(evil, create=create))
    if not create:
        victim = tmp_path / "victim"
        h.git(tmp_path, "clone", "-q", str(repo), str(victim))
        h.git(victim, "apply", str(bad))
        assert h.EVIL_LINE in (victim / evil).read_text()  # the attack is real for plain git
    refused_unchanged(bad, repo, evil)
    refused_unchanged(bad, repo, evil, "--force")
    assert h.git(repo, "status", "--porcelain") == ""


def test_smuggled_hunk_in_package_layout(patches, sglang_0523, tmp_path):
    root = h.package_tree(sglang_0523, tmp_path / "site")
    h.add_evil_target(root)
    bad = tmp_path / "smuggled.package.patch"
    bad.write_text(patches.package_patch.read_text() + h.plain_hunk(h.EVIL_REL))
    refused_unchanged(bad, root, h.EVIL_REL)


def test_diff_in_message_body_refused(patches, repo, tmp_path):
    """An unindented unified diff inside the commit message: git apply reads it as a patch too."""
    evil = f"python/{h.EVIL_REL}"
    bad = tmp_path / "body.patch"
    bad.write_text(h.with_message_diff(patches.repo_patch.read_text(), h.plain_hunk(evil, create=True)))
    refused_unchanged(bad, repo, evil)
    # the same, aimed at the kernel file itself: two diffs of one file, one outside `diff --git`
    twice = tmp_path / "twice.patch"
    twice.write_text(h.with_message_diff(patches.repo_patch.read_text(),
                                         f"--- a/{h.REPO_PATH}\n+++ b/{h.REPO_PATH}\n@@ -1 +1 @@\n-x\n+y\n"))
    refused_unchanged(twice, repo, "separate diffs")


def test_context_diff_after_the_diff_refused(patches, repo, tmp_path):
    """A context diff (GNU patch reads it, git does not) appended after the signature."""
    bad = tmp_path / "ctx.patch"
    bad.write_text(patches.repo_patch.read_text() + "*** a/evil.py\n--- b/evil.py\n***************\n*** 1 ****\n"
                   "! x\n--- 1 ----\n! y\n")
    refused_unchanged(bad, repo, "after its signature, starts a patch")


def _binary_section(tmp_path) -> str:
    work = tmp_path / "bin"
    work.mkdir()
    h.git(work, "init", "-q")
    (work / "python").mkdir()
    (work / "python" / "blob.so").write_bytes(bytes(range(256)))
    h.git(work, "add", "-A")
    h.git(work, "commit", "-q", "-m", "blob")
    text = h.git(work, "format-patch", "-1", "--stdout", "--binary")
    return text[text.index("diff --git"):]


def test_rename_mode_new_file_binary_refused(patches, repo, tmp_path):
    text = patches.repo_patch.read_text()
    header = f"diff --git a/{h.REPO_PATH} b/{h.REPO_PATH}\n"
    other = "python/sglang/kernels/jit/csrc/elementwise/rmsnorm_old.cuh"
    cases = {
        "mode": (text.replace(header, header + "old mode 100644\nnew mode 100755\n"), "mode change 100644 => 100755"),
        "rename": (text.replace(header, f"diff --git a/{other} b/{h.REPO_PATH}\nsimilarity index 95%\n"
                                        f"rename from {other}\nrename to {h.REPO_PATH}\n")
                   .replace(f"--- a/{h.REPO_PATH}", f"--- a/{other}"), "rmsnorm_old.cuh"),
        "new_file": (text + "diff --git a/python/sglang/new.py b/python/sglang/new.py\nnew file mode 100644\n"
                     "index 0000000..e69de29\n", "python/sglang/new.py"),
        "dev_null": (text + h.plain_hunk("python/sglang/created.py", create=True), "python/sglang/created.py"),
        "binary": (text + _binary_section(tmp_path), "python/blob.so"),
    }
    for name, (bad_text, needle) in cases.items():
        bad = tmp_path / f"{name}.patch"
        bad.write_text(bad_text)
        refused_unchanged(bad, repo, needle)
