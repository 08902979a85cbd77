"""Shared by the patch / apply / recheck tests: a real candidate (SGLang 0.5.23's fused_add_rmsnorm.cuh with a
small real edit), a SYNTHETIC verdict for it, and git repositories built from the wheel's sources.

The verdict is synthetic because CI has no GPU: it is built with harness.judge.verdict's own classes over the
spec's real case list, so it has exactly the shape `harness.worker.judge_process.verify_job` returns, but its numbers
were not measured. Such patches exist only in the tests' temporary directories.
"""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

from astra.sglang.tree import SglangTree
from astra.spec import jobs
from astra.spec import model as spec_mod
from harness.judge.acceptance import slower_shapes
from harness.judge.verdict import CaseResult, ModeTiming, Verdict, band_speedups
from harness.timing.stats import Stats

KERNEL_REL = "elementwise/fused_add_rmsnorm.cuh"
REPO_PATH = "python/sglang/kernels/jit/csrc/elementwise/fused_add_rmsnorm.cuh"
# The edit: `weight` of the rms() helper becomes a const reference (the call passes v_weight[i], a
# non-const lvalue, so this compiles and changes nothing semantically). Lines ~43-45 of the file.
EDIT_OLD = "SGL_DEVICE packed_t rms(float2 valf, packed_t& weight, float rsqrt_square_sum) {"
EDIT_NEW = "SGL_DEVICE packed_t rms(float2 valf, const packed_t& weight, float rsqrt_square_sum) {"
# A second edit, next to `namespace sglang {` (line 15), a line 0.5.15 writes as `namespace {`.
NEAR_NS_OLD = "#include <type_traits>\n"
NEAR_NS_NEW = "#include <type_traits>\n#include <cstdint>\n"


def candidate(tree: SglangTree, old: str = EDIT_OLD, new: str = EDIT_NEW) -> str:
    text = (tree.csrc_dir / KERNEL_REL).read_text()
    assert text.count(old) == 1, f"the test's edit anchor is not unique in {tree.version}"
    return text.replace(old, new)


def synthetic_verdict(name: str = "fused_add_rmsnorm", *, status: str = "correct", slow_case: int | None = None,
                      slow_mode: str = "cold", slow_speedup: float = 0.97, sanitizer_findings: int = 0,
                      rel_stderr: float = 0.001, uniform: float | None = None, sanitizer: str = "clean") -> Verdict:
    """A Verdict shaped like verify_job's (SYNTHETIC numbers; see the module docstring).

    Decode shapes get x1.12 (graph) / x1.06 (cold), others x1.01; `slow_case` (an index into the timed
    cases) gets `slow_speedup` in `slow_mode`; `uniform` gives every timed shape that speedup instead.
    `sanitizer`: "clean" (memcheck and racecheck ran, nothing found), "none" (never run: an empty report, as
    with --no-sanitizer), "skipped" (compute-sanitizer missing), "partial" (memcheck ran, racecheck timed out)."""
    spec = spec_mod.load(name)
    case_list, _ = jobs.cases(spec)
    results, timed_index = [], 0
    for case in case_list:
        result = CaseResult(id=case.id, band=case.band, label=case.label, dtype=case.dtype, dims=dict(case.dims),
                            timed=case.timed, bytes=case.bytes, trials=4)
        result.reference = {"input": {"orig": 3.1e-3, "cand": 3.1e-3, "limit": 1.6e-2}}
        if case.timed:
            for mode, gain in (("graph", 1.12), ("cold", 1.06)):
                value = uniform if uniform is not None else gain if case.band == "decode" else 1.01
                if slow_case == timed_index and mode == slow_mode:
                    value = slow_speedup
                orig = 2.0 + case.bytes / 4.0e6
                result.timings[mode] = ModeTiming(
                    orig=Stats(orig, orig * 0.97, orig * 1.05, 200, 0.002),
                    cand=Stats(orig / value, orig / value * 0.97, orig / value * 1.05, 200, 0.002),
                    speedup=value, ratio_rel_stderr=rel_stderr)
                floor = case.bytes / 4.2e12 * 1e6
                result.roofline[mode] = {"floor_us": floor, "orig_fraction": floor / orig,
                                         "cand_fraction": floor * value / orig}
            timed_index += 1
        results.append(result)
    modes = ["graph", "cold"]
    verdict = Verdict(status="correct", reason="synthetic", correct=True, faster=True, name=name,
                      candidate_label="fused_add_rmsnorm.const_weight.cuh", cases=results,
                      band_speedups=band_speedups(results, modes), slower_shapes=slower_shapes(results, 0.02),
                      env={"gpu": "NVIDIA H200", "capability": "9.0", "driver": "570.124.06",
                           "cuda_runtime": "12.8", "nvcc": "13.0", "torch": "2.13.0", "tvm_ffi": "0.1.11",
                           "copy_bandwidth_Bps": 4.22e12})
    verdict.sanitizer = {"findings": [{"tool": "memcheck", "kind": "oob", "message": "Invalid __global__ read",
                                       "kernel": "k"}] * sanitizer_findings,
                         "ok": not sanitizer_findings, "skipped": None,
                         "runs": [{"tool": "memcheck"}, {"tool": "racecheck"}]}
    if sanitizer == "none":
        verdict.sanitizer = {}
    elif sanitizer == "skipped":
        verdict.sanitizer = {"findings": [], "ok": True, "runs": [],
                             "skipped": "compute-sanitizer not found on PATH or in $CUDA_HOME/bin"}
    elif sanitizer == "partial":
        verdict.sanitizer.update(runs=[{"tool": "memcheck"}], skipped="racecheck: timed out after 900 s")
    if status != "correct":
        verdict.status, verdict.correct, verdict.faster = status, False, False
        verdict.reason = "input: 12 of 4096 elements differ"
    return verdict


