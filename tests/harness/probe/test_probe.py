"""The probe of an ORIGINAL kernel on the CPU: the per-case observation (harness.probe.observation) driven with Python
kernels on CPU tensors, the module rule (`decide`), and the processes (harness.probe.processes): a case that
segfaults or hangs costs that case only, memcheck runs the case runner under a stand-in compute-sanitizer,
and a real host-only kernel built with nvcc goes through build, load and the tvm-ffi error path."""

from __future__ import annotations

import os
import signal
import stat
import sys
import time
from pathlib import Path

import pytest
import torch

from harness.job import ArgSpec, BuildBase, Case, Job, Options, Variant
from harness.probe.observation import decide, is_constant, kernel_message, merge_roles, probe_case, relative_paths
from harness.probe.processes import PROBE_LAUNCH_ENV, probe_isolated, probe_job
from tests.harness.worker.test_sanitizer import CLEAN_LOG, FAKE_TOOL, MEMCHECK_LOG
from tests.toolchain import needs_nvcc

THIS = Path(__file__).resolve()
MATCH_ERROR = ("Tensor match failed for Tensor<3, 8>[strides=<8, 1>, dtype=float32] at toy.cuh:9\n"
               "- Root cause: Size mismatch for tokens: expected a multiple of 2 but got 3")


def tensor(name: str, role: str = "in", shape=(4, 8), dtype: str = "float32", **init) -> ArgSpec:
    return ArgSpec(name, "tensor", role, list(shape), dtype, init or {"dist": "normal", "mean": 0.0, "std": 1.0})


def make_case(tokens: int = 4, args: list[ArgSpec] | None = None) -> Case:
    args = args or [tensor("y", "out", (tokens, 8)), tensor("x", "in", (tokens, 8))]
    return Case(id=f"toy/float32/tokens={tokens}", band="decode", label="toy", dtype="float32",
                dims={"tokens": tokens}, variant="v", bytes=64 * tokens, args=args, timed=False)


def double(args):
    y, x = args
    y.copy_(x * 2)


# ---------------------------------------------------------------- one case, in process


def test_a_kernel_that_writes_its_output():
    result = probe_case(double, make_case(), "cpu")
    assert result["status"] == "kept" and result["written"] == ["y"]
    assert result["roles"] == {"y": "out", "x": "in"}
    assert result["deterministic"] is True and result["finite"] is True and result["constant_outputs"] == []


def test_a_kernel_that_accumulates_is_inout():
    def accumulate(args):
        acc, x = args
        acc.add_(x)

    result = probe_case(accumulate, make_case(args=[tensor("acc", "out"), tensor("x")]), "cpu")
    assert result["roles"] == {"acc": "inout", "x": "in"}
    assert result["deterministic"] is True


def test_a_nondeterministic_workspace_is_scratch():
    def with_workspace(args):
        y, ws, x = args
        ws.copy_(torch.rand(ws.shape))  # a fresh draw each call: never the same twice
        y.copy_(x * 2)

    case = make_case(args=[tensor("y", "in"), tensor("ws", "out", (16,)), tensor("x")])
    result = probe_case(with_workspace, case, "cpu")
    assert result["roles"] == {"y": "out", "ws": "scratch", "x": "in"}  # y drafted "in": observation wins
    assert result["deterministic"] is True and sorted(result["written"]) == ["ws", "y"]


def test_a_single_nondeterministic_output_is_not_scratch():
    def noisy(args):
        y, x = args
        y.copy_(x + torch.rand(x.shape))

    result = probe_case(noisy, make_case(), "cpu")
    assert result["deterministic"] is False and result["roles"]["y"] in ("out", "inout")
    status, reason = decide([result], None)
    assert status == "failed" and "differ between two identical runs" in reason


def test_a_rejected_shape_keeps_the_kernels_own_message():
    def picky(args):
        y, x = args
        if x.shape[0] % 2:
            raise RuntimeError(MATCH_ERROR)
        double(args)

    rejected = probe_case(picky, make_case(tokens=3), "cpu")
    assert rejected["status"] == "rejected" and rejected["written"] == []
    assert rejected["message"].startswith("RuntimeError: Tensor match failed for Tensor<3, 8>")
    assert "Root cause: Size mismatch for tokens: expected a multiple of 2 but got 3" in rejected["message"]
    kept = probe_case(picky, make_case(tokens=4), "cpu")
    status, reason = decide([rejected, kept], None)
    assert status == "probed" and "1/2 cases kept" in reason and "1 rejected" in reason and "y (out)" in reason
    status, reason = decide([rejected], None)
    assert status == "failed" and reason.startswith("kernel rejects every drafted case: RuntimeError: Tensor match")


