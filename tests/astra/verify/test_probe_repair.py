"""`astra probe`'s repair loop and its rule-based repairer: the kernel's TensorMatcher messages parsed;
drafts that `astra extract` writes from SGLang 0.5.23 revised from the messages an H100 probe recorded
(and the statement at FILE:LINE read in the real sources); the guards (reviewed specs, edited drafts,
entry and build untouched); and the loop end to end on the CPU: a host-only kernel whose TensorMatcher-
style checks reject the first draft, repaired twice and probed."""

from __future__ import annotations

import copy
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from astra import paths
from astra.errors import AstraError
from astra.sglang.tree import from_source
from astra.spec import jobs
from astra.spec import model as spec_mod
from astra.spec.expr import evaluate
from astra.spec.extract import extract
from astra.spec.resolve import resolve, spec_sha256
from astra.verify import probing
from astra.verify.message_repair import MessageRepairer
from astra.verify.probe_record import finish
from astra.verify.probe_repair import (
    BEFORE,
    check_repair,
    cxx_to_spec,
    dry_run,
    parse_message,
    probe_with_repair,
    propose,
    source_statement,
    spec_dtype,
)
from tests.astra.sglang.test_sglang_tree import _fake_checkout
from tests.astra.verify.test_probe import HEADER, recorded_result
from tests.astra_home import cached_home
from tests.toolchain import needs_nvcc

# Recorded by `astra probe` on an NVIDIA H100 with SGLang 0.5.23
# (docs/results/2026-11-23-h100/probe-sglang-0.5.23-first-drafts.md).
KV_CANARY = ("RuntimeError: Tensor match failed for Tensor<32768, 128>[strides=<128, 1>, dtype=int64, device=cuda:0] "
             "at kv_canary/canary_verify.cuh:193 (Root cause: Size mismatch for shape#1: expected 8 but got 128)")
MUSE = ("RuntimeError: Tensor match failed for Tensor<128, 128, 128>[strides=<16384, 128, 1>, dtype=bfloat16, "
        "device=cuda:0] at muse_spark/norm_gate.cuh:351 (Root cause: Size mismatch for shape#0('num_tokens'): "
        "expected 1 but got 128)")
PAGE_ROW = ("RuntimeError: Tensor match failed for Tensor<1>[strides=<1>, dtype=int64, device=cuda:0] at "
            "kvcacheio/page_row.cuh:81 (Root cause: Dtype value [int64] not in the allowed options: [uint64])")
FP8 = ("RuntimeError: Tensor match failed for Tensor<1>[strides=<1>, dtype=float8_e4m3fn, device=cuda:0] at "
       "gemm/per_tensor_quant_fp8.cuh:120 (Root cause: Dtype value [float8_e4m3fn] not in the allowed options: [float32])")
QSA = ("RuntimeError: Tensor match failed for Tensor<1, 32>[strides=<32, 1>, dtype=bfloat16, device=cuda:0] at "
       "attention/qsa_indexer.cuh:402 (Root cause: Size mismatch for shape#1: expected 4224 but got 32)")




@pytest.fixture
def home(tmp_path, monkeypatch) -> Path:
    monkeypatch.setenv("ASTRA_HOME", str(cached_home(tmp_path / "home")))
    return tmp_path / "home"


# ---------------------------------------------------------------- the messages


