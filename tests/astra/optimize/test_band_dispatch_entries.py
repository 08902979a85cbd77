"""Band dispatch with a function-template entry (as SGLang's qsa_index_q_prep<T, TOut, kHeadDim, ...>), and
with the original as the large-token side when no candidate won there. The kernel is written here; the
candidate verdicts are SYNTHETIC (tests/verdicts.py), standing in for the GPU's."""

from __future__ import annotations

import subprocess
from types import SimpleNamespace

import pytest

from astra.optimize.band_dispatch import SUFFIX_HIGH, SUFFIX_LOW, combine, try_band_dispatch
from astra.optimize.evaluator import Evaluator
from astra.optimize.rundir import HistoryEntry, RunDir
from harness.building.toolchain import nvcc_path
from tests.toolchain import needs_nvcc
from tests.verdicts import make_verdict

ORIGINAL = """#pragma once
#include <tvm/ffi/container/tensor.h>
#include <cuda_runtime.h>

namespace demo {

struct ScaleParams {
  float* x;
  int64_t n;
  float factor;
};

template <typename T, int kThreads>
__global__ __launch_bounds__(128) void scale_kernel(const ScaleParams params) {
  const int64_t i = static_cast<int64_t>(blockIdx.x) * 128 + threadIdx.x;
  if (i < params.n) params.x[i] *= params.factor;
}

template <typename T, int kThreads>
void scale_rows(tvm::ffi::TensorView x, double factor) {
  const ScaleParams params{static_cast<float*>(x.data_ptr()), x.size(0) * x.size(1), static_cast<float>(factor)};
  scale_kernel<T, kThreads><<<(params.n + 127) / 128, 128>>>(params);
}

}  // namespace demo
"""
LOW = ORIGINAL.replace("128", "256")


def _tvm_includes() -> list[str]:
    from tvm_ffi import libinfo

    return list(dict.fromkeys([libinfo.find_include_path(), libinfo.find_dlpack_include_path()]))


def _combined(tmp_path, low=LOW, high=ORIGINAL) -> str:
    return combine(low, high, entry="scale_rows<float, 64>", token_arg=("x", 0), threshold=64,
                   kernel_file="scale.cuh", parse_dir=tmp_path, include_dirs=_tvm_includes())


def test_a_function_template_entry_is_forwarded_with_its_template_arguments(tmp_path):
    text = _combined(tmp_path)
    # the small form: the original whole, each declaration LOW changes copied before it, renamed
    assert text.count("namespace demo {") == 1 and SUFFIX_HIGH not in text
    assert f"__launch_bounds__(256) void scale_kernel{SUFFIX_LOW}(const ScaleParams params)" in text
    assert f"scale_kernel{SUFFIX_LOW}<T, kThreads><<<(params.n + 127) / 256, 256>>>" in text
    assert "scale_kernel<T, kThreads><<<(params.n + 127) / 128, 128>>>" in text
    assert text.count("struct ScaleParams {") == 1  # unchanged: not copied
    entry = text[text.index("void scale_rows(tvm::ffi::TensorView x, double factor) {"):]
    assert entry.startswith("void scale_rows(tvm::ffi::TensorView x, double factor) {\n  if (x.size(0) <= 64) {")
    assert f"return scale_rows{SUFFIX_LOW}<T, kThreads>(x, factor);" in entry
    assert text.index(f"void scale_rows{SUFFIX_LOW}(") < text.index("void scale_rows(")  # declared before its use


def test_a_function_template_entry_is_forwarded_whole_when_the_versions_differ_in_what_they_declare(tmp_path):
    text = _combined(tmp_path, low=LOW.replace("struct ScaleParams {", "constexpr int kSpare = 1;\n\nstruct ScaleParams {"))
    dispatcher = text[text.index("// Astra band dispatch"):]
    assert "namespace demo {" in dispatcher  # the entry is named as the export sees it; the parse knows where
    assert "template <typename T, int kThreads>\ninline void scale_rows(tvm::ffi::TensorView x, double factor)" in dispatcher
    assert f"scale_rows{SUFFIX_LOW}<T, kThreads>(x, factor);" in dispatcher
    assert f"scale_rows{SUFFIX_HIGH}<T, kThreads>(x, factor);" in dispatcher
    assert f"scale_kernel{SUFFIX_HIGH}<T, kThreads><<<(params.n + 127) / 128, 128>>>" in text


