"""The harness side of the newer spec fields, on the CPU: absent optional tensors (None), strided views
(`row_stride`), the `scratch` role, the raw-output exchange of both, and the tolerance lookup by dtype."""

from __future__ import annotations

import pytest
import torch

from harness.candidate.exchange import CaseWriter, case_dir, read_manifest, read_trial, stored_args, tensor_file
from harness.job import ArgSpec, BuildBase, Case, Job, Variant
from harness.judge.both_sides import check_case
from harness.judge.compare import DEFAULT_TOLERANCE, gaps_unchanged, tolerance_for
from harness.judge.correctness import determinism_digests
from harness.judge.inputs import clone_inputs, has_large_trial, make_inputs, poison_outputs, set_bytes, to_call_args

TOKENS, HEADS, DIM, STRIDE = 5, 2, 8, 40  # q: [5, 2, 8] inside rows of 40 elements (a fused qkv output)


def _case(args: list[ArgSpec]) -> Case:
    return Case(id="toy/float32/tokens=5", band="decode", label="toy", dtype="float32", dims={"tokens": TOKENS},
                variant="v", bytes=1024, args=args)


def _qk_case(bias_present: bool = True) -> Case:
    return _case([ArgSpec("q", "tensor", "inout", [TOKENS, HEADS, DIM], "float32", row_stride=STRIDE),
                  ArgSpec("bias", "tensor", "in", [DIM], "float32", present=bias_present),
                  ArgSpec("ws", "tensor", "scratch", [TOKENS], "int32", {"dist": "const", "value": 0}),
                  ArgSpec("y", "tensor", "out", [TOKENS, DIM], "float32", row_stride=DIM + 3),
                  ArgSpec("eps", "scalar", "in", [], "float32", value=1e-6)])


def _job(case: Case) -> Job:
    base = BuildBase(source_root="/src", include_dirs=["/inc"], cuda_files=["toy.cuh"])
    return Job(name="toy", entry="toy", kernel_file="toy.cuh", build=base, variants={"v": Variant("v", [])},
               cases=[case], tolerance={"float32": {"atol": 1e-5, "rtol": 1e-5, "floor": 1e-6}})


def good(args):
    q, bias, ws, y, eps = args
    assert ws.eq(0).all(), "the scratch workspace must start zeroed at every call"
    ws.add_(7)
    if bias is not None:
        q.add_(bias)
    y.copy_(q.sum(dim=1) * 2)


# ---------------------------------------------------------------- inputs


def test_absent_tensor_is_none_everywhere():
    case = _qk_case(bias_present=False)
    inputs = make_inputs(case, 0, "cpu")
    assert inputs["bias"] is None and to_call_args(inputs, case.args)[1] is None
    assert clone_inputs(inputs)["bias"] is None and poison_outputs(clone_inputs(inputs), case.args)["bias"] is None
    assert set_bytes(inputs) == set_bytes({k: v for k, v in inputs.items() if k != "bias"})
    assert [a.name for a in case.tensors()] == ["q", "ws", "y"] and [n for _, n in stored_args(case)] == ["q", "y"]
    only_absent = _case([ArgSpec("x", "tensor", "in", [8], "float32", present=False)])
    assert not has_large_trial(only_absent) and make_inputs(only_absent, 0, "cpu") == {"x": None}


def test_strided_view_has_its_strides_and_a_fully_drawn_storage():
    case = _qk_case()
    q = make_inputs(case, 0, "cpu")["q"]
    assert q.shape == (TOKENS, HEADS, DIM) and q.stride() == (STRIDE, DIM, 1) and not q.is_contiguous()
    storage = q.as_strided((TOKENS * STRIDE,), (1,), 0)
    assert q.untyped_storage().nbytes() == TOKENS * STRIDE * 4
    gaps = storage.reshape(TOKENS, STRIDE)[:, HEADS * DIM:]
    assert torch.isfinite(storage).all() and gaps.std() > 0.5  # the gaps are drawn too (normal, std 1)
    assert torch.equal(make_inputs(case, 0, "cpu")["q"].as_strided((TOKENS * STRIDE,), (1,), 0), storage)
    const = _case([ArgSpec("w", "tensor", "in", [3, 4], "float16", {"dist": "const", "value": 1.5}, row_stride=6)])
    w = make_inputs(const, 0, "cpu")["w"]
    assert w.stride() == (6, 1) and w.as_strided((18,), (1,), 0).eq(1.5).all()
    assert set_bytes(make_inputs(case, 0, "cpu")) == (TOKENS * STRIDE + TOKENS * (DIM + 3)) * 4 + TOKENS * 4 + DIM * 4


