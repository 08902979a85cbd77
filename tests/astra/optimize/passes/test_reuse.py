"""reuse: loop-invariant reads of read-only memory move above the loop; anything else stays."""

from astra.optimize.passes import all_passes
from tests.astra.optimize.passes.nvcc import compiles

KERNEL = """
#include <cstdint>
template <typename T>
__global__ void scale_rows(T* __restrict__ out, const T* __restrict__ in, const float* __restrict__ scale,
                           const float* bias, int rows, int n) {
  for (int row = blockIdx.x; row < rows; row += gridDim.x) {
    const float bias_v = bias[row] * 2.0f;
    for (int i = threadIdx.x; i < n; i += blockDim.x) {
      out[row * n + i] = static_cast<T>(static_cast<float>(in[row * n + i]) * scale[row] + __ldg(&bias[0]));
    }
    out[row * n] = static_cast<T>(bias_v);
  }
}
"""


def test_invariant_loads_move_above_the_innermost_loop_and_it_builds(tmp_path):
    result = all_passes()["reuse"].apply(KERNEL)
    assert result.applies, result.reason
    out = result.source
    hoisted = out.index("const auto scale_v = scale[row];")
    assert hoisted < out.index("for (int i = threadIdx.x")
    assert "* scale_v + " in out and "scale[row] +" not in out
    assert "const auto bias_v2 = __ldg(&bias[0]);" in out  # named apart from the kernel's own bias_v
    assert "in[row * n + i]" in out  # varies with i: stays
    assert "const float bias_v = bias[row] * 2.0f;" in out  # its loop (over rows) holds another loop
    assert compiles(tmp_path, out, "template __global__ void scale_rows<float>(float*, const float*, const float*, "
                                   "const float*, int, int);") == ""


def test_a_const_declaration_moves_out_whole():
    source = """
__global__ void k(float* __restrict__ out, const float* w, const float* x, int rows, int n) {
  for (int r = blockIdx.x; r < rows; r += gridDim.x) {
    const float w0 = w[threadIdx.x] * 0.5f;
    out[r * n + threadIdx.x] = x[r * n + threadIdx.x] * w0;
  }
}
"""
    result = all_passes()["reuse"].apply(source)
    assert result.applies, result.reason
    assert result.source.index("const float w0 = w[threadIdx.x] * 0.5f;") < result.source.index("for (int r")
    assert result.source.count("const float w0") == 1


def test_refusals_name_the_reason():
    written_in_loop = """
__global__ void k(float* out, float* acc, int n) {
  for (int i = threadIdx.x; i < n; i += blockDim.x) { acc[0] += out[i]; out[i] = acc[0]; }
}
"""
    shared = """
__global__ void k(float* out, int n) {
  __shared__ float s[32];
  const float* t = s;
  for (int i = threadIdx.x; i < n; i += blockDim.x) out[i] = t[0];
}
"""
    # a pointer to const may read what another pointer writes: without __restrict__ on either, out may be w
    may_alias = """
__global__ void k(float* out, const float* w, const float* x, int rows, int n) {
  for (int r = blockIdx.x; r < rows; r += gridDim.x) {
    const float w0 = w[threadIdx.x] * 0.5f;
    out[r * n + threadIdx.x] = x[r * n + threadIdx.x] * w0;
  }
}
"""
    # nor does an element type the loop stores nowhere: a store through an int pointer may write the floats
    other_type = """
__global__ void k(int* __restrict__ idx, float* out, const float* w, int n) {
  for (int i = threadIdx.x; i < n; i += blockDim.x) { idx[i] = i; out[i] = w[0]; }
}
"""
    # a call given a pointer may store through it
    through_call = """
__device__ void put(float* p, float v);
__global__ void k(float* __restrict__ out, const float* __restrict__ w, int n) {
  for (int i = threadIdx.x; i < n; i += blockDim.x) put(out + i, w[0]);
}
"""
    for source in (written_in_loop, shared, may_alias, other_type, through_call):
        result = all_passes()["reuse"].apply(source)
        assert not result.applies and "loop-invariant" in result.reason, source


