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
    assert "float4 const& xv = xv_batch[it];" in result.source


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
        assert "T const& v = v_batch[i];" in result.source
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
    (("    out.store(params.out + offset);\n", ""), "no store through a pointer follows the loads"),
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


MAIN = """
#include <cstdio>
#include <cstring>
#include <vector>
#include <cuda_runtime.h>

// the original and the pass's output of the same kernel, run on the same inputs: out of place, and in place
// (the output the input), each compared bit for bit

int main() {
  const int rows = 64, n = rows * kHidden;
  std::vector<float> x(n), gate(kHidden);
  for (int i = 0; i < n; ++i) x[i] = (i % 977) * 0.25f - 100.f;
  for (int i = 0; i < kHidden; ++i) gate[i] = (i % 13) * 0.5f - 3.f;
  float *dx, *dgate, *dout;
  cudaMalloc(&dx, n * 4); cudaMalloc(&dgate, kHidden * 4); cudaMalloc(&dout, n * 4);
  cudaMemcpy(dgate, gate.data(), kHidden * 4, cudaMemcpyHostToDevice);
  std::vector<float> results[4];
  for (int k = 0; k < 4; ++k) {
    cudaMemcpy(dx, x.data(), n * 4, cudaMemcpyHostToDevice);
    cudaMemset(dout, 0, n * 4);
    const bool in_place = k >= 2;
    float* out = in_place ? dx : dout;
    if (k % 2 == 0) original::gated_add<<<rows, kThreads>>>(original::Params{out, dx, dgate});
    else batched::gated_add<<<rows, kThreads>>>(batched::Params{out, dx, dgate});
    if (cudaDeviceSynchronize() != cudaSuccess) { printf("launch failed\\n"); return 1; }
    results[k].resize(n);
    cudaMemcpy(results[k].data(), out, n * 4, cudaMemcpyDeviceToHost);
  }
  const bool same = !memcmp(results[0].data(), results[1].data(), n * 4);
  const bool same_in_place = !memcmp(results[2].data(), results[3].data(), n * 4);
  const bool computed = results[0][5] == x[5] * gate[5];
  printf("out of place %s, in place %s, computed %s\\n", same ? "same" : "differ", same_in_place ? "same" : "differ",
         computed ? "yes" : "no");
  return 0;
}
"""


