"""pdl_chain: a kernel launched after another launch of the same function waits for it under programmatic
dependent launch, and the earlier kernel releases it at its start. Kernels and launcher written here."""

from astra.optimize.passes import all_passes
from astra.optimize.passes.pdl_chain import RELEASE, WAIT
from tests.astra.optimize.passes.nvcc import compiles

# SGLang's launcher in small: the configuration, then `.enable_pdl(on)`, then the kernel and its arguments
LAUNCHER = """
#include <cstdint>
#include <cuda_runtime.h>
struct LaunchKernel {
  LaunchKernel(dim3 grid, dim3 block, cudaStream_t stream) : grid(grid), block(block), stream(stream) {}
  LaunchKernel enable_pdl(bool on) const {
    LaunchKernel copy = *this;
    copy.pdl = on;
    return copy;
  }
  template <typename... Kernel, typename... Args>
  void operator()(void (*kernel)(Kernel...), Args&&... args) const {
    cudaLaunchAttribute attr{};
    attr.id = cudaLaunchAttributeProgrammaticStreamSerialization;
    attr.val.programmaticStreamSerializationAllowed = pdl;
    cudaLaunchConfig_t config{grid, block, 0, stream, &attr, 1};
    cudaLaunchKernelEx(&config, kernel, static_cast<Kernel>(args)...);
  }
  dim3 grid, block;
  cudaStream_t stream;
  bool pdl = false;
};
"""

KERNEL = LAUNCHER + """
__global__ void absmax(float* scale, const float* x, int n) {
  for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x)
    atomicMax(reinterpret_cast<int*>(scale), __float_as_int(fabsf(x[i])));
}

template <typename T>
__global__ void quant(T* y, const float* x, const float* scale, int n) {
  const int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) y[i] = static_cast<T>(x[i] / *scale);
}

template <bool kStatic, typename T>
void run(T* y, const float* x, float* scale, int n, cudaStream_t stream) {
  if constexpr (!kStatic) {
    LaunchKernel(132, 256, stream)(absmax, scale, x, n);
  }
  LaunchKernel((n + 255) / 256, 256, stream)(quant<T>, y, x, scale, n);
}
"""


# the op's two launches as KERNEL writes them: the first under `if constexpr`, the second after it
FIRST = "  if constexpr (!kStatic) {\n    LaunchKernel(132, 256, stream)(absmax, scale, x, n);\n  }\n"
SECOND = "  LaunchKernel((n + 255) / 256, 256, stream)(quant<T>, y, x, scale, n);"


def _apply(source: str):
    return all_passes()["pdl_chain"].apply(source)


def test_the_later_launch_waits_and_the_earlier_releases(tmp_path):
    result = _apply(KERNEL)
    assert result.applies, result.reason
    out = result.source
    assert result.reason.endswith("quant after absmax (line 40)")
    assert "LaunchKernel((n + 255) / 256, 256, stream).enable_pdl(true)(quant<T>, y, x, scale, n);" in out
    assert "LaunchKernel(132, 256, stream)(absmax, scale, x, n);" in out  # the op's first launch is left alone
    quant = out[out.index("__global__ void quant"):]
    absmax = out[out.index("__global__ void absmax"):out.index("template <typename T>\n__global__")]
    assert quant.index(WAIT) < quant.index("const int i")  # before any access to memory
    assert absmax.index(RELEASE) < absmax.index("for (")
    assert out.count("#if defined(__CUDA_ARCH__) && (__CUDA_ARCH__ >= 900)") == 2
    assert compiles(tmp_path, out, "template void run<false, float>(float*, const float*, float*, int, cudaStream_t);") == ""


def test_alternatives_are_not_a_chain():
    """Two launches in the branches of one `if` never run one after the other."""
    branches = KERNEL.replace(FIRST + SECOND,
                              "  if (n > 4096) {\n    LaunchKernel(132, 256, stream)(absmax, scale, x, n);\n  } else {\n"
                              "    LaunchKernel((n + 255) / 256, 256, stream)(quant<T>, y, x, scale, n);\n  }")
    assert branches != KERNEL
    result = _apply(branches)
    assert not result.applies and "comes after another launch of its function" in result.reason