def test_loads_move_where_nothing_else_may_write_them(tmp_path):
    source = """
__global__ void k(float* __restrict__ out, const float* w, const float* x, int rows, int n) {
  for (int r = blockIdx.x; r < rows; r += gridDim.x) {
    float acc[4];
    for (int j = 0; j < 4; ++j) acc[j] = x[r * n + j] * w[0];
    out[r] = acc[0] + acc[3];
  }
}
"""
    result = all_passes()["reuse"].apply(source)
    assert result.applies, result.reason
    out = result.source
    # the inner loop stores into a local array only; the outer one through out, which is __restrict__
    assert out.count("const auto w_v = w[0];") == 1 and "* w_v;" in out
    assert out.index("const auto w_v = w[0];") < out.index("for (int r = blockIdx.x")
    assert compiles(tmp_path, out) == ""


DIVIDE = """
__global__ void normalise(float* __restrict__ out, const float* __restrict__ in, const float* __restrict__ sums,
                          float eps, int rows, int n) {
  for (int row = blockIdx.x; row < rows; row += gridDim.x) {
    for (int i = threadIdx.x; i < n; i += blockDim.x) {
      float v = in[row * n + i] / (sums[row] + eps);
      v /= eps;
      out[row * n + i] = v / 3.0f;
    }
  }
}
"""


def test_a_division_by_an_invariant_becomes_a_reciprocal_multiplication_under_a_tolerance(tmp_path):
    spec = {"tolerance": {"float32": {"atol": 1e-5, "rtol": 1e-5}}}
    result = all_passes()["reuse"].apply(DIVIDE, spec)
    assert result.applies, result.reason
    out = result.source
    # the reciprocal of an expression that loads goes above the innermost loop, where the load is in range
    assert out.index("const float eps_rcp = 1.0f / (eps);") < out.index("for (int row")  # invariant in both loops
    assert out.index("for (int row") < out.index("const float sums_rcp = 1.0f / ((sums[row] + eps));") < out.index(
        "for (int i = threadIdx.x")
    assert "float v = in[row * n + i] * sums_rcp;" in out and "v *= eps_rcp;" in out
    assert "v / 3.0f" in out  # a literal divisor: the compiler's business
    assert compiles(tmp_path, out) == ""


def test_no_reciprocal_under_a_bit_exact_spec():
    exact = {"tolerance": {"float32": {"atol": 0, "rtol": 0}}}
    result = all_passes()["reuse"].apply(DIVIDE, exact)
    assert result.applies, result.reason  # the load of sums[row] still moves; the divisions stay divisions
    assert "in[row * n + i] / (sums_v + eps)" in result.source and "v /= eps;" in result.source
    assert "_rcp" not in result.source


def test_a_class_element_stored_through_its_assignment_is_not_read_once():
    source = """
#include <cuda_bf16.h>
__global__ void k(__nv_bfloat16* __restrict__ out, int n) {
  for (int i = threadIdx.x; i < n; i += blockDim.x) out[i + 1] = out[0];
}
"""
    result = all_passes()["reuse"].apply(source)  # the loop stores through out (bf16's operator=): out[0] may change
    assert not result.applies and "loop-invariant" in result.reason


def test_no_load_moves_out_of_a_synchronising_loop_or_through_volatile():
    # thread 0 of another branch may store flags[0] between the barriers: each iteration reads it again
    barrier = """
__global__ void k(float* __restrict__ out, const int* __restrict__ flags, int n) {
  for (int i = 0; i < n; ++i) {
    __syncthreads();
    out[i * blockDim.x + threadIdx.x] = flags[0];
  }
}
"""
    polled = """
__global__ void k(const volatile int* flag, int* __restrict__ out) {
  int seen = 0;
  for (int tries = 0; tries < 100; ++tries) seen += flag[0];
  out[threadIdx.x] = seen;
}
"""
    for source in (barrier, polled):
        result = all_passes()["reuse"].apply(source)
        assert not result.applies and "loop-invariant" in result.reason, source