@pytest.mark.gpu
def test_on_the_gpu_the_output_is_the_originals_bit_for_bit_in_place_too(tmp_path):
    from harness import nvcc_path

    batched = _apply(KERNEL).source
    program = ("#include <cstdint>\nconstexpr int kHidden = 2048;\nconstexpr int kThreads = 128;\n"
               f"namespace original {{\n{KERNEL.replace('#include <cstdint>', '')}\n}}\n"
               f"namespace batched {{\n{batched.replace('#include <cstdint>', '')}\n}}\n" + MAIN)
    path = tmp_path / "main.cu"
    path.write_text(program)
    subprocess.run([nvcc_path(), "-std=c++20", "-O3", "-arch=native", str(path), "-o", str(tmp_path / "main")],
                   check=True, capture_output=True, timeout=300)
    proc = subprocess.run([str(tmp_path / "main")], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert proc.stdout.strip() == "out of place same, in place same, computed yes"


LOOP = VEC + """
__device__ float* g_p;
__device__ void advance(int& off) { off += 512; }
__device__ void bump(int i) { g_p += i; }
__device__ void block_sync() { __syncthreads(); }
__device__ int g_count;
__device__ void guarded_add(int i) { if (i > 2) atomicAdd(&g_count, i); }
struct Cursor {
  const float* p;
  __device__ const float* get() const { return p; }
  __device__ void next() { p += 512; }
};
struct Bufs { float* out; const float* in; };
__device__ void put(Bufs b, int i, float v);

__global__ void k(float* out, const float* in, float* acc, const float* part, const int* ids, const float* table,
                  Bufs bufs, Cursor it, int base) {
  int off = blockIdx.x * 2048 + threadIdx.x;
#pragma unroll
  for (int i = 0; i < 4; ++i) {
BODY
  }
}
"""


@pytest.mark.parametrize("body, reason", [
    # the address reads, through an index, a variable the loop changes afterwards
    ("    const int idx = base + threadIdx.x * 4;\n    Vec<float, 4> x;\n    x.load(in + idx);\n    x.store(out + idx);\n"
     "    base += 512;", "reads `base`, which the loop changes"),
    ("    const float v = in[off];\n    out[off] = v;\n    advance(off);", "reads `off`, which the loop changes"),
    ("    const float v = bufs.in[threadIdx.x];\n    bufs.out[threadIdx.x] = v;\n    bufs.in += 128;",
     "reads `bufs`, which the loop changes"),
    ("    const float v = *it.get();\n    out[threadIdx.x + i * 128] = v;\n    it.next();",
     "the loop calls `next`, which writes a member"),
    # a gather: the address reads a value loaded before it, through an index
    ("    const int id = ids[blockIdx.x * 4 + i];\n    const int o = id * 512 + threadIdx.x * 4;\n    Vec<float, 4> x;\n"
     "    x.load(table + o);\n    x.store(out + blockIdx.x * 2048 + i * 512 + threadIdx.x * 4);",
     "reads another loaded value"),
    # in place at an element every iteration shares: each iteration must read the one before's sum
    ("    const int idx = blockIdx.x * 128 + threadIdx.x;\n    const float prev = acc[idx];\n"
     "    const float p = part[i * 4096 + idx];\n    acc[idx] = prev + p;", "does not move with `i` alone"),
    ("    const int idx = (i % 2) * 128 + threadIdx.x;\n    const float prev = acc[idx];\n    acc[idx] = prev * 2.f;",
     "does not move with `i` alone"),
    # calls that may store or synchronise
    ("    const float v = in[off + i * 128];\n    out[off + i * 128] = v;\n    put(bufs, i, v);",
     "calls `put` with a pointer"),
    ("    const float v = in[off + i * 128];\n    out[off + i * 128] = v;\n    bump(i);", "writes `g_p`, a variable outside it"),
    ("    const float v = in[off + i * 128];\n    out[off + i * 128] = v;\n    block_sync();",
     "synchronises or waits (`block_sync`)"),
    ("    const float v = in[off + i * 128];\n    out[off + i * 128] = v;\n    guarded_add(i);",
     "calls `guarded_add`, which synchronises or waits (`atomicAdd`)"),
])
def test_review_cases_are_refused(body, reason):
    result = _apply(LOOP.replace("BODY", body))
    assert not result.applies, result.source
    assert reason in result.reason, result.reason


def test_a_loaded_pointer_to_const_keeps_its_const_and_a_trailing_comment_stays(tmp_path):
    body = ("    const float* src = reinterpret_cast<const float* const*>(ids)[i];  // the i-th source\n"
            "    out[off + i * 128] = src[threadIdx.x];")
    result = _apply(LOOP.replace("BODY", body))
    assert result.applies, result.reason
    assert "const float * src_batch[4];" in result.source
    assert "const float *& src = src_batch[i];  // the i-th source" in result.source
    assert compiles(tmp_path, result.source) == ""


def test_a_loop_that_is_an_unbraced_body_is_refused():
    """The arrays would become the whole body of the `if`, and the loop after it would not see them."""
    src = KERNEL.replace("#pragma unroll\n  for (int it = 0;", "  if (row < 4096)\n#pragma unroll\n  for (int it = 0;")
    assert src != KERNEL
    result = _apply(src)
    assert not result.applies and "not a statement of a block" in result.reason, result.reason


def test_a_load_through_a_macro_and_a_member_function_are_refused_not_raised():
    macro = KERNEL.replace("    x.load(params.x + offset);", "    LOADV(x, params.x + offset);").replace(
        "constexpr int kHidden", "#define LOADV(v, p) v.load(p)\nconstexpr int kHidden")
    result = _apply(macro)
    assert not result.applies and "the load of `x` is not written `x.load(...)` (a macro?)" in result.reason
    method = VEC + """
struct Row {
  const float* src_;
  float* dst_;
  float sum_;
  __device__ void run() {
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      const float v = src_[i * 128 + threadIdx.x];
      dst_[i * 128 + threadIdx.x] = v;
      sum_ += v;
    }
  }
};
"""
    result = _apply(method)
    assert not result.applies and "member of `this`" in result.reason, result.reason


def test_the_register_budget_reads_constexpr_trip_counts():
    big = KERNEL.replace("constexpr int kHidden = 2048;", "constexpr int kHidden = 65536;")
    result = _apply(big)
    assert not result.applies
    assert "4096 bytes of batched values per thread (128 iterations of 32 B), more than 512" in result.reason


def test_a_load_that_takes_its_index_apart_copies_the_indices_it_reads(tmp_path):
    """`x.load(p, idx)`: the index is an argument of its own, and its declarations go to the loads' loop too."""
    src = VEC.replace("  __device__ T& operator[]", "  __device__ void load(const T* p, int i) { load(p + i * N); }\n"
                      "  __device__ void store(T* p, int i) const { store(p + i * N); }\n  __device__ T& operator[]") + """
__global__ void add(float* out, const float* x, const float* y) {
#pragma unroll
  for (int j = 0; j < 4; ++j) {
    const int idx = blockIdx.x * 512 + j * 128 + threadIdx.x;
    const int col = idx % 128;
    Vec<float, 4> a;
    a.load(x, idx);
    Vec<float, 4> b;
    b.load(y, col);
    for (int e = 0; e < 4; ++e) a[e] += b[e];
    a.store(out, idx);
  }
}
"""
    result = _apply(src)
    assert result.applies, result.reason
    loads = result.source.split("#pragma unroll")[1]
    assert "const int idx = " in loads and "const int col = idx % 128;" in loads
    assert "a_batch[j].load(x, idx);" in loads and "b_batch[j].load(y, col);" in loads
    rest = result.source.split("#pragma unroll")[2]
    assert "const int col" not in rest and "a.store(out, idx);" in rest
    assert compiles(tmp_path, result.source) == ""
    in_place = _apply(src.replace("a.store(out, idx);", "a.store(const_cast<float*>(x), idx + 1);"))
    assert not in_place.applies and "`x` is loaded and stored in the loop at different addresses" in in_place.reason
