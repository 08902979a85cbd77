"""`astra probe` and the spec gate: resolve() refuses unprobed or edited drafts and accepts probed ones; a
recorded probe result rewrites a draft (roles, excludes) and writes probe.json; the whole orchestration
(targets, builds on every core, probe processes, records, resumption) on the CPU with a host-only kernel
built by nvcc in a stand-in SGLang checkout; and, on a GPU, the reviewed rmsnorm spec with SGLang 0.5.23."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from astra import paths
from astra.errors import AstraError, NoGpu, UnknownKernel
from astra.sglang.tree import from_source
from astra.spec.extract import PROBED_MARK
from astra.spec.resolve import resolve, spec_sha256
from astra.verify import probing
from astra.verify.probe_record import finish, markdown
from tests.astra.sglang.test_sglang_tree import _fake_checkout
from tests.astra_home import cached_home
from tests.toolchain import needs_nvcc

REPO = Path(__file__).resolve().parents[3]
HEADER = "# Draft written by `astra extract`; review every TODO(review) before use.\n# TODO(review): roles were inferred\n"


@pytest.fixture
def home(tmp_path, monkeypatch) -> Path:
    monkeypatch.setenv("ASTRA_HOME", str(cached_home(tmp_path / "home")))
    return tmp_path / "home"


def write_draft(name: str, *, out_role: str = "in", reference: bool = False) -> Path:
    """A draft of rmsnorm under $ASTRA_HOME/drafts/NAME (its `out` drafted with `out_role`)."""
    raw = yaml.safe_load((REPO / "extracted_kernels" / "rmsnorm" / "kernel.yaml").read_text())
    raw["name"] = name
    raw.pop("reference") if not reference else None
    next(a for a in raw["arguments"] if a["name"] == "out")["role"] = out_role
    path = paths.drafts_dir() / name / "kernel.yaml"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(HEADER + yaml.safe_dump(raw, sort_keys=False, width=110))
    return path


def recorded_result(cases: list[dict], status: str = "probed", reason: str = "1/1 cases kept; writes out (out)") -> dict:
    """What `python -m harness probe` returns (harness.probe.processes.probe_job), as recorded on a GPU."""
    return {"name": "x", "status": status, "reason": reason, "cases": cases, "wall_s": 12.5,
            "sanitizer": {"findings": [], "ok": True, "skipped": None, "unavailable": None, "case": cases[0]["id"]},
            "env": {"gpu": "NVIDIA H100 80GB HBM3", "driver": "580.159.04", "torch": "2.11.0", "torch_cuda": "13.0",
                    "driver_cuda": "13.0", "tvm_ffi": "0.1.11", "nvcc": "13.0"}, "builds": []}


def kept(case_id: str) -> dict:
    return {"id": case_id, "status": "kept", "message": "", "written": ["out"], "deterministic": True,
            "finite": True, "constant_outputs": [], "notes": [], "seconds": 0.2,
            "roles": {"input": "in", "weight": "in", "out": "out"}}


KEPT = "Llama-3.1-8B/tp1/bfloat16/tokens=1,hidden=4096"
REJECTED = "edge/bfloat16/tokens=1,hidden=64"


# ---------------------------------------------------------------- the gate: resolve()


def test_resolve_prefers_reviewed_specs(home):
    write_draft("rmsnorm")  # a draft of the same name never shadows the reviewed spec
    assert resolve("rmsnorm").path == REPO / "extracted_kernels" / "rmsnorm" / "kernel.yaml"


def test_resolve_refuses_an_unprobed_draft_and_accepts_a_probed_one(home):
    path = write_draft("rms_draft")
    with pytest.raises(UnknownKernel, match=r"spec rms_draft is an unprobed draft \(.*rms_draft/kernel.yaml\); "
                                            r"run `astra probe rms_draft` on a GPU machine first \(or review it "
                                            r"and move it to extracted_kernels/rms_draft\)"):
        resolve("rms_draft")
    with pytest.raises(UnknownKernel, match="unprobed draft"):
        resolve(str(path))  # by path too
    finish("rms_draft", "draft", path, path.parent / "probe.json", recorded_result([kept(KEPT)]), "0.5.23")
    spec = resolve("rms_draft")
    assert spec.path == path and next(a.role for a in spec.arguments if a.name == "out") == "out"
    path.write_text(path.read_text() + "\n# a later edit\n")
    with pytest.raises(UnknownKernel, match="edited since its probe"):
        resolve("rms_draft")


def test_resolve_refuses_a_draft_whose_probe_failed_and_the_cli_says_so(home):
    path = write_draft("rms_failed")
    before = path.read_bytes()
    result = recorded_result([{**kept(KEPT), "status": "rejected", "message": "RuntimeError: no", "written": [],
                               "roles": {}}], status="failed", reason="kernel rejects every drafted case: RuntimeError: no")
    summary = finish("rms_failed", "draft", path, path.parent / "probe.json", result, "0.5.23")
    assert summary.status == "failed" and path.read_bytes() == before  # a failed probe leaves the draft alone
    record = json.loads((path.parent / "probe.json").read_text())
    assert record["spec_sha256"] == spec_sha256(path) and record["excluded"][0]["case"] == KEPT
    with pytest.raises(UnknownKernel, match=r"probe failed \(kernel rejects every drafted case: RuntimeError: no\)"):
        resolve("rms_failed")
    candidate = path.parent / "cand.cuh"
    candidate.write_text("// mine\n")
    env = {**os.environ, "ASTRA_HOME": str(home)}
    for command in (["check", "rms_failed", "--candidate", str(candidate)], ["bench", "rms_failed"],
                    ["optimize", "rms_failed", "--dry-run"]):
        proc = subprocess.run([sys.executable, "-m", "astra.cli", *command], capture_output=True, text=True, env=env)
        assert proc.returncode == 4 and "Traceback" not in proc.stderr, proc.stderr
        assert "run `astra probe rms_failed` on a GPU machine first" in proc.stderr


# ---------------------------------------------------------------- records and the rewrite


def test_a_passing_probe_rewrites_the_draft_and_binds_probe_json_to_it(home):
    path = write_draft("rms_rewrite", out_role="in")
    rejected = {**kept(REJECTED), "status": "rejected", "written": [], "roles": {},
                "message": "RuntimeError: Tensor match failed for Tensor<1, 64> (Root cause: hidden too small)"}
    hung = {**kept("edge/bfloat16/tokens=127,hidden=128"), "status": "hung", "written": [], "roles": {},
            "message": "no result within 120 s"}
    summary = finish("rms_rewrite", "draft", path, path.parent / "probe.json",
                     recorded_result([kept(KEPT), rejected, hung]), "0.5.23")
    assert (summary.status, summary.kept, summary.total, summary.written) == ("probed", 1, 3, ["out (out)"])
    text = path.read_text()
    assert text.startswith(HEADER + PROBED_MARK + " on NVIDIA H100 80GB HBM3")  # header comments kept
    raw = yaml.safe_load(text)
    assert next(a for a in raw["arguments"] if a["name"] == "out")["role"] == "out"
    assert raw["shapes"]["exclude"] == [
        {"case": REJECTED, "reason": "RuntimeError: Tensor match failed for Tensor<1, 64> (Root cause: hidden too small)"},
        {"case": "edge/bfloat16/tokens=127,hidden=128", "reason": "the original hung: no result within 120 s"}]
    record = json.loads((path.parent / "probe.json").read_text())
    assert record["spec_sha256"] == spec_sha256(path)  # the bytes AFTER the rewrite
    assert record["role_changes"] == {"out": ["in", "out"]} and record["status"] == "probed"
    assert (record["gpu"], record["driver"], record["cuda"], record["torch"]) == (
        "NVIDIA H100 80GB HBM3", "580.159.04", "13.0", "2.11.0")
    assert record["sglang_version"] == "0.5.23" and record["date"] and record["wall_s"] == 12.5
    assert [c["status"] for c in record["cases"]] == ["kept", "rejected", "hung"]
    finish("rms_rewrite", "draft", path, path.parent / "probe.json", recorded_result([kept(KEPT), rejected]), "0.5.23")
    again = path.read_text()
    assert again.count(PROBED_MARK) == 1 and yaml.safe_load(again)["shapes"]["exclude"] == raw["shapes"]["exclude"]


def test_the_drafted_bytes_follow_the_observed_roles(home):
    """A tensor the draft called `in` is read and written (observed `inout`): the bytes the extractor wrote
    are written again for the observed roles (the floors rest on them); bytes a person wrote stay."""
    from astra.spec.draft_traffic import bytes_expr

    path = write_draft("rms_bytes", out_role="in")
    raw = yaml.safe_load(path.read_text())
    raw["bytes"] = bytes_expr(raw["arguments"])
    raw.pop("bytes_read", None), raw.pop("bytes_written", None)
    path.write_text(HEADER + yaml.safe_dump(raw, sort_keys=False, width=110))
    in_place = {**kept(KEPT), "written": ["input", "out"], "roles": {"input": "inout", "weight": "in", "out": "out"}}
    finish("rms_bytes", "draft", path, path.parent / "probe.json", recorded_result([in_place]), "0.5.23")
    after = yaml.safe_load(path.read_text())
    assert after["bytes"].startswith("2 * tokens * hidden")
    assert after["bytes"] == bytes_expr(after["arguments"]) != raw["bytes"]
    hand = write_draft("rms_hand", out_role="in")
    written = yaml.safe_load(hand.read_text())["bytes"]
    finish("rms_hand", "draft", hand, hand.parent / "probe.json", recorded_result([in_place]), "0.5.23")
    assert yaml.safe_load(hand.read_text())["bytes"] == written


def test_outputs_found_unordered_are_marked_in_the_draft(home):
    path = write_draft("rms_unordered", out_role="out")
    case = {**kept(KEPT), "unordered": ["out"]}
    finish("rms_unordered", "draft", path, path.parent / "probe.json", recorded_result([case]), "0.5.23")
    args = {a["name"]: a for a in yaml.safe_load(path.read_text())["arguments"]}
    assert args["out"]["unordered"] is True and "unordered" not in args["input"]
    assert json.loads((path.parent / "probe.json").read_text())["cases"][0]["unordered"] == ["out"]


def test_a_noop_case_goes_to_the_exclusions(home):
    path = write_draft("rms_noop", out_role="out")
    noop = {**kept(REJECTED), "status": "noop", "written": [], "roles": {"input": "in", "weight": "in", "out": "in"},
            "message": "the original writes no tensor on this case: it cannot tell a candidate from one that does nothing"}
    summary = finish("rms_noop", "draft", path, path.parent / "probe.json",
                     recorded_result([kept(KEPT), noop]), "0.5.23")
    assert summary.status == "probed" and (summary.kept, summary.total) == (1, 2)
    assert yaml.safe_load(path.read_text())["shapes"]["exclude"] == [{"case": REJECTED, "reason": noop["message"]}]


def test_a_reviewed_spec_is_never_rewritten(home):
    spec_file = REPO / "extracted_kernels" / "rmsnorm" / "kernel.yaml"
    before = spec_file.read_bytes()
    target = probing.select(["rmsnorm"], reviewed=True)[0]
    assert target.record_path == home / "probes" / "rmsnorm.json"
    observed = {**kept(KEPT), "roles": {"input": "in", "weight": "in", "out": "inout"}}
    summary = finish("rmsnorm", "reviewed", spec_file, target.record_path, recorded_result([observed]), "0.5.23")
    assert spec_file.read_bytes() == before
    assert "observed roles differ from the reviewed spec: out: out -> inout" in summary.reason
    assert json.loads(target.record_path.read_text())["role_changes"] == {"out": ["out", "inout"]}


def test_selection_and_options(home, monkeypatch):
    with pytest.raises(AstraError, match="name the drafts to probe"):
        probing.select([])
    with pytest.raises(AstraError, match="no drafts under"):
        probing.select([], all_drafts=True)
    with pytest.raises(UnknownKernel, match="no spec 'nope' to probe"):
        probing.select(["nope"])
    write_draft("rms_a")
    assert [(t.name, t.kind) for t in probing.select(["rms_a", "rmsnorm"])] == [("rms_a", "draft"), ("rmsnorm", "reviewed")]
    everything = probing.select([], all_drafts=True, reviewed=True)
    assert ("rms_a", "draft") in [(t.name, t.kind) for t in everything] and len(everything) > 2
    for bad in ({"per_gpu": 0}, {"timeout_case_s": -1.0}):
        with pytest.raises(AstraError, match="--per-gpu|--timeout-case"):
            probing.ProbeOptions(**bad)
    monkeypatch.setattr(probing, "gpu_count", lambda: 0)
    with pytest.raises(NoGpu, match="`astra probe` runs each draft's original kernel on a GPU"):
        probing.gpu_slots(probing.ProbeOptions())
    monkeypatch.setattr(probing, "gpu_count", lambda: 2)  # no GPU here: the mapping itself is what is tested
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "3,5")
    assert probing.gpu_slots(probing.ProbeOptions(per_gpu=2)) == ["3", "5", "3", "5"]


def test_the_cli_on_a_machine_without_cuda(home):
    write_draft("rms_cli")
    env = {**os.environ, "ASTRA_HOME": str(home), "CUDA_VISIBLE_DEVICES": ""}
    proc = subprocess.run([sys.executable, "-m", "astra.cli", "probe", "rms_cli"], capture_output=True, text=True,
                          env=env)
    assert proc.returncode == 7 and proc.stderr.startswith("astra probe: no CUDA GPU here") and "Traceback" not in proc.stderr
    proc = subprocess.run([sys.executable, "-m", "astra.cli", "probe"], capture_output=True, text=True, env=env)
    assert proc.returncode == 12 and "name the drafts to probe" in proc.stderr


# ---------------------------------------------------------------- the whole orchestration on the CPU

TOY = r"""
#include <tvm/ffi/container/tensor.h>
#include <cstdint>
#include <stdexcept>

