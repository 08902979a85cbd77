"""batch_loads: an unrolled loop's loads of every iteration go before its first store. Kernels written here."""

import re
import subprocess

import pytest

from astra.optimize.passes import all_passes
from tests.astra.optimize.passes.nvcc import compiles

VEC = """
#include <cstdint>
template <typename T, int N>
struct alignas(sizeof(T) * N) Vec {
  T v[N];
  __device__ void load(const void* p) { *this = *reinterpret_cast<const Vec*>(p); }
  __device__ void store(void* p) const { *reinterpret_cast<Vec*>(p) = *this; }
  __device__ T& operator[](int i) { return v[i]; }
};
"""

# a gated residual add of one row per CTA, its pointers in a struct (no `__restrict__` can reach them)
KERNEL = VEC + """
constexpr int kHidden = 2048;
constexpr int kThreads = 128;
constexpr int kIters = kHidden / (kThreads * 4);
struct Params {
  float* out;
  const float* x;
  const float* gate;
};

__global__ void gated_add(const Params params) {
  const int row = blockIdx.x;
#pragma unroll
  for (int it = 0; it < kIters; ++it) {
    const int offset = row * kHidden + it * kThreads * 4 + threadIdx.x * 4;
    const int gate_offset = it * kThreads * 4 + threadIdx.x * 4;
    Vec<float, 4> x;
    Vec<float, 4> gate;
    Vec<float, 4> out;
    x.load(params.x + offset);
    gate.load(params.gate + gate_offset);
    for (int e = 0; e < 4; ++e) out[e] = x[e] * gate[e];
    out.store(params.out + offset);
  }
}
"""


def _apply(source: str):
    return all_passes()["batch_loads"].apply(source)


def _ptx(tmp_path, source: str) -> str:
    from harness import BuildFailure, nvcc_path

    try:
        nvcc = nvcc_path()
    except BuildFailure as err:
        pytest.skip(str(err))
    path = tmp_path / "k.cu"
    path.write_text(source)
    subprocess.run([nvcc, "-std=c++20", "-O3", "-gencode=arch=compute_90a,code=sm_90a", "-ptx", str(path), "-o",
                    str(tmp_path / "k.ptx")], check=True, capture_output=True, timeout=300)
    return (tmp_path / "k.ptx").read_text()


def _order(ptx: str) -> str:
    """The kernel's global loads and stores in program order: `l` and `s`."""
    return "".join("l" if m.group(1) == "ld" else "s" for m in re.finditer(r"\b(ld|st)\.global", ptx))


def test_every_iterations_loads_go_first_and_the_loop_reads_them_by_reference(tmp_path):
    result = _apply(KERNEL)
    assert result.applies, result.reason
    assert result.reason == "loads of every iteration issued before the stores: gated_add line 23 (x, gate; kIters iterations)"
    out = result.source
    assert "  Vec<float, 4> x_batch[kIters];\n  Vec<float, 4> gate_batch[kIters];\n#pragma unroll\n" in out
    loads = out[out.index("x_batch[kIters]"):out.index("Vec<float, 4>& x")]
    assert "x_batch[it].load(params.x + offset);" in loads and "gate_batch[it].load(params.gate + gate_offset);" in loads
    assert "out.store" not in loads
    rest = out.split("#pragma unroll")[2]
    assert "Vec<float, 4>& gate = gate_batch[it];" in rest
    assert "const int gate_offset" not in rest  # only the loads read it
    assert "const int offset" in rest and "out.store(params.out + offset);" in rest
    assert "x.load(" not in rest and out.count("#pragma unroll") == 2
    assert compiles(tmp_path, out) == ""


def test_in_the_machine_code_the_loads_no_longer_wait_for_the_stores(tmp_path):
    before = _order(_ptx(tmp_path, KERNEL))
    after = _order(_ptx(tmp_path, _apply(KERNEL).source))
    assert before.count("l") == after.count("l") == 8 and before.count("s") == after.count("s") == 4
    assert "sl" in before  # the original: a load after a store, iteration after iteration
    assert after == "l" * 8 + "s" * 4


def test_a_load_that_declares_its_value():
    src = KERNEL.replace("    Vec<float, 4> x;\n", "").replace("    x.load(params.x + offset);\n",
                                                                 "    const float4 xv = *reinterpret_cast<const float4*>(params.x + offset);\n")
    src = src.replace("out[e] = x[e] * gate[e];", "out[e] = (&xv.x)[e] * gate[e];")
    result = _apply(src)
    assert result.applies, result.reason
    assert "float4 xv_batch[kIters];" in result.source
    assert "xv_batch[it] = *reinterpret_cast<const float4*>(params.x + offset);" in result.source
    assert "const float4& xv = xv_batch[it];" in result.source


def test_an_element_updated_in_place_is_taken():
    src = KERNEL.replace("out.store(params.out + offset);", "out.store(const_cast<float*>(params.x) + offset);")
    result = _apply(src)
    assert result.applies, result.reason


SCALE = """
template <typename T, int kIters>
__global__ void scale_rows(T* y, T* x, const float* s, int n) {
  const int base = blockIdx.x * kIters * blockDim.x + threadIdx.x;
#pragma unroll
  for (int i = 0; i < kIters; i++) {
    const int idx = base + i * blockDim.x;
    const T v = x[idx];
    const float f = s[blockIdx.x];
    y[idx] = static_cast<T>(static_cast<float>(v) * f);
  }
}
template __global__ void scale_rows<float, 4>(float*, float*, const float*, int);
"""


@pytest.mark.parametrize("store, taken", [("y[idx]", True), ("x[idx]", True), ("x[idx + 1]", False)])
def test_a_store_through_a_loaded_pointer_must_write_the_element_it_read(tmp_path, store, taken):
    result = _apply(SCALE.replace("y[idx] =", f"{store} ="))
    assert result.applies == taken, result.reason
    if taken:
        assert "T v_batch[kIters];" in result.source and "float f_batch[kIters];" in result.source
        assert "const T& v = v_batch[i];" in result.source
        assert compiles(tmp_path, result.source) == ""
    else:
        assert "`x` is loaded and stored in the loop at different addresses" in result.reason


@pytest.mark.parametrize("change, reason", [
    (("#pragma unroll\n  for (int it", "  for (int it"), "not under `#pragma unroll`"),
    (("it < kIters", "it < int(params.x[0])"), "is not a compile-time constant"),
    (("    out.store(params.out + offset);\n", "    out.store(params.out + offset);\n    __syncthreads();\n"),
     "synchronises or waits (`__syncthreads`)"),
    (("out.store(params.out + offset);", "out.store(const_cast<float*>(params.x) + offset + 4);"),
     "`params.x` is loaded and stored in the loop at different addresses"),
    (("out.store(params.out + offset);", "out.store(params.out + offset);\n    if (out[0] > 1.f) break;"),
     "the loop jumps"),
    (("    out.store(params.out + offset);\n", ""), "no store follows the loads"),
    (("    out.store(params.out + offset);\n", "    out.store(params.out + offset);\n    scribble(params.out);\n"),
     "calls `scribble` with a pointer"),
    (("x.load(params.x + offset);", "x.load(params.x + offset + int(gate[0]));"),
     "the address of `x` reads another loaded value"),
])
def test_refusals(change, reason):
    src = KERNEL.replace("__global__ void gated_add", "__device__ void scribble(float* p);\n__global__ void gated_add")
    src = src.replace(*change)
    assert src != KERNEL
    result = _apply(src)
    assert not result.applies
    assert reason in result.reason, result.reason