def test_parse_the_recorded_tensor_matcher_messages():
    m = parse_message(KV_CANARY)
    assert (m.kind, m.index, m.label, m.expected, m.got) == ("shape", 1, None, 8, 128)
    assert (m.file, m.line, m.shape, m.dtype) == ("kv_canary/canary_verify.cuh", 193, (32768, 128), "int64")
    assert m.cause == "Size mismatch for shape#1: expected 8 but got 128"
    m = parse_message(MUSE)
    assert (m.kind, m.index, m.label, m.expected, m.shape) == ("shape", 0, "num_tokens", 1, (128, 128, 128))
    m = parse_message(PAGE_ROW)
    assert (m.kind, m.got, m.options, m.shape) == ("options", "int64", ("uint64",), (1,))
    assert parse_message(FP8).options == ("float32",)
    raw = ("Tensor match failed for Tensor<4, 8>[strides=<8, 1>, dtype=float16, device=cuda:0] at a/b.cuh:7\n"
           "- Root cause: DType mismatch: expected bfloat16 but got float16")  # as thrown, before one-lining
    m = parse_message(raw)
    assert (m.kind, m.expected, m.got, m.line, m.shape) == ("dtype", "bfloat16", "float16", 7, (4, 8))
    m = parse_message(KV_CANARY.replace("shape#1: expected 8", "stride#0: expected 8448"))
    assert (m.kind, m.index, m.expected) == ("stride", 0, 8448)
    assert parse_message("RuntimeError: Failed at elementwise/activation.cuh:218: invalid activation dimension") is None
    assert [spec_dtype(d) for d in ("float8_e4m3fn", "uint64", "fp32_t", "bf16_t")] == [
        "float8_e4m3fn", None, "float32", "bfloat16"]


def test_cxx_sizes_in_spec_names():
    table = {"num_q_heads": "num_q_heads_1_d", "D": "head_dim", "kViolationFields": "8", "K": "2 * hidden"}
    assert cxx_to_spec("(num_q_heads + 1) * D", table) == "(num_q_heads_1_d + 1) * head_dim"
    assert cxx_to_spec("static_cast<int64_t>(kViolationFields)", table) == 8
    assert cxx_to_spec("K / 2", table) == "(2 * hidden) // 2"
    for unknown in ("x.size(0)", "round_up(D, 4)", "num_tokens", "a ? b : c"):
        assert cxx_to_spec(unknown, table | {"a": "1", "b": "2", "c": "3"}) is None, unknown


# ---------------------------------------------------------------- drafts of SGLang 0.5.23


@pytest.fixture(scope="module")
def drafted(sglang_0523, tmp_path_factory):
    """name -> (KernelSpec, its cases by id) for drafts `astra extract` writes from the 0.5.23 tree."""
    base = tmp_path_factory.mktemp("drafts")
    out = {}
    for name in ("kv_canary_verify", "muse_spark_norm_gate", "qsa_indexer", "page_row"):
        path = extract(sglang_0523, name, out_dir=base / name).draft
        spec = spec_mod.load(path)
        out[name] = (spec, {case.id: case for case in jobs.cases(spec)[0]})
    return out


def _record(cases: dict, message) -> dict:
    """A failed probe record whose every case was rejected with `message(case)` (the kernel's text)."""
    return {"status": "failed", "kind": "draft", "cases": [
        {"id": case_id, "status": "rejected", "message": message(case)} for case_id, case in cases.items()]}


def _tensor(case, name: str):
    return next(a for a in case.args if a.name == name)


def _match(file: str, line: int, tensor, cause: str) -> str:
    shape = ", ".join(map(str, tensor.shape))
    return (f"RuntimeError: Tensor match failed for Tensor<{shape}>[strides=<1>, dtype={tensor.dtype}, "
            f"device=cuda:0] at {file}:{line} (Root cause: {cause})")


def _repaired_cases(name: str, new: dict) -> list:
    return jobs.cases(spec_mod.KernelSpec(Path(name) / "kernel.yaml", new))[0]


def test_the_statement_at_a_recorded_line_in_the_real_source(sglang_0523):
    dims, verified = source_statement(sglang_0523, "kv_canary/canary_verify.cuh", 193)  # a chained call's line
    assert verified == ["violation_ring"] and dims[1] == "static_cast<int64_t>(kViolationFields)"
    dims, verified = source_statement(sglang_0523, "attention/qsa_indexer.cuh", 402)
    assert verified == ["qk"] and dims == ["tokens", "(num_q_heads + 1) * D"]
    assert source_statement(sglang_0523, "no/such.cuh", 1) is None