def test_clone_keeps_strides_and_the_whole_storage_and_poison_only_the_view():
    inputs = make_inputs(_qk_case(), 0, "cpu")
    copy = clone_inputs(inputs)
    q, q2 = inputs["q"], copy["q"]
    assert q2.stride() == q.stride() and q2.data_ptr() != q.data_ptr()
    assert torch.equal(q2.as_strided((TOKENS * STRIDE,), (1,), 0), q.as_strided((TOKENS * STRIDE,), (1,), 0))
    poison_outputs(copy, _qk_case().args)
    y, y_before = copy["y"], inputs["y"]
    assert y.isnan().all() and y.stride() == (DIM + 3, 1)
    flat, flat_before = y.as_strided((TOKENS * (DIM + 3),), (1,), 0), y_before.as_strided((TOKENS * (DIM + 3),), (1,), 0)
    assert int(flat.isnan().sum()) == TOKENS * DIM  # the gaps keep their drawn values
    assert gaps_unchanged(y_before, y) and not gaps_unchanged(y_before, y_before + 0)  # + 0: contiguous, other layout
    assert copy["ws"].eq(0).all()  # scratch keeps its init: not poisoned
    assert torch.equal(flat[~flat.isnan()], flat_before[~flat.isnan()])


# ---------------------------------------------------------------- the judge


def test_scratch_is_not_compared_and_none_is_passed():
    def other_scratch(args):
        good(args)
        args[2].fill_(-12345)  # a different workspace use: never compared

    for present in (True, False):
        case = _qk_case(present)
        result = check_case(case, {"orig": good, "cand": other_scratch}, _job(case), "cpu")
        assert result.correct, result.reasons
        assert set(result.checks) == {"q", "y"} and result.deterministic_cand


def test_strided_values_are_compared_on_the_view():
    def wrong_row(args):
        good(args)
        args[0][TOKENS - 1, 1, DIM - 1] += 1.0

    result = check_case(_qk_case(), {"orig": good, "cand": wrong_row}, _job(_qk_case()), "cpu")
    assert not result.correct and result.checks["q"]["mismatches"] == 1 and result.checks["q"]["numel"] == TOKENS * HEADS * DIM


def test_writing_between_the_rows_of_a_strided_view_fails():
    def spill(args):
        good(args)
        args[0].as_strided((TOKENS * STRIDE,), (1,), 0)[HEADS * DIM] = 0.0  # first element of k in the caller

    result = check_case(_qk_case(), {"orig": good, "cand": spill}, _job(_qk_case()), "cpu")
    assert not result.correct and "candidate wrote outside the view of q" in result.reasons[0]
    result = check_case(_qk_case(), {"orig": spill, "cand": spill}, _job(_qk_case()), "cpu")
    assert result.correct and any("original writes between the rows of strided q" in n for n in result.notes)


def test_determinism_ignores_scratch():
    def noisy_scratch(args):
        good(args)
        args[2].copy_(torch.randint(0, 1 << 20, (TOKENS,), dtype=torch.int32))

    digests = determinism_digests(noisy_scratch, _qk_case(), 0, torch.device("cpu"))
    assert digests is not None and digests[0] == digests[1]


# ---------------------------------------------------------------- the raw-output exchange


def test_exchange_carries_a_strided_views_storage_and_skips_absent_and_scratch(tmp_path):
    case = _qk_case(bias_present=False)
    after = clone_inputs(make_inputs(case, 0, "cpu"))
    good(to_call_args(after, case.args))
    writer = CaseWriter(tmp_path, 0, case)
    writer.add_trial("seed", 0, None, after)
    writer.finish(None)
    directory = case_dir(tmp_path, 0)
    assert (directory / tensor_file(0, 0)).stat().st_size == TOKENS * STRIDE * 4
    assert not (directory / tensor_file(0, 1)).exists() and not (directory / tensor_file(0, 2)).exists()
    manifest = read_manifest(directory, case, [("seed", 0)])
    out = read_trial(directory, 0, manifest["trials"][0], case, torch.device("cpu"))
    assert set(out) == {"q", "y"} and out["q"].stride() == (STRIDE, DIM, 1)
    assert torch.equal(out["q"], after["q"]) and gaps_unchanged(after["q"], out["q"]) and gaps_unchanged(after["y"], out["y"])
    round_trip = Job.from_json(_job(case).to_json()).cases[0]
    assert [(a.present, a.row_stride) for a in round_trip.args][:2] == [(True, STRIDE), (False, None)]


# ---------------------------------------------------------------- tolerance by output dtype


