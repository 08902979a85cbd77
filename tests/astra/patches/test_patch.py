"""Patch emission (astra.patch) on SGLang 0.5.23's real fused_add_rmsnorm.cuh with a small real edit.

The verdicts are SYNTHETIC (tests/astra/patches/patch_helpers.py): CI has no GPU, so the numbers in these patches
were not measured; they only exercise the format and the refusal rules.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys

import pytest

from astra.patches.emit import emit_patch, refusal
from astra.sglang.tree import sha256_file
from astra.spec import model as spec_mod
from tests.astra.patches import patch_helpers as h

pytestmark = pytest.mark.network  # the 0.5.23 wheel is downloaded on first use


@pytest.fixture(scope="module")
def spec():
    return spec_mod.load("fused_add_rmsnorm")


@pytest.fixture(scope="module")
def emitted(sglang_0523, spec, tmp_path_factory):
    out = tmp_path_factory.mktemp("patches")
    return emit_patch(spec, sglang_0523, h.candidate(sglang_0523), h.synthetic_verdict(), out,
                      why="Take `weight` by const reference in rms().")


@pytest.fixture(scope="module")
def patched_repo(sglang_0523, emitted, tmp_path_factory):
    """A git repository in SGLang's layout with the repo patch applied by plain `git apply`."""
    repo = h.sglang_repo(sglang_0523, tmp_path_factory.mktemp("sglang"))
    proc = subprocess.run(["git", "apply", str(emitted.repo_patch)], cwd=repo, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    return repo


def trailers(text: str) -> dict[str, str]:
    return dict(re.findall(r"^(Astra-[\w-]+): (.+)$", text, re.M))


def test_patch_message_and_trailers(emitted, sglang_0523):
    assert emitted.refused is None
    text = emitted.repo_patch.read_text()
    assert text.startswith("From ")
    assert re.search(r"^Subject: \[PATCH\] \[Perf\] Speed up fused_add_rmsnorm JIT kernel \(decode 1\.12x,\s+H200\)",
                     text, re.M)
    assert "Take `weight` by const reference in rms()." in text
    assert "Measured on NVIDIA H200 (sm 9.0), driver 570.124.06, CUDA runtime 12.8" in text and "SGLang 0.5.23" in text
    assert "| shape | band | original us | patched us | speedup | % of roofline (orig -> patched) |" in text
    assert "Timing mode `graph`" in text and "Timing mode `cold`" in text
    assert "| Llama-3.1-8B/tp1 bfloat16 tokens=1, hidden=4096 | decode |" in text
    assert "tolerance float16: atol 0.002" in text and "compute-sanitizer (memcheck, racecheck): no findings" in text
    original = sglang_0523.csrc_dir / h.KERNEL_REL
    assert trailers(text) == {
        "Astra-Spec": "fused_add_rmsnorm", "Astra-Kernel-File": h.REPO_PATH,
        "Astra-Package-File": h.REPO_PATH.removeprefix("python/"),
        "Astra-Base-SHA256": sha256_file(original),
        "Astra-Patched-SHA256": __import__("hashlib").sha256(h.candidate(sglang_0523).encode()).hexdigest(),
        "Astra-SGLang-Version": "0.5.23", "Astra-GPU": "NVIDIA H200"}
    assert f"diff --git a/{h.REPO_PATH} b/{h.REPO_PATH}" in text
    package = emitted.package_patch.read_text()
    package_path = h.REPO_PATH.removeprefix("python/")
    assert f"diff --git a/{package_path} b/{package_path}" in package and trailers(package) == trailers(text)


def test_repo_patch_applies_with_plain_git(patched_repo, sglang_0523):
    patched = patched_repo / h.REPO_PATH
    assert patched.read_text() == h.candidate(sglang_0523)
    status = h.git(patched_repo, "status", "--porcelain")
    assert status.strip() == f"M {h.REPO_PATH}"


def test_package_patch_applies_with_plain_git(emitted, sglang_0523, tmp_path):
    root = h.package_tree(sglang_0523, tmp_path)
    proc = subprocess.run(["git", "apply", str(emitted.package_patch)], cwd=root, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    assert (root / "sglang/kernels/jit/csrc" / h.KERNEL_REL).read_text() == h.candidate(sglang_0523)


@pytest.mark.skipif(not (shutil.which("nvcc") or os.path.exists("/usr/local/cuda/bin/nvcc")), reason="needs nvcc")
def test_patched_tree_builds(patched_repo):
    proc = subprocess.run([sys.executable, "-m", "astra.cli", "build", "fused_add_rmsnorm", "--sglang-src",
                           str(patched_repo), "--variant", "0"], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "sm_90a: ok" in proc.stdout


@pytest.mark.gpu
def test_patched_tree_passes_check(patched_repo, tmp_path):
    """On a GPU: the file `git apply` produced, checked against 0.5.23's original by `astra check`
    (every shape and dtype, sanitizer on); exit 0 means verified correct."""
    out = tmp_path / "check.json"
    proc = subprocess.run([sys.executable, "-m", "astra.cli", "check", "fused_add_rmsnorm", "--sglang", "0.5.23",
                           "--candidate", str(patched_repo / h.REPO_PATH), "--json", str(out)],
                          capture_output=True, text=True)
    print(proc.stdout[-1500:])
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-2000:]
    verdict = json.loads(out.read_text())
    assert verdict["status"] == "correct" and verdict["correct"] is True
    assert verdict["sanitizer"]["ok"], verdict["sanitizer"]


@pytest.mark.parametrize("verdict, needle", [
    (dict(status="incorrect"), "not verified: incorrect"),
    (dict(slow_case=3, slow_speedup=0.97, slow_mode="graph"), "slower on 1 shape(s)"),
    (dict(slow_case=3, slow_speedup=0.93, slow_mode="cold"), "slower on 1 shape(s)"),
    (dict(sanitizer_findings=2), "compute-sanitizer found 2 problem(s)"),
])
def test_refusals(sglang_0523, spec, tmp_path, verdict, needle):
    result = emit_patch(spec, sglang_0523, h.candidate(sglang_0523), h.synthetic_verdict(**verdict), tmp_path)
    assert result.repo_patch is None and result.package_patch is None
    assert needle in result.refused and "\n" not in result.refused
    assert not list(tmp_path.iterdir())


def test_small_slowdown_within_threshold_is_accepted():
    assert refusal(h.synthetic_verdict(slow_case=3, slow_speedup=0.985, slow_mode="graph")) is None
    assert "slower on 1 shape(s)" in refusal(h.synthetic_verdict(slow_case=3, slow_speedup=0.985, slow_mode="graph"),
                                             slowdown_threshold=0.01)
    assert refusal(h.synthetic_verdict(slow_case=3, slow_speedup=0.97, slow_mode="cold")) is None  # the cold floor


def test_identical_candidate_and_wrong_kernel_refused(sglang_0523, spec, tmp_path):
    same = (sglang_0523.csrc_dir / h.KERNEL_REL).read_text()
    assert "identical" in emit_patch(spec, sglang_0523, same, h.synthetic_verdict(), tmp_path).refused
    other = h.synthetic_verdict()
    other.name = "rmsnorm"
    assert "for kernel 'rmsnorm'" in refusal(other, spec_name="fused_add_rmsnorm")


def test_patch_command(sglang_0523, tmp_path):
    candidate, verdict = tmp_path / "cand.cuh", tmp_path / "verdict.json"
    candidate.write_text(h.candidate(sglang_0523))
    verdict.write_text(h.synthetic_verdict().to_json())
    cmd = [sys.executable, "-m", "astra.cli", "patch", "fused_add_rmsnorm", "--candidate", str(candidate),
           "--verdict", str(verdict), "--out", str(tmp_path / "out")]
    proc = subprocess.run(cmd, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    assert len(list((tmp_path / "out").glob("*.patch"))) == 2
    verdict.write_text(h.synthetic_verdict(status="incorrect").to_json())
    proc = subprocess.run(cmd, capture_output=True, text=True)
    assert proc.returncode == 1 and proc.stdout.startswith("no patch: not verified: incorrect")


# ---- free text cannot smuggle a patch; the emitter checks what it wrote


HOSTILE_WHY = ("Fuse the loads.\n" + h.plain_hunk(f"python/{h.EVIL_REL}", create=True)
               + f"diff --git a/python/{h.EVIL_REL} b/python/{h.EVIL_REL}\n"
               + h.plain_hunk(f"python/{h.EVIL_REL}")
               + "From 0000000000000000000000000000000000000000 Mon Sep 17 00:00:00 2001\nSubject: [PATCH] evil\n"
               + "Index: evil.py\nAstra-Kernel-File: python/sglang/evil.cuh\n"
               + "bell\x07 escape\x1b[31m rtl\u202e cr\rsplit ls\u2028split nel\x85split\ttab")


@pytest.fixture(scope="module")
def hostile(sglang_0523, spec, tmp_path_factory):
    return emit_patch(spec, sglang_0523, h.candidate(sglang_0523), h.synthetic_verdict(),
                      tmp_path_factory.mktemp("hostile"), why=HOSTILE_WHY)


def test_hostile_why_is_inert(hostile, sglang_0523, tmp_path):
    """A `why` holding whole unified diffs (as an LLM plan could): indented, so git sees only the kernel file."""
    for patch, path in ((hostile.repo_patch, h.REPO_PATH), (hostile.package_patch, h.REPO_PATH[len("python/"):])):
        proc = subprocess.run(["git", "apply", "--numstat", str(patch)], cwd=tmp_path, capture_output=True, text=True)
        assert proc.returncode == 0 and proc.stdout.splitlines() == [f"1\t1\t{path}"], proc.stdout + proc.stderr
        proc = subprocess.run(["git", "apply", "--summary", str(patch)], cwd=tmp_path, capture_output=True, text=True)
        assert proc.stdout.strip() == ""
    text = hostile.repo_patch.read_text()
    assert f"    +++ b/python/{h.EVIL_REL}" in text and "    From 0000000" in text and "    Subject: [PATCH] evil" in text
    assert not re.search(r"[\x00-\x08\x0b-\x1f\x7f-\x9f\u202e\u2028]", text)
    assert "    bell escape[31m rtl cr\n    split ls\n    split nel\n    split   tab\n" in text
    assert trailers(text)["Astra-Kernel-File"] == h.REPO_PATH and "python/sglang/evil.cuh" not in trailers(text).values()
    for line in text[: text.index("\n---\n")].splitlines()[6:]:
        assert not re.match(r"(diff |--- |\+\+\+ |@@ |Index: |From |Subject:)", line), line


def test_hostile_why_applies_only_the_kernel(hostile, sglang_0523, tmp_path):
    """Plain `git apply` and `git am` (mailinfo + apply) of it change the kernel file and nothing else."""
    repo = h.sglang_repo(sglang_0523, tmp_path / "apply")
    h.git(repo, "apply", str(hostile.repo_patch))
    assert h.git(repo, "status", "--porcelain").strip() == f"M {h.REPO_PATH}"
    repo = h.sglang_repo(sglang_0523, tmp_path / "am")
    h.git(repo, "am", "-q", str(hostile.repo_patch))
    assert h.git(repo, "show", "--name-only", "--format=", "HEAD").split() == [h.REPO_PATH]
    assert "    +++ b/python/" in h.git(repo, "log", "-1", "--format=%B")
    code = subprocess.run([sys.executable, "-m", "astra.cli", "apply", str(hostile.repo_patch), "--sglang-src",
                           str(h.sglang_repo(sglang_0523, tmp_path / "astra")), "--check"], capture_output=True)
    assert code.returncode == 0, code.stderr


def test_emitter_checks_what_it_wrote(sglang_0523, spec, tmp_path, monkeypatch):
    """With the escaping switched off, the emitter's own `git apply --numstat` check refuses and removes."""
    from astra.errors import NotAnAstraPatch
    from astra.patches import scope

    monkeypatch.setattr(scope, "free_text", lambda text: str(text).splitlines())
    monkeypatch.setattr(scope, "guard", lambda lines: lines)
    with pytest.raises(NotAnAstraPatch, match=f"python/{h.EVIL_REL}") as err:
        emit_patch(spec, sglang_0523, h.candidate(sglang_0523), h.synthetic_verdict(), tmp_path / "out",
                   why="Fuse.\n" + h.plain_hunk(f"python/{h.EVIL_REL}", create=True))
    assert "\n" not in str(err.value) and not list((tmp_path / "out").iterdir())


# ---- the sanitizer does not fail open


@pytest.mark.parametrize("sanitizer", ["none", "skipped", "partial"])
def test_refused_without_a_clean_sanitizer_run(sglang_0523, spec, tmp_path, sanitizer):
    verdict = h.synthetic_verdict(sanitizer=sanitizer)
    result = emit_patch(spec, sglang_0523, h.candidate(sglang_0523), verdict, tmp_path / "req")
    assert result.repo_patch is None and "compute-sanitizer did not check this candidate" in result.refused
    assert "--no-sanitizer" in result.refused and "\n" not in result.refused
    result = emit_patch(spec, sglang_0523, h.candidate(sglang_0523), verdict, tmp_path / "opt",
                        sanitizer_required=False)
    text = result.repo_patch.read_text()
    assert "- compute-sanitizer: not run (--no-sanitizer)" in text
    assert trailers(text)["Astra-Sanitizer"] == "skipped"


def test_findings_refused_even_with_no_sanitizer(sglang_0523, spec, tmp_path):
    result = emit_patch(spec, sglang_0523, h.candidate(sglang_0523), h.synthetic_verdict(sanitizer_findings=1),
                        tmp_path, sanitizer_required=False)
    assert result.repo_patch is None and "compute-sanitizer found 1 problem(s)" in result.refused


def test_patch_command_no_sanitizer(sglang_0523, tmp_path):
    candidate, verdict = tmp_path / "cand.cuh", tmp_path / "verdict.json"
    candidate.write_text(h.candidate(sglang_0523))
    verdict.write_text(h.synthetic_verdict(sanitizer="none").to_json())
    cmd = [sys.executable, "-m", "astra.cli", "patch", "fused_add_rmsnorm", "--candidate", str(candidate),
           "--verdict", str(verdict), "--out", str(tmp_path / "out")]
    proc = subprocess.run(cmd, capture_output=True, text=True)
    assert proc.returncode == 1 and proc.stdout.startswith("no patch: compute-sanitizer did not check")
    proc = subprocess.run(cmd + ["--no-sanitizer"], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    (patch,) = [p for p in (tmp_path / "out").glob("*.patch") if not p.name.endswith(".package.patch")]
    assert "Astra-Sanitizer: skipped" in patch.read_text()


def test_optimize_patch_step_follows_the_runs_sanitizer_option(sglang_0523, spec):
    from astra.optimize.driver import emit_best_patch
    from astra.optimize.rundir import RunDir

    source = (sglang_0523.csrc_dir / spec.kernel_file).read_text()
    run = RunDir.create(spec.name, sglang_0523.version, "offline", source)
    n = run.add_candidate(h.candidate(sglang_0523), {"description": "const weight\n--- a/x\n+++ b/x"})
    run.save_verdict(n, h.synthetic_verdict(sanitizer="none"))
    state = run.state()
    state.best = n
    run.save(state)
    message = emit_best_patch(run, spec, sglang_0523)
    assert message.startswith("patch: not emitted: compute-sanitizer did not check")
    message = emit_best_patch(run, spec, sglang_0523, sanitizer_required=False)
    assert message.startswith("patch: "), message
    (patch,) = [p for p in (run.root / "patches").glob("*.patch") if not p.name.endswith(".package.patch")]
    text = patch.read_text()
    assert "compute-sanitizer: not run (--no-sanitizer)" in text and "    +++ b/x" in text