def test_a_kernel_that_writes_nothing_fails_the_module():
    result = probe_case(lambda args: None, make_case(), "cpu")
    assert result["status"] == "noop" and result["written"] == [] and result["roles"] == {"y": "in", "x": "in"}
    status, reason = decide([result], {"findings": [], "ok": True, "skipped": None, "unavailable": None})
    assert status == "failed" and "accepts the call but writes no tensor" in reason


def test_a_case_where_the_original_writes_nothing_is_excluded():
    """A kernel that is a no-op on some inputs (nothing to do for one token) keeps the cases where it works;
    the others are excluded, since a candidate that does nothing would pass them."""
    def skips_one_token(args):
        y, x = args
        if x.shape[0] > 1:
            y.copy_(x * 2)

    one, four = probe_case(skips_one_token, make_case(1), "cpu"), probe_case(skips_one_token, make_case(4), "cpu")
    assert one["status"] == "noop" and "cannot tell a candidate from one that does nothing" in one["message"]
    assert four["status"] == "kept"
    status, reason = decide([one, four], {"findings": [], "ok": True, "skipped": None, "unavailable": None})
    assert status == "probed" and "1/2 cases kept" in reason and "1 noop" in reason


def test_constant_and_nonfinite_outputs():
    def fill(args):
        args[0].fill_(1.5)

    constant = probe_case(fill, make_case(), "cpu")
    assert constant["constant_outputs"] == ["y"]
    status, reason = decide([constant], None)
    assert status == "probed" and "constant output(s) in some case: y" in reason

    def divide(args):
        y, x = args
        y.copy_(x / 0.0)

    nonfinite = probe_case(divide, make_case(), "cpu")
    assert nonfinite["finite"] is False
    assert decide([nonfinite], None) == ("failed", f"case {nonfinite['id']}: NaN/Inf from finite inputs in: y")
    assert is_constant(torch.full((3,), float("nan"))) and not is_constant(torch.ones(1))
    assert is_constant(torch.ones(4, dtype=torch.bool)) and not is_constant(torch.arange(3))


def test_an_in_place_alias_and_inputs_that_cannot_be_made():
    def scale_in_place(args):
        x, out = args
        out.mul_(3)

    alias = ArgSpec("out", "tensor", "alias", [4, 8], "float32", alias="x")
    result = probe_case(scale_in_place, make_case(args=[tensor("x", "inout"), alias]), "cpu")
    assert result["roles"] == {"x": "inout", "out": "alias"} and sorted(result["written"]) == ["out", "x"]
    bad = make_case(args=[tensor("y", "out"), tensor("idx", "in", (4,), "int64", dist="perm", high=2)])
    broken = probe_case(double, bad, "cpu")
    assert broken["status"] == "error" and "perm needs 4 distinct values below 2" in broken["message"]
    assert decide([broken], None)[1].endswith("fix the draft's shapes or init")


def test_roles_merge_across_cases():
    def case(roles, ident="c"):
        return {"id": ident, "status": "kept", "roles": roles, "written": [n for n, r in roles.items() if r != "in"]}

    assert merge_roles([case({"y": "in"}), case({"y": "out"})]) == ({"y": "out"}, [])
    assert merge_roles([case({"y": "out"}), case({"y": "inout"})]) == ({"y": "inout"}, [])
    roles, conflicts = merge_roles([case({"ws": "scratch"}, "a"), case({"ws": "out"}, "b")])
    assert conflicts == ["ws is scratch in a but out in b"]


