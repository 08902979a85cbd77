"""Patch emission (astra.patch) on SGLang 0.5.23's real fused_add_rmsnorm.cuh with a small real edit.

The verdicts are SYNTHETIC (tests/astra/patch_helpers.py): CI has no GPU, so the numbers in these patches
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
from tests.astra import patch_helpers as h

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
    (dict(slow_case=3, slow_speedup=0.97), "slower on 1 shape(s)"),
    (dict(sanitizer_findings=2), "compute-sanitizer found 2 problem(s)"),
])
def test_refusals(sglang_0523, spec, tmp_path, verdict, needle):
    result = emit_patch(spec, sglang_0523, h.candidate(sglang_0523), h.synthetic_verdict(**verdict), tmp_path)
    assert result.repo_patch is None and result.package_patch is None
    assert needle in result.refused and "\n" not in result.refused
    assert not list(tmp_path.iterdir())


def test_small_slowdown_within_threshold_is_accepted():
    assert refusal(h.synthetic_verdict(slow_case=3, slow_speedup=0.985)) is None
    assert "slower on 1 shape(s)" in refusal(h.synthetic_verdict(slow_case=3, slow_speedup=0.985),
                                             slowdown_threshold=0.01)


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
