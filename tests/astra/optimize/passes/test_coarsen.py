"""coarsen: two rows per CTA, the launch's grid halved and the original grid passed to the kernel."""

from astra.optimize.passes import all_passes
from tests.astra.optimize.passes.nvcc import compiles

# A stand-in for SGLang's launcher: LaunchKernel(grid, block, stream)(kernel, args...).
LAUNCHER = """
#include <cstdint>
#include <cuda_runtime.h>
struct LaunchKernel {
  LaunchKernel(dim3 grid, dim3 block, cudaStream_t stream) : grid(grid), block(block), stream(stream) {}
  template <typename... Kernel, typename... Args>
  void operator()(void (*kernel)(Kernel...), Args&&... args) const {
    kernel<<<grid, block, 0, stream>>>(static_cast<Kernel>(args)...);
  }
  dim3 grid, block;
  cudaStream_t stream;
};
"""

KERNEL = LAUNCHER + """
template <typename T>
__global__ void row_scale(T* out, const T* in, float alpha, int n) {
  __shared__ float total;
  if (blockIdx.x >= gridDim.x) return;
  if (threadIdx.x == 0) total = alpha;
  __syncthreads();
  for (int i = threadIdx.x; i < n; i += blockDim.x) out[blockIdx.x * n + i] = in[blockIdx.x * n + i] * total;
}

template <typename T>
struct RowScale {
  static constexpr auto kernel = row_scale<T>;
  static void run(T* out, const T* in, float alpha, int rows, int n, cudaStream_t stream) {
    LaunchKernel(rows, 128, stream)(kernel, out, in, alpha, n);
  }
};
"""


def test_rows_per_cta_and_the_launch_builds(tmp_path):
    result = all_passes()["coarsen"].apply(KERNEL)
    assert result.applies, result.reason
    out = result.source
    assert "constexpr uint32_t kRowScaleRowsPerBlock = 2;" in out
    assert "__global__ void row_scale(T* out, const T* in, float alpha, int n, const uint32_t coarse_grid)" in out
    assert "block_row < (blockIdx.x + 1) * kRowScaleRowsPerBlock && block_row < coarse_grid" in out
    assert "if (block_row >= coarse_grid) return;" in out  # blockIdx.x and gridDim.x read as the row and grid
    assert "out[block_row * n + i]" in out and "[&] {" in out
    assert "__syncthreads();  // the next row" in out  # shared memory: rows are separated by a barrier
    assert "LaunchKernel((rows + kRowScaleRowsPerBlock - 1) / kRowScaleRowsPerBlock, 128, stream)" in out
    assert "(kernel, out, in, alpha, n, static_cast<uint32_t>(rows))" in " ".join(out.split())  # wrapped at 120
    assert max(len(line) for line in out.splitlines()) <= 120
    assert compiles(tmp_path, out, "template struct RowScale<float>;") == ""


def test_refusals():
    unlaunched = "__global__ void k(float* p) { p[blockIdx.x] = 0.f; }\n"
    result = all_passes()["coarsen"].apply(unlaunched)
    assert not result.applies and "not launched from this file" in result.reason
    two_d = KERNEL.replace("LaunchKernel(rows, 128, stream)", "LaunchKernel(dim3(rows, 2), 128, stream)")
    result = all_passes()["coarsen"].apply(two_d)
    assert not result.applies and "not a plain 1-D size" in result.reason
    helper = KERNEL.replace("template <typename T>\n__global__", "__device__ int row() { return blockIdx.x; }\n"
                            "__device__ int row_twice() { return 2 * row(); }\n"
                            "template <typename T>\n__global__", 1)
    assert all_passes()["coarsen"].apply(helper).applies  # a helper it does not call is no concern
    calling = helper.replace("if (threadIdx.x == 0) total = alpha;", "if (threadIdx.x == 0) total = alpha * row_twice();")
    result = all_passes()["coarsen"].apply(calling)
    assert not result.applies and "calls row_twice, which reads blockIdx or gridDim" in result.reason
    # a programmatic dependent launch's trigger, run once per row, would release dependents after the first row
    trigger = KERNEL.replace("  for (int i = threadIdx.x;", "  asm volatile(\"griddepcontrol.launch_dependents;\");\n"
                             "  for (int i = threadIdx.x;", 1)
    assert trigger != KERNEL
    result = all_passes()["coarsen"].apply(trigger)
    assert not result.applies and "releases its dependent launches (PDL)" in result.reason


def test_a_kernel_in_another_namespace_and_a_typed_kernel_pointer(tmp_path):
    nested = KERNEL.replace("template <typename T>\n__global__", "namespace detail {\ntemplate <typename T>\n__global__", 1)
    nested = nested.replace("template <typename T>\nstruct RowScale", "}  // namespace detail\n\ntemplate <typename T>\n"
                            "struct RowScale", 1).replace("= row_scale<T>;", "= detail::row_scale<T>;")
    result = all_passes()["coarsen"].apply(nested)
    assert result.applies, result.reason
    assert "(rows + detail::kRowScaleRowsPerBlock - 1) / detail::kRowScaleRowsPerBlock" in result.source
    assert compiles(tmp_path, result.source, "template struct RowScale<float>;") == ""
    typed = KERNEL.replace("static constexpr auto kernel = row_scale<T>;",
                           "using KernelT = void (*)(T*, const T*, float, int);\n  static constexpr KernelT kernel = "
                           "row_scale<T>;")
    result = all_passes()["coarsen"].apply(typed)
    assert not result.applies and "referenced other than as LaunchKernel" in result.reason


def test_rows_are_separated_by_a_barrier_even_where_only_a_called_function_uses_shared_memory(tmp_path):
    helper = KERNEL.replace("template <typename T>\n__global__", "__device__ float staged(float v) {\n"
                            "  __shared__ float slot;\n  if (threadIdx.x == 0) slot = v;\n  __syncthreads();\n"
                            "  return slot;\n}\n\ntemplate <typename T>\n__global__", 1)
    helper = helper.replace("  __shared__ float total;\n", "").replace("  if (threadIdx.x == 0) total = alpha;\n"
                            "  __syncthreads();\n", "  const float total = staged(alpha);\n")
    assert "__shared__" not in helper.split("__global__")[1]  # the kernel's own body names no shared memory
    result = all_passes()["coarsen"].apply(helper)
    assert result.applies, result.reason
    assert "}();\n    __syncthreads();  // the next row" in result.source
    assert compiles(tmp_path, result.source, "template struct RowScale<float>;") == ""