def test_kernel_message_is_one_line():
    assert kernel_message(RuntimeError(MATCH_ERROR)) == (
        "RuntimeError: Tensor match failed for Tensor<3, 8>[strides=<8, 1>, dtype=float32] at toy.cuh:9 "
        "(Root cause: Size mismatch for tokens: expected a multiple of 2 but got 3)")
    assert kernel_message(ValueError("x" * 1000)).endswith("...") and len(kernel_message("a\nb")) == 1
    assert kernel_message(RuntimeError("Failed at /src/k.cuh:148:\nCheck failed: n > 0")) == (
        "RuntimeError: Failed at /src/k.cuh:148: Check failed: n > 0")
    result = {"message": "RuntimeError: Failed at /t/sglang/csrc/elementwise/k.cuh:148: bad", "notes": ["/t/inc/x.h"]}
    assert relative_paths(result, ["/t/sglang/csrc", "/t/inc/"]) == {
        "message": "RuntimeError: Failed at elementwise/k.cuh:148: bad", "notes": ["x.h"]}


# ---------------------------------------------------------------- processes: crash, hang, memcheck


def stand_in_launches(job: Job) -> dict:
    """ASTRA_HARNESS_PROBE_LAUNCH target: by token count, 2 segfaults, 3 hangs, 5 raises, 7 accumulates but
    segfaults when y holds NaN (as a kernel reading garbage indices would), else y = 2x."""

    def launch(args):
        y, x = args
        tokens = x.shape[0]
        if tokens == 2 or (tokens == 7 and torch.isnan(y).any()):
            os.kill(os.getpid(), signal.SIGSEGV)
        if tokens == 7:
            y.add_(x)
            return
        if tokens == 3:
            time.sleep(600)
        if tokens == 5:
            raise RuntimeError(MATCH_ERROR)
        y.copy_(x * 2)

    return {"v": launch}


def broken_launches(job: Job) -> dict:
    raise OSError("libtvm_ffi.so: cannot open shared object file")


def stand_in_job(tokens: list[int]) -> Job:
    return Job(name="toy", entry="scale", kernel_file="toy.cuh",
               build=BuildBase(source_root="/nonexistent", include_dirs=[], cuda_files=["toy.cuh"]),
               variants={"v": Variant("v", [["scale", "toy::Scale::run"]])}, cases=[make_case(t) for t in tokens],
               tolerance={}, options=Options(seeds=[0], modes=[]))


def hook_env(function: str) -> dict[str, str]:
    return {**os.environ, PROBE_LAUNCH_ENV: f"{THIS}:{function}"}


def test_a_crash_or_a_hang_costs_one_case_only():
    start = time.monotonic()
    result = probe_job(stand_in_job([1, 2, 4, 3, 5, 6]), device="cpu", timeout_case_s=3, sanitizer=False,
                       env=hook_env("stand_in_launches"))
    assert time.monotonic() - start < 60
    statuses = {case["id"].rsplit("=", 1)[1]: case["status"] for case in result["cases"]}
    assert statuses == {"1": "kept", "2": "crashed", "4": "kept", "3": "hung", "5": "rejected", "6": "kept"}
    crashed = next(case for case in result["cases"] if case["status"] == "crashed")
    assert crashed["message"] == "the case runner killed by SIGSEGV: Fatal Python error: Segmentation fault"
    assert "in launch" in crashed["stderr_tail"]  # faulthandler's stack of the runner
    hung = next(case for case in result["cases"] if case["status"] == "hung")
    assert "no result within 3 s" in hung["message"] and "tokens=3" in hung["message"]  # the runner's last log line
    assert result["status"] == "probed" and "1 rejected, 1 crashed, 1 hung" in result["reason"]
    assert result["env"]["torch"] == torch.__version__.split("+")[0] or result["env"]["torch"]


def test_a_crash_with_a_tensor_poisoned_shows_that_tensor_is_read():
    result = probe_job(stand_in_job([7, 4]), device="cpu", timeout_case_s=10, sanitizer=False,
                       env=hook_env("stand_in_launches"))
    poisoned, plain = result["cases"]
    assert poisoned["status"] == "kept" and poisoned["roles"] == {"y": "inout", "x": "in"}
    assert poisoned["notes"] == ["with y poisoned the original crashed (killed by SIGSEGV): its prior content is read"]
    assert plain["roles"] == {"y": "out", "x": "in"}
    assert result["status"] == "probed" and "2/2 cases kept; writes y (inout)" in result["reason"]  # the safe merge


