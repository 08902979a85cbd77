"""fast_math: intrinsics in device code only, and only where the spec's tolerance allows them."""

from astra.optimize.passes import all_passes
from astra.optimize.passes.fast_math import allows
from tests.astra.optimize.passes.nvcc import compiles

KERNEL = """
#include <cstdint>
__host__ __device__ inline float host_too(float x) { return expf(x); }

__device__ inline float gelu_like(float x, float y) { return x / y + logf(x); }

__global__ void softmax_row(float* out, const float* in, float scale, int n) {
  constexpr float kHalf = 1.0f / 2.0f;
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) out[i] = expf(in[i] * scale) * (1.0f / sqrtf(in[i] + kHalf)) + gelu_like(in[i], scale) / 3.0f;
}
"""
LOOSE = {"tolerance": {"bfloat16": {"atol": 1e-2, "rtol": 1e-2}, "float32": {"atol": 1e-5, "rtol": 1e-5}}}


def test_intrinsics_replace_device_math_and_the_result_builds(tmp_path):
    result = all_passes()["fast_math"].apply(KERNEL, LOOSE)
    assert result.applies, result.reason
    out = result.source
    assert "__expf(in[i] * scale)" in out and "rsqrtf(in[i] + kHalf)" in out
    assert "__fdividef(x, y) + __logf(x)" in out
    assert "return expf(x);" in out  # a __host__ __device__ function keeps the C call
    assert "constexpr float kHalf = 1.0f / 2.0f;" in out  # a constant expression stays one
    assert "/ 3.0f" in out  # division by a literal is left to the compiler
    assert compiles(tmp_path, out) == ""


def test_refused_for_bit_exact_specs_and_explained():
    exact = {"tolerance": {"bfloat16": {"atol": 0.0, "rtol": 0.0, "floor": 0.0}}}
    result = all_passes()["fast_math"].apply(KERNEL, exact)
    assert not result.applies and "bit-exact for bfloat16" in result.reason
    assert not allows({"tolerance": {}})[0]  # integer outputs: compared exactly
    assert allows(None)[0] and allows(LOOSE)[0]


def test_refused_without_math_in_device_code():
    result = all_passes()["fast_math"].apply("__global__ void k(int* p) { p[0] = 1; }\n")
    assert not result.applies and "no expf" in result.reason
