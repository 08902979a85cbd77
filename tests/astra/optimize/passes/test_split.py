"""split: a row's thread-strided loops divided among several CTAs of the row (grid.y), checked on small kernels
of our own and compiled with the real nvcc."""

from astra.optimize.passes import all_passes
from tests.astra.optimize.passes.nvcc import compiles
from tests.astra.optimize.passes.test_coarsen import LAUNCHER

KERNEL = LAUNCHER + """
template <typename T, int kThreads>
__global__ void row_scale(T* __restrict__ out, const T* __restrict__ in, const float* alpha, int n) {
  const int row = blockIdx.x;
  if (row >= gridDim.x) return;
  const float a = alpha[row];
  const int lane = threadIdx.x % 32;
  for (int i = threadIdx.x * 2; i < n; i += kThreads * 2) {
    out[row * n + i] = static_cast<T>(in[row * n + i] * a);
    if (i + 1 < n) out[row * n + i + 1] = static_cast<T>(in[row * n + i + 1] * a + lane * 0);
  }
}

template <typename T>
struct RowScale {
  static void run(T* out, const T* in, const float* alpha, int rows, int n, cudaStream_t stream) {
    LaunchKernel(rows, 128, stream)(row_scale<T, 128>, out, in, alpha, n);
  }
};
"""


def split(source: str):
    return all_passes()["split"].apply(source)


def test_the_loop_is_divided_and_the_grid_gets_a_second_dimension(tmp_path):
    result = split(KERNEL)
    assert result.applies, result.reason
    out = result.source
    assert "for (int i = (threadIdx.x * 2) + blockIdx.y * (kThreads * 2); i < n; i += (kThreads * 2) * gridDim.y)" in out
    assert "LaunchKernel(dim3(rows, split_rows(static_cast<uint32_t>(rows))), 128, stream)" in out
    assert "inline uint32_t split_rows(uint32_t rows) {" in out
    assert out.index("inline uint32_t split_rows") < out.index("template <typename T, int kThreads>")
    assert "row_scale (1 loop)" in result.reason
    assert compiles(tmp_path, out, "template struct RowScale<float>;") == ""


def test_a_serial_loop_around_the_strided_one_and_a_helper_in_another_namespace(tmp_path):
    source = LAUNCHER + """
namespace detail {
__device__ __forceinline__ float twice(float x) { return 2.f * x; }
__global__ void heads(float* q, const float* cos, int heads, int dim) {
  const float* c = cos + blockIdx.x * dim;
  for (int h = 0; h < heads; ++h) {
    float* row = q + (blockIdx.x * heads + h) * dim;
#pragma unroll 2
    for (unsigned i = threadIdx.x; i < dim; i += blockDim.x) {
      const float v = row[i];
      row[i] = twice(v) * c[i];
    }
  }
}
}  // namespace detail

void launch(float* q, const float* cos, int tokens, int heads, int dim, cudaStream_t s) {
  LaunchKernel(tokens, 64, s)(detail::heads, q, cos, heads, dim);
}
"""
    result = split(source)
    assert result.applies, result.reason
    out = result.source
    assert "for (unsigned i = (threadIdx.x) + blockIdx.y * (blockDim.x); i < dim; i += (blockDim.x) * gridDim.y)" in out
    assert "dim3(tokens, detail::split_rows(static_cast<uint32_t>(tokens)))" in out
    assert compiles(tmp_path, out) == ""


def test_refusals_name_what_would_break():
    cases = {
        # a sum carried across iterations would become partial sums
        "for (int i = threadIdx.x * 2; i < n; i += kThreads * 2) {":
            ("float s = 0.f;\n  for (int i = threadIdx.x * 2; i < n; i += kThreads * 2) {\n    s += in[i];",
             "carries `s` from one iteration"),
        # a write outside the loop would be made by every CTA of the row
        "const int lane = threadIdx.x % 32;": ("const int lane = threadIdx.x % 32;\n  if (lane == 0) out[row] = a;",
                                               "outside a thread-strided loop"),
        # threads that share data cannot be split apart
        "const float a = alpha[row];": ("__shared__ float a; a = alpha[row]; __syncthreads();", "share data"),
    }
    for old, (new, why) in cases.items():
        result = split(KERNEL.replace(old, new, 1))
        assert not result.applies and why in result.reason, result.reason
    early = split(KERNEL.replace("    if (i + 1 < n)", "    if (in[i] < 0) break;\n    if (i + 1 < n)"))
    assert not early.applies and "can end early" in early.reason
    two_d = split(KERNEL.replace("LaunchKernel(rows, 128, stream)", "LaunchKernel(dim3(rows, 2), 128, stream)"))
    assert not two_d.applies and "neither a plain 1-D size nor a dim3 variable" in two_d.reason
    serial = split(KERNEL.replace("threadIdx.x * 2; i < n; i += kThreads * 2", "0; i < n; ++i"))
    assert not serial.applies and "outside a thread-strided loop" in serial.reason
    local_array = split(KERNEL.replace("const int lane = threadIdx.x % 32;", "const int lane = threadIdx.x % 32;\n"
                                       "  float keep[2] = {0.f, 0.f};").replace(
        "out[row * n + i] = static_cast<T>(in[row * n + i] * a);", "keep[i & 1] = a;"))
    assert not local_array.applies and "carries `keep`" in local_array.reason