namespace toy {
struct Accumulate {
  static void run(tvm::ffi::TensorView acc, tvm::ffi::TensorView x, double alpha) {
    if (x.size(0) == 3) {
      throw std::runtime_error("Tensor match failed for Tensor<3, 8> at toy.cuh:9\n- Root cause: tokens must be even");
    }
    float* out = static_cast<float*>(acc.data_ptr());
    const float* in = static_cast<const float*>(x.data_ptr());
    for (int64_t i = 0; i < x.numel(); ++i) out[i] += in[i] * static_cast<float>(alpha);
  }
};
}  // namespace toy
"""

TOY_SPEC = {
    "name": "toy_acc", "module": "toy_acc", "category": "test", "description": "acc += x * alpha, on the host.",
    "source": {"sglang_version": "9.1.2", "kernel_file": "elementwise/toy.cuh", "sha256": "0" * 64,
               "repo_path": "python/sglang/kernels/jit/csrc/elementwise/toy.cuh"},
    "build": {"cuda_files": ["elementwise/toy.cuh"], "wrappers": [{"export": "acc", "entry": "toy::Accumulate::run"}]},
    "entry": "acc", "dims": {"tokens": "rows", "hidden": "width"}, "dtypes": ["float32"],
    "arguments": [{"name": "acc", "kind": "tensor", "shape": ["tokens", "hidden"], "dtype": "{dtype}", "role": "out"},
                  {"name": "x", "kind": "tensor", "shape": ["tokens", "hidden"], "dtype": "{dtype}", "role": "in"},
                  {"name": "alpha", "kind": "scalar", "dtype": "float32", "value": 0.5}],
    "shapes": {"edge": [{"tokens": 4, "hidden": 8}, {"tokens": 3, "hidden": 8}, {"tokens": 1, "hidden": 16}]},
    "tolerance": {"float32": {"atol": 1.0e-5, "rtol": 1.0e-5, "floor": 1.0e-5}},
    "bytes": "3 * tokens * hidden * elt(dtype)",
}



@needs_nvcc
def test_probe_modules_end_to_end_on_the_cpu(home, tmp_path):
    tree = from_source(_fake_checkout(tmp_path / "sglang"))
    (tree.csrc_dir / "elementwise" / "toy.cuh").write_text(TOY)
    draft = paths.drafts_dir() / "toy_acc" / "kernel.yaml"
    draft.parent.mkdir(parents=True)
    draft.write_text(HEADER + yaml.safe_dump(TOY_SPEC, sort_keys=False))
    lines: list[str] = []
    opts = probing.ProbeOptions(device="cpu", per_gpu=2, sanitizer=False, timeout_case_s=60)
    targets = probing.select([], all_drafts=True)
    (result,) = probing.probe_modules(targets, lambda spec: tree, opts, say=lines.append)
    assert result.status == "probed", result.reason
    assert (result.kept, result.total, result.written) == (2, 3, ["acc (inout)"])
    assert "1 rejected" in result.reason and "compute-sanitizer not run (--no-sanitizer)" in result.reason
    assert any(line.startswith("building 1 variant(s) of 1 module(s)") for line in lines)
    raw = yaml.safe_load(draft.read_text())
    assert raw["arguments"][0]["role"] == "inout"  # drafted `out`, observed to read its prior content
    assert raw["shapes"]["exclude"] == [{"case": "edge/float32/tokens=3,hidden=8", "reason": (
        "RuntimeError: Tensor match failed for Tensor<3, 8> at toy.cuh:9 (Root cause: tokens must be even)")}]
    record = json.loads((draft.parent / "probe.json").read_text())
    assert record["spec_sha256"] == spec_sha256(draft) and record["sglang_version"] == "9.1.2"
    assert record["torch"] and record["cases"][0]["deterministic"] is True and record["builds"][0]["ok"]
    (again,) = probing.probe_modules(targets, lambda spec: pytest.fail("resumed work"), opts)
    assert again.up_to_date and again.status == "probed"
    report, summary = tmp_path / "probe.md", tmp_path / "probe.json"
    proc = subprocess.run([sys.executable, "-m", "astra.cli", "probe", "--all", "--report", str(report), "--json",
                           str(summary)], capture_output=True, text=True, env={**os.environ, "ASTRA_HOME": str(home)})
    assert proc.returncode == 0, proc.stderr  # nothing left to run: no GPU needed
    assert "toy_acc  probed (up to date)  2/3" in proc.stdout.splitlines()[-1]
    assert report.read_text() == markdown([again])
    assert json.loads(summary.read_text())[0]["written"] == ["acc (inout)"]


# ---------------------------------------------------------------- on a GPU: the reviewed rmsnorm spec


@pytest.mark.gpu
def test_probe_the_reviewed_rmsnorm_on_a_gpu(sglang_0523, home):
    targets = probing.select(["rmsnorm"], reviewed=True)
    (result,) = probing.probe_modules(targets, lambda spec: sglang_0523, probing.ProbeOptions(per_gpu=4))
    record = json.loads(targets[0].record_path.read_text())
    assert result.status == "probed", result.reason
    assert record["roles"] == {"input": "in", "weight": "in", "out": "out"}
    assert result.kept == result.total and result.written == ["out (out)"]
    assert record["sanitizer"]["ok"] and record["sanitizer"]["findings"] == [] and record["gpu"]
    assert all(case["deterministic"] and case["finite"] for case in record["cases"])


def test_report_only_summarises_records_without_a_gpu(home, tmp_path):
    """`--report-only` probes nothing: probed records are summarised, the rest say how to probe."""
    probed = write_draft("rms_done")
    finish("rms_done", "draft", probed, probed.parent / "probe.json", recorded_result([kept(KEPT)]), "0.5.23")
    write_draft("rms_todo")
    report = tmp_path / "report.md"
    env = {**os.environ, "ASTRA_HOME": str(home), "CUDA_VISIBLE_DEVICES": ""}
    proc = subprocess.run([sys.executable, "-m", "astra.cli", "probe", "rms_done", "rms_todo", "--report-only",
                           "--report", str(report)], capture_output=True, text=True, env=env)
    assert proc.returncode == 0, proc.stderr
    text = report.read_text()
    assert "1 of 2 module(s) probed." in text
    assert "| rms_done | probed (up to date) | 1/1 |" in text
    assert "**rms_todo**: no probe record for this spec's current bytes; run `astra probe rms_todo`" in text