def test_a_constant_size_pins_the_free_dim(drafted, sglang_0523):
    spec, cases = drafted["kv_canary_verify"]
    dim = next(a for a in spec.raw["arguments"] if a["name"] == "violation_ring")["shape"][1]
    if all(_tensor(case, "violation_ring").shape[1] == 8 for case in cases.values()):
        pytest.skip("astra extract already drafts violation_ring with kViolationFields = 8")
    record = _record(cases, lambda case: _match("kv_canary/canary_verify.cuh", 193, _tensor(case, "violation_ring"),
                                                f"Size mismatch for shape#1: expected 8 but got "
                                                f"{_tensor(case, 'violation_ring').shape[1]}"))
    new, note = MessageRepairer().repair("kv_canary_verify", copy.deepcopy(spec.raw), record, sglang_0523)
    assert dim not in new["dims"] and str(new["derived"][dim]) == "8" and "violation_ring shape#1" in note
    assert all(dim not in (m.get("dims") or {}) for m in new["shapes"]["models"])
    assert check_repair(spec.raw, new, spec.path) is None  # validates; entry, build and variants kept
    assert all(_tensor(case, "violation_ring").shape[1] == 8 for case in _repaired_cases("kv_canary_verify", new))


def test_a_size_bound_by_another_tensor_becomes_that_dim(drafted, sglang_0523):
    spec, cases = drafted["muse_spark_norm_gate"]
    gate_dim = next(a for a in spec.raw["arguments"] if a["name"] == "gate")["shape"][0]
    token_dim = spec.raw["shapes"]["token_dim"]
    if gate_dim == token_dim:
        pytest.skip("astra extract already drafts gate with the token dim")
    # the kernel binds num_tokens from x and checks gate against it: expected = x's rows in each case
    record = _record(cases, lambda case: _match("muse_spark/norm_gate.cuh", 351, _tensor(case, "gate"), (
        f"Size mismatch for shape#0('num_tokens'): expected {_tensor(case, 'x').shape[0]} but got "
        f"{_tensor(case, 'gate').shape[0]}")))
    new, note = MessageRepairer().repair("muse_spark_norm_gate", copy.deepcopy(spec.raw), record, sglang_0523)
    assert new["derived"][gate_dim] == token_dim and gate_dim not in new["dims"]
    assert check_repair(spec.raw, new, spec.path) is None
    after = _repaired_cases("muse_spark_norm_gate", new)
    assert len({case.dims[token_dim] for case in after}) > 1  # the sweep is kept
    assert all(_tensor(case, "gate").shape[0] == _tensor(case, "x").shape[0] for case in after)


def test_a_size_the_statement_computes_is_translated_from_the_cxx(drafted, sglang_0523):
    spec, cases = drafted["qsa_indexer"]
    if parse_message(QSA).expected in {_tensor(case, "qk").shape[1] for case in cases.values()}:
        pytest.skip("astra extract already drafts qk's width as (num_q_heads + 1) * head_dim")
    heads = next(a for a in spec.raw["arguments"] if a["name"] == "num_q_heads")["value"]
    head_dim = next(d for d, doc in spec.raw["dims"].items() if "template argument kHeadDim" in doc)

    def expected(case) -> int:  # TensorMatcher({tokens, (num_q_heads + 1) * D}) at attention/qsa_indexer.cuh:402
        names = spec.names_for(case.dims, case.dtype)
        return (evaluate(str(heads), names) + 1) * names[head_dim]

    record = _record(cases, lambda case: _match("attention/qsa_indexer.cuh", 402, _tensor(case, "qk"),
                                                f"Size mismatch for shape#1: expected {expected(case)} but got "
                                                f"{_tensor(case, 'qk').shape[1]}"))
    assert any(expected(case) == 4224 for case in cases.values())  # the value the H100 recorded (QSA)
    new, note = MessageRepairer().repair("qsa_indexer", copy.deepcopy(spec.raw), record, sglang_0523)
    qk = next(a for a in new["arguments"] if a["name"] == "qk")
    assert head_dim in str(qk["shape"][1]) and spec.raw["dims"] == new["dims"]  # this tensor's entry only
    assert check_repair(spec.raw, new, spec.path) is None
    assert all(_tensor(after, "qk").shape[1] == expected(cases[after.id])
               for after in _repaired_cases("qsa_indexer", new))