def test_a_callee_that_reduces_is_refused():
    source = KERNEL.replace("template <typename T, int kThreads>\n__global__",
                            "__device__ float warp_sum(float x) {\n  for (int o = 16; o > 0; o /= 2) x += "
                            "__shfl_xor_sync(0xffffffff, x, o);\n  return x;\n}\n\n"
                            "template <typename T, int kThreads>\n__global__", 1).replace(
        "in[row * n + i] * a)", "warp_sum(in[row * n + i]) * a)")
    result = split(source)
    assert not result.applies and "shares data between threads" in result.reason


def test_a_device_function_holding_the_loop_is_divided_too(tmp_path):
    source = LAUNCHER + """
template <typename T, bool kNeox>
__device__ void rotate(T* q, const float* cs, int dim) {
  for (int i = threadIdx.x; i < dim / 2; i += blockDim.x) {
    const int a = kNeox ? i : 2 * i, b = kNeox ? i + dim / 2 : 2 * i + 1;
    const float x = static_cast<float>(q[a]), y = static_cast<float>(q[b]);
    q[a] = static_cast<T>(x * cs[i] - y * cs[dim / 2 + i]);
    q[b] = static_cast<T>(y * cs[i] + x * cs[dim / 2 + i]);
  }
}

template <typename T, bool kNeox>
__global__ void rope(T* q, const float* cache, const int* pos, int dim) {
  const int token = blockIdx.x;
  assert(pos[token] >= 0);
  rotate<T, kNeox>(q + token * dim, cache + pos[token] * dim, dim);
}

template <typename T>
void run(T* q, const float* cache, const int* pos, int tokens, int dim, cudaStream_t s) {
  LaunchKernel(tokens, 128, s)(rope<T, true>, q, cache, pos, dim);
}
"""
    result = split(source)
    assert result.applies, result.reason
    assert "i = (threadIdx.x) + blockIdx.y * (blockDim.x); i < dim / 2; i += (blockDim.x) * gridDim.y)" in result.source
    assert compiles(tmp_path, "#include <cassert>\n" + result.source, "template void run<float>(float*, const float*, "
                    "const int*, int, int, cudaStream_t);") == ""
    writing = source.replace("  assert(pos[token] >= 0);\n", "  if (threadIdx.x == 0) q[token * dim] = T(0);\n")
    refused = split(writing)
    assert not refused.applies and "outside a thread-strided loop" in refused.reason


def test_a_triple_chevron_launch_with_a_dim3_grid(tmp_path):
    source = """
#include <cstdint>
#include <cuda_runtime.h>
template <typename T>
__global__ void scale(T* p, int n) {
  for (int i = threadIdx.x; i < n; i += blockDim.x) p[blockIdx.x * n + i] *= T(2);
}
template <typename T>
void launch(T* p, int n, dim3 grid, dim3 block, cudaStream_t s) {
  scale<T><<<grid, block, 0, s>>>(p, n);
}
template <typename T>
void launch_rows(T* p, int n, int rows, cudaStream_t s) { scale<T><<<rows, 128, 0, s>>>(p, n); }
"""
    result = split(source)
    assert result.applies, result.reason
    assert "scale<T><<<dim3(grid.x, split_rows(grid.x), grid.z), block, 0, s>>>(p, n)" in result.source
    assert "scale<T><<<dim3(rows, split_rows(static_cast<uint32_t>(rows))), 128, 0, s>>>" in result.source
    assert compiles(tmp_path, result.source, "template void launch<float>(float*, int, dim3, dim3, cudaStream_t);") == ""


SHARED = LAUNCHER + """
__device__ void scale_row(float* p, int n) {
  for (int i = threadIdx.x; i < n; i += blockDim.x) p[i] *= 2.f;
}
__global__ void first(float* p, int n) { scale_row(p + blockIdx.x * n, n); }
__global__ void second(float* p, int n) { scale_row(p + blockIdx.x * n, n); }
void run(float* p, int rows, int n, cudaStream_t s) {
  LaunchKernel(rows, 128, s)(first, p, n);
  LaunchKernel(rows, 128, s)(second, p, n);
}
"""


def test_a_device_function_two_kernels_call_is_divided_once(tmp_path):
    result = split(SHARED)
    assert result.applies, result.reason
    assert "first (1 loop), second (1 loop)" in result.reason
    assert result.source.count("blockIdx.y * (blockDim.x)") == 1 and result.source.count("split_rows(") == 3
    assert compiles(tmp_path, result.source) == ""


def test_a_function_a_two_d_kernel_also_calls_is_left_alone():
    two_d = SHARED.replace("__global__ void second(float* p, int n) { scale_row(p + blockIdx.x * n, n); }",
                           "__global__ void second(float* p, int n) { scale_row(p + blockIdx.y * n, n); }")
    result = split(two_d)
    assert not result.applies and "called by a kernel that reads blockIdx.y" in result.reason
