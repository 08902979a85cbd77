"""launch_bounds: a kernel launched with one compile-time block size gets `__launch_bounds__` of it."""

from astra.optimize.passes import all_passes
from tests.astra.optimize.passes.nvcc import compiles
from tests.astra.optimize.passes.test_coarsen import LAUNCHER

KERNEL = LAUNCHER + """
namespace {
constexpr uint32_t kBlockSize = 256;
}

template <typename T, int kThreads>
__global__ void scale(T* p, int n) {
  const int i = blockIdx.x * kThreads + threadIdx.x;
  if (i < n) p[i] *= 2;
}

template <typename T>
__global__ void shift(T* p, int n) {
  const int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) p[i] += 1;
}

template <typename T, int kWarps>
struct Run {
  static constexpr auto kernel = scale<T, kWarps * 32>;
  static constexpr uint32_t kThreads = kWarps * 32;
  static void run(T* p, int n, cudaStream_t stream) {
    LaunchKernel((n + kThreads - 1) / kThreads, kThreads, stream)(kernel, p, n);
    LaunchKernel((n + 127) / 128, kBlockSize / 2, stream)(shift<T>, p, n);
  }
};
"""


def _apply(source: str):
    return all_passes()["launch_bounds"].apply(source)


def test_bounds_from_a_constant_and_from_a_template_parameter(tmp_path):
    result = _apply(KERNEL)
    assert result.applies, result.reason
    out = result.source
    assert "__global__ void __launch_bounds__(kThreads) scale(T* p, int n) {" in out
    assert "__global__ void __launch_bounds__(128) shift(T* p, int n) {" in out
    assert out.replace("__launch_bounds__(kThreads) ", "").replace("__launch_bounds__(128) ", "") == KERNEL
    assert result.reason.endswith("scale (kThreads), shift (128)")
    assert compiles(tmp_path, out, "template struct Run<float, 4>;") == ""


def test_dim3_blocks_and_local_constants():
    local = KERNEL.replace("LaunchKernel((n + 127) / 128, kBlockSize / 2, stream)",
                           "constexpr int kRows = 2;\n    LaunchKernel(n, dim3(64, kRows), stream)")
    result = _apply(local)
    assert result.applies and "__launch_bounds__(128) shift" in result.source  # 64 x 2
    literal = KERNEL.replace("(kernel, p, n)", "(kernel, p, n);\n    LaunchKernel(n, 128, stream)(shift<T>, p, n)")
    assert "__launch_bounds__(128) shift" in _apply(literal).source  # launches agree


def test_a_choice_between_instantiations(tmp_path):
    chosen = KERNEL.replace("LaunchKernel((n + 127) / 128, kBlockSize / 2, stream)(shift<T>, p, n);",
                            "const auto pick = n > 4096 ? scale<T, 64> : scale<T, 128>;\n"
                            "    LaunchKernel(n, 128, stream)(pick, p, n);")
    chosen = chosen.replace("LaunchKernel((n + kThreads - 1) / kThreads, kThreads, stream)(kernel, p, n);", "")
    result = _apply(chosen)
    assert result.reason.endswith("scale (128)"), result.reason  # every launch has 128 threads, whichever runs
    assert "__launch_bounds__(128) scale" in result.source
    templated = chosen.replace("LaunchKernel(n, 128, stream)(pick", "LaunchKernel(n, kThreads, stream)(pick")
    assert ("scale: a launch on line 37 has a block size (`kThreads`) resting on a template parameter that no "
            "template argument of the kernel equals") in _apply(templated).reason
    # one instantiation's argument equals the block size, the other's does not: a bound of 64 or 128 by turns
    assert compiles(tmp_path, result.source, "template struct Run<float, 4>;") == ""


def test_refusals():
    runtime = KERNEL.replace("kBlockSize / 2, stream)(shift<T>", "n % 512, stream)(shift<T>")
    assert "shift: a launch on line" in _refused(runtime, "shift")
    assert "has a block size not known at compile time (`n % 512`)" in _refused(runtime, "shift")
    two_d = KERNEL.replace("kBlockSize / 2, stream)(shift<T>", "dim3(32, n), stream)(shift<T>")
    assert "2-D/3-D or dim3 block `dim3(32, n)` with an extent not known at compile time" in _refused(two_d, "shift")
    disagree = KERNEL.replace("(kernel, p, n)", "(kernel, p, n);\n    LaunchKernel(n, 64, stream)(shift<T>, p, n)")
    assert "shift: launches disagree on the block size (64, 128)" in _refused(disagree, "shift")
    bounded = KERNEL.replace("__global__ void shift", "__global__ void __launch_bounds__(512) shift")
    assert "shift: already has __launch_bounds__ or __maxnreg__" in _refused(bounded, "shift")
    macro = KERNEL.replace("template <typename T>\n__global__ void shift",
                           "#define BOUNDED __global__ __launch_bounds__(512)\ntemplate <typename T>\nBOUNDED void shift")
    assert "shift: already has __launch_bounds__ or __maxnreg__" in _refused(macro, "shift")
    before = KERNEL.replace("template <typename T>\n__global__ void shift",
                            "template <typename T>\n__global__ __launch_bounds__(512) void shift")
    assert "shift: already has __launch_bounds__ or __maxnreg__" in _refused(before, "shift")
    pointer = KERNEL.replace("  static void run(", "  static void* handle() { return (void*)shift<T>; }\n"
                             "  static void run(")
    assert "shift: referenced other than as LaunchKernel(grid, block, ...)(kernel, ...) (line" in _refused(
        pointer, "shift")
    chosen = KERNEL.replace("  static void run(", "  static void pick() { int g, b;\n"
                            "    cudaOccupancyMaxPotentialBlockSize(&g, &b, shift<T>); }\n  static void run(")
    assert "shift: an occupancy query chooses its block size" in _refused(chosen, "shift")
    queried = KERNEL.replace("  static void run(", "  static void occupancy(int b) { int n;\n"
                             "    cudaOccupancyMaxActiveBlocksPerMultiprocessor(&n, shift<T>, b, 0); }\n"
                             "  static void run(")
    assert "shift: the cudaOccupancyMaxActiveBlocksPerMultiprocessor query on line" in _refused(queried, "shift")
    too_big = KERNEL.replace("kBlockSize / 2, stream)(shift<T>", "kBlockSize * 8, stream)(shift<T>")
    assert "shift: block size 2048 outside 1..1024" in _refused(too_big, "shift")
    unlaunched = "__global__ void k(float* p) { p[threadIdx.x] = 0.f; }\n"
    assert _apply(unlaunched).reason == "k: not launched from this file through LaunchKernel"
    assert _apply("int f() { return 1; }\n").reason == "no __global__ kernel in the file"


def _refused(source: str, kernel: str) -> str:
    """Why the pass leaves `kernel` alone (the other kernel's launch made run-time: nothing applies)."""
    alone = source.replace("LaunchKernel((n + kThreads - 1) / kThreads, kThreads, stream)",
                           "LaunchKernel((n + kThreads - 1) / kThreads, n, stream)")
    result = _apply(alone)
    assert not result.applies, result.reason
    assert "scale: a launch on line" in result.reason  # every kernel's reason, one line
    return result.reason