@needs_nvcc
def test_the_combined_function_template_builds(tmp_path):
    source = tmp_path / "combined.cu"
    source.write_text(_combined(tmp_path) + "\ntemplate void demo::scale_rows<float, 64>(tvm::ffi::TensorView, double);\n")
    done = subprocess.run([nvcc_path(), "-arch=sm_90a", "-std=c++17", *(f"-I{d}" for d in _tvm_includes()),
                           "--cubin", str(source), "-o", str(tmp_path / "k.cubin")],
                          capture_output=True, text=True, timeout=400)
    assert done.returncode == 0, done.stderr[-1500:]
    cubin = (tmp_path / "k.cubin").read_bytes()
    assert f"scale_kernel{SUFFIX_LOW}".encode() in cubin and b"12scale_kernel" in cubin  # both versions built


def _with_tokens(verdict, tokens: dict[str, int]):
    for case in verdict.cases:
        case.dims = {"tokens": tokens[case.id]}
    return verdict


SPEC = SimpleNamespace(raw={"shapes": {"token_dim": "tokens"}, "arguments": [{"name": "x", "shape": ["tokens", "hidden"]}],
                            "build": {"wrappers": [{"export": "scale", "entry": "scale_rows<float, 64>"}]}},
                       kernel_file="scale.cuh")


def _run_with_candidate(speedups: dict, tokens: dict[str, int]) -> tuple[RunDir, int]:
    """A run of ORIGINAL whose one candidate (LOW) was verified correct with these per-band speedups and
    not accepted (slower somewhere): what band dispatch starts from."""
    run = RunDir.create("demo", "0.5.23", "offline", ORIGINAL)
    n = run.add_candidate(LOW, {"name": "param:warps=256", "description": "256 threads"})
    run.save_verdict(n, _with_tokens(make_verdict(speedups), tokens))
    state = run.state()
    state.history.append(HistoryEntry(n=n, round=1, name="param:warps=256", status="correct", score=1.0,
                                      accepted=False, why="slower on some shape"))
    run.save(state)
    return run, n


def test_a_small_token_win_is_dispatched_with_the_original_above(tmp_path):
    """No candidate is the run's best (the 256-thread one is slower on large token counts), so the original
    takes the large ones: the split is after the bands the winner won (decode: 64 tokens), not after middle."""
    tokens = {"decode0": 1, "decode1": 64, "middle0": 1024, "prefill0": 16384}
    run, n = _run_with_candidate({"decode": [1.5, 1.4], "middle": 1.0, "prefill": 0.93}, tokens)
    tree = SimpleNamespace(csrc_dir=tmp_path, include_dir=_tvm_includes()[0])
    judged: list = []

    def evaluate(source, label):
        judged.append((source, label))
        return _with_tokens(make_verdict({"decode": [1.5, 1.4], "middle": 1.0, "prefill": 1.0}), tokens)

    lines: list = []
    best = try_band_dispatch(run, SPEC, tree, Evaluator(evaluate), lines.append)
    assert best == n + 1 and run.state().best == n + 1
    source, label = judged[0]
    assert label == "band-dispatch:#001<= 64<original" and "if (x.size(0) <= 64)" in source
    assert "scale_kernel<T, kThreads><<<(params.n + 127) / 128, 128>>>" in source  # the original above
    assert f"scale_kernel{SUFFIX_LOW}<T, kThreads><<<(params.n + 127) / 256, 256>>>" in source
    assert run.candidate(best)[1]["description"] == "#001 up to 64 tokens, the original above"
    assert "ACCEPTED" in lines[-1]


@pytest.fixture(autouse=True)
def _home(tmp_path, monkeypatch):
    monkeypatch.setenv("ASTRA_HOME", str(tmp_path / "home"))


def test_a_winner_not_verified_on_decode_is_not_dispatched_to_it(tmp_path):
    """A middle-only leader would run the decode shapes too, where it was never verified faster: skipped."""
    run, _ = _run_with_candidate({"decode": 0.95, "middle": 1.3, "prefill": 0.93},
                                 {"decode0": 1, "middle0": 1024, "prefill0": 16384})
    judged, lines = [], []
    assert try_band_dispatch(run, SPEC, SimpleNamespace(csrc_dir=tmp_path, include_dir=_tvm_includes()[0]),
                             Evaluator(lambda source, label: judged.append(label)), lines.append) is None
    assert judged == [] and "not verified faster on decode" in lines[-1]