def git(cwd: Path, *args: str) -> str:
    proc = subprocess.run(["git", "-c", "user.name=T", "-c", "user.email=t@t", "-c", "commit.gpgsign=false", *args],
                          cwd=cwd, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    return proc.stdout


def sglang_repo(tree: SglangTree, dest: Path) -> Path:
    """A git repository in SGLang's layout (python/sglang/kernels/jit/{csrc,include}) from the wheel's sources."""
    jit = dest / "python" / "sglang" / "kernels" / "jit"
    jit.mkdir(parents=True)
    shutil.copytree(tree.csrc_dir, jit / "csrc")
    shutil.copytree(tree.include_dir, jit / "include")
    git(dest, "init", "-q")
    git(dest, "add", "-A")
    git(dest, "commit", "-q", "-m", f"SGLang {tree.version} JIT kernel sources")
    return dest


def package_tree(tree: SglangTree, dest: Path) -> Path:
    """An unpacked-package layout (sglang/kernels/jit/...) holding just the kernel file, not a git repository."""
    target = dest / "sglang" / "kernels" / "jit" / "csrc" / KERNEL_REL
    target.parent.mkdir(parents=True)
    (dest / "sglang" / "kernels" / "jit" / "include").mkdir()
    (dest / "sglang" / "__init__.py").write_text("")
    shutil.copyfile(tree.csrc_dir / KERNEL_REL, target)
    return dest


# ---- hostile patches: hunks that change a file the trailers do not name

EVIL_REL = "sglang/kernels/ops/layernorm/__init__.py"  # a Python file SGLang imports (package-relative)
EVIL_LINE = 'import os; os.system("touch /tmp/astra-pwned")'


def plain_hunk(path: str, *, create: bool = False) -> str:
    """A plain unified diff (no `diff --git` line) that `git apply` applies: it creates `path`, or adds
    EVIL_LINE at the top of an existing one-line `path` holding "x"."""
    if create:
        return f"--- /dev/null\n+++ b/{path}\n@@ -0,0 +1 @@\n+{EVIL_LINE}\n"
    return f"--- a/{path}\n+++ b/{path}\n@@ -1 +1,2 @@\n+{EVIL_LINE}\n x\n"


def with_message_diff(patch_text: str, diff: str) -> str:
    """`patch_text` with `diff` as the first lines of its commit message body (not indented)."""
    head, sep, body = patch_text.partition("\n\n")
    assert sep, "no message body"
    return head + sep + diff + "\n" + body


def add_evil_target(root: Path, prefix: str = "") -> Path:
    """The one-line file `plain_hunk` modifies, under `root` (`prefix` "python/" for a repo layout)."""
    evil = root / prefix / EVIL_REL
    evil.parent.mkdir(parents=True, exist_ok=True)
    evil.write_text("x\n")
    return evil


def snapshot(root: Path) -> dict[str, bytes]:
    """Every file under `root` (but .git) with its bytes: to show that a refused command changed nothing."""
    return {p.relative_to(root).as_posix(): p.read_bytes() for p in sorted(root.rglob("*"))
            if p.is_file() and ".git" not in p.relative_to(root).parts}