def test_tolerance_lookup_by_output_dtype():
    tolerances = {"bfloat16": {"atol": 0.02, "rtol": 0.03, "floor": 0.004},
                  "float8_e4m3fn": {"atol": 0.3, "rtol": 0.2, "floor": 0.1}}
    assert tolerance_for(tolerances, "float8_e4m3fn", "bfloat16") == tolerances["float8_e4m3fn"]  # its own entry
    loosened = tolerance_for(tolerances, "float16", "bfloat16")  # case entry, loosened to float16's default
    assert loosened == {k: max(tolerances["bfloat16"][k], DEFAULT_TOLERANCE["float16"][k]) for k in loosened}
    assert tolerance_for(tolerances, "float8_e5m2", "bfloat16")["atol"] == DEFAULT_TOLERANCE["float8_e5m2"]["atol"]
    assert tolerance_for(tolerances, "float32", "bfloat16")["atol"] == 0.02  # the looser of the two
    assert tolerance_for(tolerances, "int32", "bfloat16") == {"atol": 0.0, "rtol": 0.0, "floor": 0.0}
    assert tolerance_for(tolerances, "bool", "bfloat16")["rtol"] == 0.0


# ---------------------------------------------------------------- on a GPU: the judge and its candidate process

GPU_KERNEL = r"""
#include <tvm/ffi/container/tensor.h>
#include <tvm/ffi/error.h>
#include <tvm/ffi/extra/c_env_api.h>
#include <tvm/ffi/optional.h>

#include <cuda_runtime.h>
#include <cstdint>

namespace toy {
__global__ void rows_kernel(float* q, int64_t row_stride, const float* bias, int* ws, int64_t tokens, int64_t dim) {
  const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i < tokens * dim) {
    const int64_t t = i / dim, d = i % dim;
    float* p = q + t * row_stride + d;
    *p = *p * 2.0f + (bias != nullptr ? bias[d] : 0.0f);  // BODY
    if (d == 0) ws[t] += 1;  // scratch: starts zeroed
  }
}
struct Rows {
  static void run(tvm::ffi::TensorView q, tvm::ffi::Optional<tvm::ffi::TensorView> bias, tvm::ffi::TensorView ws) {
    const int64_t tokens = q.size(0), dim = q.size(1);
    TVM_FFI_CHECK(q.stride(1) == 1 && q.stride(0) >= dim, ValueError) << "rows must be contiguous";
    const float* b = bias.has_value() ? static_cast<const float*>(bias.value().data_ptr()) : nullptr;
    const DLDevice device = q.device();
    auto stream = static_cast<cudaStream_t>(TVMFFIEnvGetStream(device.device_type, device.device_id));
    const int64_t blocks = (tokens * dim + 255) / 256;
    rows_kernel<<<static_cast<unsigned>(blocks), 256, 0, stream>>>(static_cast<float*>(q.data_ptr()), q.stride(0), b,
                                                                   static_cast<int*>(ws.data_ptr()), tokens, dim);
    const cudaError_t err = cudaGetLastError();
    if (err != cudaSuccess) TVM_FFI_THROW(RuntimeError) << cudaGetErrorString(err);
  }
};
}  // namespace toy
"""


@pytest.mark.gpu
def test_optional_strided_and_scratch_arguments_on_the_gpu(tmp_path):
    from harness.job import Options
    from harness.judge.evaluate import evaluate

    src = tmp_path / "src"
    src.mkdir()
    (src / "rows.cuh").write_text(GPU_KERNEL)

    def case(tokens: int, bias: bool) -> Case:
        return Case(id=f"rows/float32/tokens={tokens},bias={int(bias)}", band="decode", label="rows",
                    dtype="float32", dims={"tokens": tokens}, variant="v", bytes=2 * tokens * 64 * 4, timed=tokens > 8,
                    args=[ArgSpec("q", "tensor", "inout", [tokens, 64], "float32", row_stride=3 * 64 + 8),
                          ArgSpec("bias", "tensor", "in", [64], "float32", present=bias),
                          ArgSpec("ws", "tensor", "scratch", [tokens], "int32", {"dist": "const", "value": 0})])

    def job(candidate: str | None) -> Job:
        return Job(name="rows", entry="rows", kernel_file="rows.cuh",
                   build=BuildBase(source_root=str(src), include_dirs=[], cuda_files=["rows.cuh"]),
                   variants={"v": Variant("v", [["rows", "toy::Rows::run"]])},
                   cases=[case(5, True), case(5, False), case(4096, True)],
                   tolerance={"float32": {"atol": 1e-6, "rtol": 1e-6, "floor": 1e-6}}, candidate_source=candidate,
                   options=Options(budget_ms_per_case=50.0, sanitizer=False, cache_dir=str(tmp_path / "builds")))

    verdict = evaluate(job(None))
    assert verdict.status == "correct", verdict.reason
    assert all(set(c.checks) == {"q"} for c in verdict.cases) and verdict.cases[-1].timings
    spill = GPU_KERNEL.replace("if (d == 0) ws[t] += 1;", "if (d == 0) { ws[t] += 1; p[dim] = 0.0f; }")
    verdict = evaluate(job(spill))
    assert verdict.status == "incorrect" and "candidate wrote outside the view of q" in verdict.reason, verdict.reason
