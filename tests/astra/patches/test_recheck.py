"""`astra recheck` and `astra diff-versions` on real SGLang version pairs.

fused_add_rmsnorm.cuh is byte-identical in 0.5.20 and 0.5.23; 0.5.15 has it under the old
`sglang/jit_kernel/` layout with two lines changed (`namespace {` for `namespace sglang {`); 0.5.10 also
changed the lines the test's edit touches. Patches carry SYNTHETIC verdicts (tests/astra/patches/patch_helpers.py).
Without a GPU (or with CUDA hidden, as here) the GPU parts must say "not run: no CUDA GPU", and the
patch could not be verified (exit 11) unless `--no-gpu` accepts a source-only recheck.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from astra.errors import NotAnAstraPatch, SglangNotFound
from astra.patches import recheck, versions
from astra.patches.emit import emit_patch
from astra.report import recheck_md as recheck_report
from astra.sglang.tree import from_wheel
from astra.spec import model as spec_mod
from tests.astra.patches import patch_helpers as h

pytestmark = pytest.mark.network  # 0.5.15 and 0.5.20 are downloaded on first use
NO_CUDA = {**os.environ, "CUDA_VISIBLE_DEVICES": ""}
OLD_PATH = "sglang/jit_kernel/csrc/elementwise/fused_add_rmsnorm.cuh"


def astra(*args):
    proc = subprocess.run([sys.executable, "-m", "astra.cli", *args], capture_output=True, text=True, env=NO_CUDA)
    return proc.returncode, proc.stdout, proc.stderr


@pytest.fixture(scope="module")
def spec():
    return spec_mod.load("fused_add_rmsnorm")


@pytest.fixture(scope="module")
def patch(sglang_0523, spec, tmp_path_factory):
    """The const-weight edit (rms(), line ~45, far from what 0.5.15 changed)."""
    return emit_patch(spec, sglang_0523, h.candidate(sglang_0523), h.synthetic_verdict(),
                      tmp_path_factory.mktemp("const")).repo_patch


@pytest.fixture(scope="module")
def near_ns_patch(sglang_0523, spec, tmp_path_factory):
    """An edit whose context reaches `namespace sglang {` (line 15), which 0.5.15 writes differently."""
    return emit_patch(spec, sglang_0523, h.candidate(sglang_0523, h.NEAR_NS_OLD, h.NEAR_NS_NEW),
                      h.synthetic_verdict(), tmp_path_factory.mktemp("near_ns")).repo_patch


@pytest.fixture(autouse=True)
def no_gpu(monkeypatch):
    monkeypatch.setattr(versions, "gpu_status", lambda: versions.NO_GPU)


def test_unchanged_file_applies_exactly(patch):
    result = recheck.recheck([patch], from_wheel("0.5.20"), no_gpu=True)
    check = result["patches"][0]
    assert result["exit_code"] == 0 and check["exit_code"] == 0, check["problems"] + check["unverified"]
    assert check["location"] == "present" and check["file_changed"] is False
    assert check["applies"] == "exact" and check["apply_method"] == "git apply --check"
    assert check["sources"]["kernel"]["status"] == "same"
    assert check["gpu"] == {"run": False, "reason": recheck.NO_GPU_FLAG}
    text = recheck_report.markdown(result)
    assert "| yes | no |" in text and "Source-only recheck (--no-gpu)." in text
    assert "GPU check (patched vs new original): not run: --no-gpu" in text


def test_no_gpu_could_not_verify(patch):
    """No GPU and no --no-gpu: the GPU checks did not run, so the patch is not verified (exit 11)."""
    result = recheck.recheck([patch], from_wheel("0.5.20"))
    check = result["patches"][0]
    assert result["exit_code"] == check["exit_code"] == 11 and not check["problems"]
    assert check["gpu"] == {"run": False, "reason": "not run: no CUDA GPU"}
    assert check["unverified"] == ["GPU checks not run: no CUDA GPU (pass --no-gpu to accept a source-only recheck)"]
    text = recheck_report.markdown(result)
    assert "Exit code 11 (COULD NOT VERIFY)" in text and "| COULD NOT VERIFY |" in text
    assert "- could not verify: GPU checks not run: no CUDA GPU" in text
    assert "upstream speed change: not run: no CUDA GPU" in text


def test_base_version_missing_could_not_verify(patch):
    """The patch's base version cannot be had: sources not compared, exit 11 even with --no-gpu."""
    def unavailable(version):
        raise SglangNotFound(f"SGLang {version} is not in the package index (offline)")

    result = recheck.recheck([patch], from_wheel("0.5.20"), old_tree_for=unavailable, no_gpu=True)
    check = result["patches"][0]
    assert result["exit_code"] == 11 and check["sources"] is None
    assert check["unverified"][0].startswith("SGLang 0.5.23 (the patch's base) is not available")
    assert "- could not verify: SGLang 0.5.23 (the patch's base) is not available" in recheck_report.markdown(result)