def test_a_draft_that_crashes_every_case_is_given_up_early(monkeypatch):
    monkeypatch.setattr("harness.probe.processes.LOST_BEFORE_GIVING_UP", 2)
    result = probe_job(stand_in_job([2, 2, 2, 4]), device="cpu", timeout_case_s=10, sanitizer=False,
                       env=hook_env("stand_in_launches"))
    assert [case["status"] for case in result["cases"]] == ["crashed", "crashed"]
    assert result["status"] == "failed" and result["reason"].startswith(
        "the original crashed or hung on each of the first 2 cases it ran (last: the case runner killed by SIGSEGV")
    assert result["reason"].endswith("2 more not run: check the draft's shapes and init")


def test_a_runner_that_cannot_load_the_module_ends_the_probe():
    result = probe_job(stand_in_job([1, 4]), device="cpu", timeout_case_s=5, sanitizer=False,
                       env=hook_env("broken_launches"))
    assert result["status"] == "failed" and result["cases"] == []
    assert result["reason"] == "the original module failed to load: OSError: libtvm_ffi.so: cannot open shared object file"


@pytest.fixture
def fake_sanitizer(tmp_path, monkeypatch) -> Path:
    """A stand-in compute-sanitizer first on PATH that runs the command and writes logs/<tool>.log."""
    bin_dir, logs = tmp_path / "bin", tmp_path / "logs"
    bin_dir.mkdir()
    logs.mkdir()
    tool = bin_dir / "compute-sanitizer"
    tool.write_text(FAKE_TOOL.format(python=sys.executable))
    tool.chmod(tool.stat().st_mode | stat.S_IEXEC)
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.setenv("FAKE_LOG_DIR", str(logs))
    return logs


def test_memcheck_runs_the_original_on_the_smallest_kept_case(fake_sanitizer):
    (fake_sanitizer / "memcheck.log").write_text(MEMCHECK_LOG)
    result = probe_job(stand_in_job([6, 5, 4]), device="cpu", timeout_case_s=10, env=hook_env("stand_in_launches"))
    assert result["sanitizer"]["case"] == "toy/float32/tokens=4"  # 5 is smaller but rejected
    assert result["status"] == "failed" and result["reason"].startswith("memcheck: Invalid __global__ read")
    (fake_sanitizer / "memcheck.log").write_text(CLEAN_LOG)
    clean = probe_job(stand_in_job([4]), device="cpu", timeout_case_s=10, env=hook_env("stand_in_launches"))
    assert clean["status"] == "probed" and clean["sanitizer"]["ok"] and clean["sanitizer"]["skipped"] is None
    assert clean["sanitizer"]["runs"][0]["returncode"] == 0


def test_memcheck_missing_means_not_probed(monkeypatch, tmp_path):
    monkeypatch.setenv("PATH", str(Path(sys.executable).parent))
    monkeypatch.setenv("CUDA_HOME", str(tmp_path))
    result = probe_isolated(stand_in_job([4]), timeout_s=120, device="cpu", env=hook_env("stand_in_launches"))
    assert result["status"] == "failed" and "not probed: compute-sanitizer could not check it" in result["reason"]
    assert result["cases"][0]["roles"] == {"y": "out", "x": "in"}


# ---------------------------------------------------------------- a real host-only kernel, built with nvcc

KERNEL = r"""
#include <tvm/ffi/container/tensor.h>
#include <cstdint>
#include <stdexcept>

namespace toy {
struct Accumulate {
  static void run(tvm::ffi::TensorView acc, tvm::ffi::TensorView x, double alpha) {
    const int64_t n = x.numel();
    if (x.size(0) == 3) {
      throw std::runtime_error("Tensor match failed for Tensor<3, 8> at toy.cuh:10\n- Root cause: tokens must be even");
    }
    if (x.size(0) == 2) *static_cast<volatile int*>(nullptr) = 1;
    float* out = static_cast<float*>(acc.data_ptr());
    const float* in = static_cast<const float*>(x.data_ptr());
    for (int64_t i = 0; i < n; ++i) out[i] += in[i] * static_cast<float>(alpha);
  }
};
}  // namespace toy
"""