def test_a_kernel_that_already_waits_or_a_launch_with_pdl_is_left_alone():
    waits = KERNEL.replace("  const int i = blockIdx.x", "  cudaGridDependencySynchronize();\n  const int i = blockIdx.x")
    result = _apply(waits)
    assert not result.applies and result.reason == "quant: already waits for or releases a dependent launch (PDL)"
    pdl = KERNEL.replace("256, stream)(quant<T>", "256, stream).enable_pdl(true)(quant<T>")
    result = _apply(pdl)
    assert not result.applies and result.reason == "quant: its launch on line 40 already sets PDL"


def test_the_middle_of_three_waits_then_releases(tmp_path):
    three = KERNEL.replace(
        "  LaunchKernel((n + 255) / 256, 256, stream)(quant<T>, y, x, scale, n);\n}",
        "  LaunchKernel((n + 255) / 256, 256, stream)(quant<T>, y, x, scale, n);\n"
        "  LaunchKernel(1, 32, stream)(absmax, scale, x, n);\n}")
    result = _apply(three)
    assert result.applies, result.reason
    out = result.source
    quant = out[out.index("__global__ void quant"):out.index("template <bool kStatic")]
    assert quant.index(WAIT) < quant.index(RELEASE) < quant.index("const int i")
    assert result.reason.endswith("quant after absmax (line 40), absmax after quant (line 41)")
    absmax = out[out.index("__global__ void absmax"):out.index("template <typename T>\n__global__")]
    assert absmax.index(WAIT) < absmax.index(RELEASE) < absmax.index("for (")  # its own wait first
    assert ".enable_pdl(true)(absmax" in out and "LaunchKernel(132, 256, stream)(absmax" in out
    assert compiles(tmp_path, out, "template void run<false, float>(float*, const float*, float*, int, cudaStream_t);") == ""


def test_code_on_the_brace_line_a_macro_kernel_and_an_author_placed_release(tmp_path):
    """The wait goes on lines of its own, so code written after `{` stays code; a kernel whose body a macro
    writes is refused; an earlier kernel that releases where its author chose gets no second release."""
    tight = KERNEL.replace("__global__ void quant(T* y, const float* x, const float* scale, int n) {\n  const int i",
                           "__global__ void quant(T* y, const float* x, const float* scale, int n) {  const int i")
    result = _apply(tight)
    assert result.applies, result.reason
    assert "#endif\n  const int i = blockIdx.x" in result.source
    assert compiles(tmp_path, result.source, "template void run<false, float>(float*, const float*, float*, int, cudaStream_t);") == ""
    macro = KERNEL.replace(
        "template <typename T>\n__global__ void quant(T* y, const float* x, const float* scale, int n) {\n"
        "  const int i = blockIdx.x * blockDim.x + threadIdx.x;\n  if (i < n) y[i] = static_cast<T>(x[i] / *scale);\n}",
        "#define QUANT(T) __global__ void quant(T* y, const float* x, const float* scale, int n) { \\\n"
        "  const int i = blockIdx.x * blockDim.x + threadIdx.x; if (i < n) y[i] = static_cast<T>(x[i] / *scale); }\n"
        "QUANT(float)").replace("(quant<T>, y", "(quant, y")
    assert macro.count("QUANT(") == 2
    result = _apply(macro)
    assert not result.applies and result.reason == "quant: its body is not written out in the file (a macro?)"
    released = KERNEL.replace("atomicMax(reinterpret_cast<int*>(scale), __float_as_int(fabsf(x[i])));",
                              "atomicMax(reinterpret_cast<int*>(scale), __float_as_int(fabsf(x[i])));\n"
                              "  cudaTriggerProgrammaticLaunchCompletion();")
    result = _apply(released)
    assert result.applies and RELEASE not in result.source and WAIT in result.source


def test_switch_cases_and_a_lambda_defined_earlier_are_not_a_chain():
    cases = KERNEL.replace(
        FIRST + SECOND,
        "  switch (n % 2) {\n    case 0:\n      LaunchKernel(132, 256, stream)(absmax, scale, x, n);\n      break;\n"
        "    default:\n      LaunchKernel((n + 255) / 256, 256, stream)(quant<T>, y, x, scale, n);\n  }")
    assert cases != KERNEL
    result = _apply(cases)
    assert not result.applies and "comes after another launch of its function" in result.reason
    deferred = KERNEL.replace(
        FIRST,
        "  auto later = [&] { LaunchKernel(132, 256, stream)(absmax, scale, x, n); };\n")
    result = _apply(deferred)
    assert deferred != KERNEL
    assert not result.applies and "comes after another launch of its function" in result.reason