def test_no_repair_where_no_spec_dtype_fits(drafted, sglang_0523):
    spec, cases = drafted["page_row"]
    record = _record(cases, lambda case: _match("kvcacheio/page_row.cuh", 81, case.tensors()[0],
                                                "Dtype value [int64] not in the allowed options: [uint64]"))
    before = copy.deepcopy(spec.raw)
    assert MessageRepairer().repair("page_row", copy.deepcopy(spec.raw), record, sglang_0523) is None
    assert spec.raw == before


# ---------------------------------------------------------------- the guards


TOY = r"""
#include <tvm/ffi/container/tensor.h>
#include <cstdint>
#include <stdexcept>
#include <string>

namespace toy {
inline std::string describe(tvm::ffi::TensorView t) {
  std::string shape, strides;
  for (int i = 0; i < t.dim(); ++i) {
    shape += (i ? ", " : "") + std::to_string(t.size(i));
    strides += (i ? ", " : "") + std::to_string(t.stride(i));
  }
  const auto dt = t.dtype();
  std::string dtype = dt.code == 2 && dt.bits == 32 ? "float32" : dt.code == 0 && dt.bits == 64 ? "int64" : "other";
  return "Tensor<" + shape + ">[strides=<" + strides + ">, dtype=" + dtype + ", device=cpu]";
}
struct Scale {
  static void run(tvm::ffi::TensorView out, tvm::ffi::TensorView x, tvm::ffi::TensorView scale, tvm::ffi::TensorView idx) {
    if (scale.size(0) != 1)
      throw std::runtime_error("Tensor match failed for " + describe(scale) + " at elementwise/toy_scale.cuh:22\n"
                               "- Root cause: Size mismatch for shape#0: expected 1 but got " + std::to_string(scale.size(0)));
    if (idx.dtype().code != 0 || idx.dtype().bits != 64)
      throw std::runtime_error("Tensor match failed for " + describe(idx) + " at elementwise/toy_scale.cuh:25\n"
                               "- Root cause: Dtype value [float32] not in the allowed options: [int64]");
    float* o = static_cast<float*>(out.data_ptr());
    const float* in = static_cast<const float*>(x.data_ptr());
    const float s = *static_cast<const float*>(scale.data_ptr());
    const int64_t* ix = static_cast<const int64_t*>(idx.data_ptr());
    const int64_t hidden = x.size(1);
    for (int64_t i = 0; i < x.numel(); ++i) o[i] = in[i] * s + static_cast<float>(ix[i / hidden]);
  }
};
}  // namespace toy
"""

TOY_SPEC = {
    "name": "toy_scale", "module": "toy_scale", "category": "test", "description": "out = x * scale + idx, on the host.",
    "source": {"sglang_version": "9.1.2", "kernel_file": "elementwise/toy_scale.cuh", "sha256": "0" * 64,
               "repo_path": "python/sglang/kernels/jit/csrc/elementwise/toy_scale.cuh"},
    "build": {"cuda_files": ["elementwise/toy_scale.cuh"],
              "wrappers": [{"export": "scale", "entry": "toy::Scale::run"}]},
    "entry": "scale", "dims": {"tokens": "rows", "hidden": "width", "groups": "size; from SymbolicSize G"},
    "derived": {}, "dtypes": ["float32"],
    "arguments": [{"name": "out", "kind": "tensor", "shape": ["tokens", "hidden"], "dtype": "{dtype}", "role": "out"},
                  {"name": "x", "kind": "tensor", "shape": ["tokens", "hidden"], "dtype": "{dtype}", "role": "in"},
                  {"name": "scale", "kind": "tensor", "shape": ["groups"], "dtype": "{dtype}", "role": "in"},
                  {"name": "idx", "kind": "tensor", "shape": ["tokens"], "dtype": "{dtype}", "role": "in"}],
    "shapes": {"edge": [{"tokens": 2, "hidden": 8, "groups": 4}, {"tokens": 6, "hidden": 8, "groups": 4}]},
    "tolerance": {"float32": {"atol": 1.0e-5, "rtol": 1.0e-5, "floor": 1.0e-5}},
    "bytes": "2 * tokens * hidden * elt(dtype)",
}