@needs_nvcc
def test_a_real_kernel_built_with_nvcc(tmp_path):
    (tmp_path / "toy.cuh").write_text(KERNEL)
    cases = [make_case(t, [tensor("acc", "out", (t, 8)), tensor("x", "in", (t, 8)),
                           ArgSpec("alpha", "scalar", "in", [], "float32", value=0.5)]) for t in (4, 3, 2, 1)]
    job = Job(name="toy_probe", entry="accumulate", kernel_file="toy.cuh",
              build=BuildBase(source_root=str(tmp_path), include_dirs=[], cuda_files=["toy.cuh"]),
              variants={"v": Variant("v", [["accumulate", "toy::Accumulate::run"]])}, cases=cases, tolerance={},
              candidate_source="// ignored: a probe builds the original only\n",
              options=Options(cache_dir=str(tmp_path / "builds"), seeds=[0], modes=[]))
    result = probe_isolated(job, timeout_s=600, device="cpu", timeout_case_s=30, sanitizer=False)
    assert [c["status"] for c in result["cases"]] == ["kept", "rejected", "crashed", "kept"], result["reason"]
    assert [b["side"] for b in result["builds"]] == ["orig"]
    assert result["cases"][0]["roles"] == {"acc": "inout", "x": "in"}
    assert result["cases"][1]["message"] == ("RuntimeError: Tensor match failed for Tensor<3, 8> at toy.cuh:10 "
                                             "(Root cause: tokens must be even)")
    assert "SIGSEGV" in result["cases"][2]["message"]
    assert result["status"] == "probed" and "acc (inout)" in result["reason"]


# ---------------------------------------------------------------- on a GPU: a CUDA kernel that reads what it writes

GATHER = r"""
#include <tvm/ffi/container/tensor.h>
#include <tvm/ffi/error.h>
#include <tvm/ffi/extra/c_env_api.h>
#include <cuda_runtime.h>
#include <cstdint>
#include <stdexcept>
#include <string>

namespace toy {
__global__ void gather_kernel(float* out, int32_t* idx, const float* x, int64_t n) {
  const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i < n) {
    const int32_t j = idx[i];  // read as an index: a poisoned idx (INT32_MIN) faults
    out[i] = x[j] * 2.0f;
    idx[i] = static_cast<int32_t>((j + 1) % n);  // and written back: idx is inout
  }
}

struct Gather {
  static void run(tvm::ffi::TensorView out, tvm::ffi::TensorView idx, tvm::ffi::TensorView x) {
    const int64_t n = x.numel();
    if (n % 2) throw std::runtime_error("Failed at gather.cuh:20:\nn must be even, got " + std::to_string(n));
    const DLDevice device = x.device();
    auto stream = static_cast<cudaStream_t>(TVMFFIEnvGetStream(device.device_type, device.device_id));
    gather_kernel<<<static_cast<unsigned>((n + 255) / 256), 256, 0, stream>>>(
        static_cast<float*>(out.data_ptr()), static_cast<int32_t*>(idx.data_ptr()),
        static_cast<const float*>(x.data_ptr()), n);
  }
};
}  // namespace toy
"""


@pytest.mark.gpu
def test_a_cuda_kernel_that_faults_with_its_index_tensor_poisoned(tmp_path):
    (tmp_path / "gather.cuh").write_text(GATHER)

    def case(n: int) -> Case:
        return make_case(n, [tensor("out", "in", (n,)), tensor("idx", "out", (n,), "int32", dist="randint", high=n),
                             tensor("x", "in", (n,))])

    job = Job(name="gather", entry="gather", kernel_file="gather.cuh",
              build=BuildBase(source_root=str(tmp_path), include_dirs=[], cuda_files=["gather.cuh"]),
              variants={"v": Variant("v", [["gather", "toy::Gather::run"]])}, cases=[case(4096), case(33), case(64)],
              tolerance={}, options=Options(cache_dir=str(tmp_path / "builds"), seeds=[0], modes=[]))
    result = probe_isolated(job, timeout_s=600, timeout_case_s=60)
    assert [c["status"] for c in result["cases"]] == ["kept", "rejected", "kept"], result
    first = result["cases"][0]
    assert first["roles"] == {"out": "out", "idx": "inout", "x": "in"}
    assert first["notes"] and first["notes"][0].startswith("with idx poisoned the original crashed (")
    assert "illegal memory access" in first["notes"][0]
    assert result["cases"][1]["message"] == "RuntimeError: Failed at gather.cuh:20: n must be even, got 33"
    assert result["sanitizer"]["case"] == "toy/float32/tokens=64" and result["sanitizer"]["ok"], result["sanitizer"]
    assert result["status"] == "probed" and result["env"]["gpu"], result["reason"]