def test_base_file_not_the_patchs_base_could_not_verify(patch):
    """The base version's file is not the patch's base (here 0.5.15's tree stands in): exit 11."""
    result = recheck.recheck([patch], from_wheel("0.5.20"), old_tree_for=lambda v: from_wheel("0.5.15"),
                             no_gpu=True)
    check = result["patches"][0]
    assert result["exit_code"] == 11 and "is not the patch's base" in check["unverified"][0]


def test_known_failures_beat_could_not_verify(patch, sglang_0510, monkeypatch):
    assert recheck.worst(0, 11) == 11 and recheck.worst(11, 1) == 1 and recheck.worst(2, 11, 1) == 2
    assert recheck.worst() == 0
    check = recheck.recheck([patch], sglang_0510)["patches"][0]  # does not apply, and no GPU
    assert check["exit_code"] == 2
    monkeypatch.setattr(versions, "gpu_status", lambda: None)
    monkeypatch.setattr(recheck, "_gpu_checks", lambda *a: {"run": True, "status": "incorrect",
                                                           "regression": "the patched kernel fails (stand-in)"})
    result = recheck.recheck([patch], from_wheel("0.5.20"), old_tree_for=lambda v: from_wheel("0.5.15"))
    assert result["patches"][0]["unverified"] and result["exit_code"] == 1


def test_moved_and_changed_file(patch, near_ns_patch):
    result = recheck.recheck([patch, near_ns_patch], from_wheel("0.5.15"))
    const, near = result["patches"]
    assert result["exit_code"] == 2
    for check in (const, near):
        assert check["location"] == "moved" and check["new_path"] == OLD_PATH
        assert check["file_changed"] is True and check["exit_code"] == 2
        assert any("moved to " + OLD_PATH in p for p in check["problems"])
        assert check["gpu"]["reason"] == "not run: no CUDA GPU"  # the diff applies, so only the GPU is missing
    assert const["applies"] == "exact"  # its hunk is far from the two changed lines
    assert near["applies"] == "fuzz" and near["apply_method"] == "git apply --check -C1"
    assert near["apply_error"].startswith("error: patch failed")
    kernel = const["sources"]["kernel"]
    assert kernel["status"] == "changed" and (kernel["added"], kernel["removed"]) == (2, 2)


def test_diff_no_longer_applies(patch, sglang_0510):
    check = recheck.recheck([patch], sglang_0510)["patches"][0]
    assert check["applies"] == "no" and check["exit_code"] == 2
    assert check["gpu"] == {"run": False, "reason": "not run: the patch does not apply"}


def test_regression_exit_code(patch, monkeypatch):
    """The exit-code rule with a stand-in for the GPU part (which needs a GPU): 1 on a regression."""
    monkeypatch.setattr(versions, "gpu_status", lambda: None)
    monkeypatch.setattr(recheck, "_gpu_checks", lambda *a: {"run": True, "status": "incorrect",
                                                           "regression": "the patched kernel fails (stand-in)"})
    result = recheck.recheck([patch], from_wheel("0.5.20"))
    assert result["exit_code"] == 1 and "fails (stand-in)" in result["patches"][0]["problems"][-1]


def test_cli_highest_exit_code_wins_and_reports(patch, spec, tmp_path):
    old = from_wheel("0.5.15")
    old_patch = emit_patch(spec, old, h.candidate(old), h.synthetic_verdict(), tmp_path / "p15").repo_patch
    assert "python/sglang/jit_kernel/csrc/" in old_patch.read_text()
    out_json, out_md = tmp_path / "r.json", tmp_path / "r.md"
    code, out, err = astra("recheck", str(patch), str(old_patch), "--sglang", "0.5.20",
                           "--json", str(out_json), "--markdown", str(out_md))
    assert code == 2, err  # a known failure beats "could not verify"
    data = json.loads(out_json.read_text())
    assert [p["exit_code"] for p in data["patches"]] == [11, 2]
    assert data["patches"][1]["location"] == "moved"
    assert data["patches"][1]["new_path"] == "sglang/kernels/jit/csrc/elementwise/fused_add_rmsnorm.cuh"
    assert out_md.read_text() == out and "NO LONGER APPLIES" in out and "not run: no CUDA GPU" in out
    code, out, err = astra("recheck", str(patch), "--sglang", "0.5.20")
    assert code == 11 and "could not verify: GPU checks not run: no CUDA GPU" in out, err
    code, out, err = astra("recheck", str(patch), "--sglang", "0.5.20", "--no-gpu")
    assert code == 0 and "Exit code 0 (ok)" in out and "Source-only recheck" in out, err