def _toy(home: Path, tmp_path: Path, spec: dict = TOY_SPEC, header: str = HEADER):
    tree = from_source(_fake_checkout(tmp_path / "sglang"))
    (tree.csrc_dir / "elementwise" / "toy_scale.cuh").write_text(TOY)
    draft = paths.drafts_dir() / spec["name"] / "kernel.yaml"
    draft.parent.mkdir(parents=True)
    draft.write_text(header + yaml.safe_dump(spec, sort_keys=False))
    return tree, draft


def _rejected_record(draft: Path, message) -> dict:
    """What the probe records when the kernel rejects every case of the draft at `draft` (via finish)."""
    spec = spec_mod.load(draft)
    cases = [{"id": c.id, "status": "rejected", "message": message(c), "written": [], "roles": {},
              "deterministic": None, "finite": None, "constant_outputs": [], "notes": [], "seconds": 0.1}
             for c in jobs.cases(spec)[0]]
    finish(spec.name, "draft", draft, draft.parent / "probe.json", recorded_result(
        cases, status="failed", reason="kernel rejects every drafted case"), "9.1.2")
    return json.loads((draft.parent / "probe.json").read_text())


def _scale_message(case) -> str:
    scale = _tensor(case, "scale")
    return _match("elementwise/toy_scale.cuh", 22, scale, f"Size mismatch for shape#0: expected 1 but got {scale.shape[0]}")


def test_reviewed_specs_and_edited_drafts_are_never_repaired(home, tmp_path):
    tree, draft = _toy(home, tmp_path, header="# reviewed by a person\n")
    record = _rejected_record(draft, _scale_message)
    target = probing.select(["toy_scale"])[0]
    assert propose(target, record, lambda spec: tree, [MessageRepairer()]) is None  # no draft header
    draft.write_text(HEADER + draft.read_text())
    record = _rejected_record(draft, _scale_message)
    assert propose(target, record, lambda spec: tree, [MessageRepairer()]) is not None
    reviewed = probing.select(["rmsnorm"], reviewed=True)[0]
    assert propose(reviewed, {**record, "kind": "reviewed"}, lambda spec: tree, [MessageRepairer()]) is None


def test_a_repair_never_changes_the_entry_or_build(home, tmp_path):
    templated = copy.deepcopy(TOY_SPEC)
    templated["build"]["wrappers"][0]["entry"] = "toy::Scale<{groups}>::run"
    path = paths.drafts_dir() / "toy_scale" / "kernel.yaml"
    pinned = copy.deepcopy(templated)
    pinned["dims"].pop("groups")
    pinned["derived"] = {"groups": 1}
    for entry in pinned["shapes"]["edge"]:
        entry.pop("groups")
    assert check_repair(templated, pinned, path).startswith("needs new build variants")
    moved = copy.deepcopy(templated)
    moved["build"]["extra_cuda_cflags"] = ["-O3"]
    assert check_repair(templated, moved, path) == "changes `build`"
    assert check_repair(templated, copy.deepcopy(templated), path) == "no change"
    tree, draft = _toy(home, tmp_path, spec=templated)  # the rule itself keeps a template's dim, changing one entry
    new, note = MessageRepairer().repair("toy_scale", copy.deepcopy(templated), _rejected_record(draft, _scale_message),
                                         tree)
    assert "groups" in new["dims"] and new["arguments"][2]["shape"] == [1] and "scale shape#0: groups -> 1" in note
    assert check_repair(templated, new, draft) is None