def test_sanitizer_not_run_on_recheck_could_not_verify(patch, monkeypatch):
    """The GPU checks ran (stand-in workers) and passed, but compute-sanitizer was missing: exit 11."""
    from astra.verify import runner

    monkeypatch.setattr(versions, "gpu_status", lambda: None)
    monkeypatch.setattr(recheck, "verify_job", lambda job, timeout_s: h.synthetic_verdict(sanitizer="skipped"))
    monkeypatch.setattr(runner, "run_job", lambda job, timeout_s: h.synthetic_verdict())
    monkeypatch.setattr(runner, "require_gpu", lambda: None)
    check = recheck.recheck([patch], from_wheel("0.5.20"))["patches"][0]
    assert check["exit_code"] == 11 and not check["problems"]
    assert check["unverified"] == ["compute-sanitizer: not run (compute-sanitizer not found on PATH or in "
                                   "$CUDA_HOME/bin) (the sanitizer did not run cleanly)"]


def test_cli_smuggled_hunks_refused(patch, tmp_path):
    """recheck refuses what apply refuses: a plain hunk after the diff, a diff in the message (exit 9)."""
    evil = f"python/{h.EVIL_REL}"
    appended, in_body = tmp_path / "appended.patch", tmp_path / "body.patch"
    appended.write_text(patch.read_text() + h.plain_hunk(evil))
    in_body.write_text(h.with_message_diff(patch.read_text(), h.plain_hunk(evil, create=True)))
    for bad in (appended, in_body):
        code, out, err = astra("recheck", str(bad), "--sglang", "0.5.20", "--no-gpu")
        assert code == 9 and out == "" and evil in err and len(err.strip().splitlines()) == 1, err
        with pytest.raises(NotAnAstraPatch, match="its trailers name"):
            recheck.recheck([bad], from_wheel("0.5.20"), no_gpu=True)


def test_cli_bad_inputs(patch, tmp_path):
    bad = tmp_path / "cut.patch"
    bad.write_text("".join(patch.read_text().splitlines(keepends=True)[:-6]))
    code, _, err = astra("recheck", str(bad), "--sglang", "0.5.20")
    assert code == 9 and "corrupt patch" in err and len(err.strip().splitlines()) == 1
    with pytest.raises(NotAnAstraPatch):
        recheck.recheck([tmp_path / "missing.patch"], from_wheel("0.5.20"))


def test_cli_unknown_version(patch):
    code, _, err = astra("recheck", str(patch), "--sglang", "0.0.999")
    assert code == 3 and "Traceback" not in err
    assert "SGLang 0.0.999 is not in the package index" in err and len(err.strip().splitlines()) == 1


def test_diff_versions():
    code, out, err = astra("diff-versions", "fused_add_rmsnorm", "--from", "0.5.20", "--to", "0.5.23")
    assert code == 0, err
    assert "kernel file `csrc/elementwise/fused_add_rmsnorm.cuh`: same" in out
    assert "per-shape speed: not run: no CUDA GPU" in out
    code, out, err = astra("diff-versions", "fused_add_rmsnorm", "--from", "0.5.15", "--to", "0.5.23")
    assert code == 0, err
    assert "kernel file `csrc/elementwise/fused_add_rmsnorm.cuh`: changed (+2 -2)" in out
    assert "`include/sgl_kernel/bits.h`: added" in out


def test_gpu_plumbing_with_stand_in_workers(patch, sglang_0523, monkeypatch):
    """What the GPU parts send to the workers and how their verdicts are reported, with stand-in workers
    (verify_job / run_job replaced where astra calls them; the real ones need a GPU)."""
    from astra.verify import runner

    sent = []

    def fake_verify(job, timeout_s):
        sent.append(("verify", job))
        return h.synthetic_verdict()

    def fake_run(job, timeout_s):
        sent.append(("run", job))
        verdict = h.synthetic_verdict()
        scale = 1.10 if "0.5.15" in job.build.source_root else 1.0
        for case in verdict.cases:
            for timing in case.timings.values():
                timing.orig.median_us *= scale
        return verdict

    monkeypatch.setattr(versions, "gpu_status", lambda: None)
    monkeypatch.setattr(recheck, "verify_job", fake_verify)
    monkeypatch.setattr(runner, "run_job", fake_run)
    monkeypatch.setattr(runner, "require_gpu", lambda: None)
    new = from_wheel("0.5.15")
    result = recheck.recheck([patch], new)
    check = result["patches"][0]
    assert [kind for kind, _ in sent] == ["verify", "run", "run"]
    verify_job = sent[0][1]
    assert verify_job.build.source_root == str(new.csrc_dir) and verify_job.kernel_file == h.KERNEL_REL
    assert verify_job.candidate_source == h.candidate(new)  # the patch applied to 0.5.15's file
    assert sent[1][1].build.source_root == str(sglang_0523.csrc_dir) and sent[1][1].candidate_source is None
    assert all(c.timed for _, job in sent[1:] for c in job.cases)
    gpu = check["gpu"]
    assert gpu["run"] and gpu["status"] == "correct" and "regression" not in gpu
    shapes = gpu["upstream"]["shapes"]
    timed = 2 * sum(c.timed for c in h.synthetic_verdict().cases)  # graph + cold per timed case
    assert len(shapes) == timed and all(abs(s["new_over_old"] - 1.10) < 1e-9 for s in shapes)
    assert check["exit_code"] == 2  # moved still wins
    text = recheck_report.markdown(result)
    assert "upstream speed change (new original / old original" in text and "(x1.100)" in text

    sent.clear()
    diff = versions.diff_versions(spec_mod.load("fused_add_rmsnorm"), sglang_0523, new)
    assert diff["speed"]["run"] and len(diff["speed"]["shapes"]) == timed
    assert "| 0.5.23 us | 0.5.15 us | new / old |" in recheck_report.diff_versions_markdown(diff)


@pytest.mark.gpu
def test_recheck_on_gpu(patch, monkeypatch):
    """On a GPU: the patched kernel verified against 0.5.20's original, and 0.5.23 vs 0.5.20 timed (minutes)."""
    monkeypatch.undo()
    result = recheck.recheck([patch], from_wheel("0.5.20"))
    gpu = result["patches"][0]["gpu"]
    assert gpu["run"] is True and gpu["status"] == "correct", gpu.get("reason")
    assert gpu["upstream"]["run"] is True and gpu["upstream"]["shapes"]
    assert result["exit_code"] in (0, 1)


def test_loop_emitter_and_recheck_agree_at_the_noise_edge(patch, sglang_0523, spec, monkeypatch, tmp_path):
    """One rule decides "verified faster": a candidate 1.5% faster on every shape, measured with a 2% noise
    band (3 standard errors of the overall geomean), is refused by the loop, the patch emitter and recheck."""
    from astra.optimize.evaluator import Evaluator
    from astra.optimize.loop import Budget, Proposal, run_loop
    from astra.optimize.rundir import RunDir
    from astra.patches.emit import refusal
    from astra.verify import runner
    from harness.judge.acceptance import SIGNIFICANCE, band_noise

    timed = sum(c.timed for c in h.synthetic_verdict().cases)
    rel_stderr = 0.02 * timed ** 0.5 / SIGNIFICANCE
    edge = h.synthetic_verdict(uniform=1.015, rel_stderr=rel_stderr)
    assert band_noise(edge.cases, "graph")["all"] == pytest.approx(0.02)
    assert edge.status == "correct" and not edge.slower_shapes

    class OneCandidate:
        name, rationale, plan = "scripted", "", None

        def __init__(self):
            self.sent = False

        def usage(self):
            return 0, 0.0

        def propose(self, ctx):
            if self.sent:
                return []
            self.sent = True
            return [Proposal("edge", "test", "1.5% faster", ctx.base_source + "\n// edge")]

    run = RunDir.create(spec.name, sglang_0523.version, "scripted", "// original")
    state = run_loop(run, OneCandidate(), Evaluator(lambda source, label: edge), Budget(rounds=1))
    loop_says = state.history[0]
    assert state.best is None and not loop_says.accepted

    emitter_says = refusal(edge, spec_name=spec.name)
    assert emitter_says is not None and "not faster beyond noise" in emitter_says

    monkeypatch.setattr(versions, "gpu_status", lambda: None)
    monkeypatch.setattr(recheck, "verify_job", lambda job, timeout_s: edge)
    monkeypatch.setattr(runner, "run_job", lambda job, timeout_s: h.synthetic_verdict())
    monkeypatch.setattr(runner, "require_gpu", lambda: None)
    result = recheck.recheck([patch], sglang_0523)
    recheck_says = result["patches"][0]["gpu"]["regression"]
    assert "no longer verified faster" in recheck_says and "not faster beyond noise" in recheck_says
    assert result["exit_code"] == recheck.REGRESSION
    assert loop_says.why == emitter_says == recheck_says.split(": ", 1)[1]