def test_the_dry_run_writes_nothing_and_the_cli_shows_it(home, tmp_path):
    tree, draft = _toy(home, tmp_path)
    _rejected_record(draft, _scale_message)
    before = {p.name: p.read_bytes() for p in draft.parent.iterdir()}
    (row,) = dry_run(probing.select([], all_drafts=True), lambda spec: tree, [MessageRepairer()])
    assert row["repairer"] == "message" and "dim groups = 1 (derived)" in row["note"]
    assert "derived.groups: (none) -> 1" in row["changes"]
    assert {p.name: p.read_bytes() for p in draft.parent.iterdir()} == before
    env = {**os.environ, "ASTRA_HOME": str(home), "CUDA_VISIBLE_DEVICES": ""}
    proc = subprocess.run([sys.executable, "-m", "astra.cli", "probe", "--all", "--repair-dry-run", "--sglang-src",
                           str(tree.root)], capture_output=True, text=True, env=env)
    assert proc.returncode == 0, proc.stderr
    assert "1 of 1 failed draft(s) would be repaired" in proc.stdout and "toy_scale" in proc.stdout
    proc = subprocess.run([sys.executable, "-m", "astra.cli", "probe", "--all", "--repair-rounds", "-1"],
                          capture_output=True, text=True, env=env)
    assert proc.returncode == 12 and "--repair-rounds -1: give a whole number of rounds" in proc.stderr
    assert {p.name: p.read_bytes() for p in draft.parent.iterdir()} == before


# ---------------------------------------------------------------- the loop end to end on the CPU


@needs_nvcc
def test_the_loop_repairs_twice_and_the_probe_passes(home, tmp_path):
    tree, draft = _toy(home, tmp_path)
    lines: list[str] = []
    opts = probing.ProbeOptions(device="cpu", per_gpu=2, sanitizer=False, timeout_case_s=60)
    with pytest.raises(AstraError, match="--repair-rounds -1"):
        probe_with_repair(probing.select(["toy_scale"]), lambda spec: tree, opts, [MessageRepairer()], rounds=-1)
    (result,) = probe_with_repair(probing.select(["toy_scale"]), lambda spec: tree, opts, [MessageRepairer()],
                                  rounds=2, say=lines.append)
    assert result.status == "probed", result.reason
    assert (result.kept, result.total, result.written) == (2, 2, ["out (out)"])
    assert "[after 2 repair(s); last by message: " in result.reason
    said = [line for line in lines if "repaired by message" in line]
    assert "(round 1): Size mismatch for shape#0: expected 1 but got 4" in said[0] and "dim groups = 1" in said[0]
    assert "(round 2): Dtype value [float32] not in the allowed options: [int64]" in said[1]
    record = json.loads((draft.parent / "probe.json").read_text())
    assert [(r["round"], r["repairer"]) for r in record["repairs"]] == [(1, "message"), (2, "message")]
    assert record["repairs"][1]["changes"][0] == "arguments[idx].dtype: {dtype} -> int64"
    assert record["spec_sha256"] == spec_sha256(draft) and record["status"] == "probed"
    text = draft.read_text()
    assert text.startswith(HEADER) and text.count("# TODO(review): repaired by message from the kernel's message:") == 2
    raw = yaml.safe_load(text)
    assert raw["derived"] == {"groups": 1} and "groups" not in raw["dims"]
    assert raw["arguments"][3]["dtype"] == "int64" and raw["arguments"][3]["init"]["dist"] == "randint"
    assert "Repaired by message from the kernel's message: Dtype value [float32]" in raw["description"]
    previous = yaml.safe_load((draft.parent / BEFORE).read_text())  # the round-1 draft, before round 2
    assert previous["derived"] == {"groups": 1} and previous["arguments"][3]["dtype"] == "{dtype}"
    assert resolve("toy_scale").path == draft  # a probed draft: usable by check, bench and optimize
