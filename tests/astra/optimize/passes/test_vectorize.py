"""vectorize: element-wise strided loops get 16-byte packed accesses behind a run-time alignment check."""

from astra.optimize.passes import all_passes
from astra.optimize.passes.base import PassResult, Refusal
from astra.optimize.passes.syntax import parse
from astra.optimize.passes.vectorize import _loops
from tests.astra.optimize.passes.nvcc import compiles
from tests.astra.optimize.passes.test_coarsen import LAUNCHER

KERNEL = """
#include <cstdint>
template <typename T>
__global__ void add_rows(T* __restrict__ out, const T* __restrict__ a, const T* __restrict__ b, int n) {
  const int tid = threadIdx.x;
  for (int i = tid; i < n; i += blockDim.x) {
    const float x = static_cast<float>(a[blockIdx.x * n + i]);
    out[blockIdx.x * n + i] = static_cast<T>(x + static_cast<float>(b[i]));
  }
}
"""


def test_packed_loop_with_alignment_check_tail_and_fallback_builds(tmp_path):
    result = all_passes()["vectorize"].apply(KERNEL)
    assert result.applies, result.reason
    out = result.source
    assert "constexpr int kPack = 16 / sizeof(T);" in out
    assert "reinterpret_cast<uintptr_t>(&a[blockIdx.x * n]) % 16 == 0" in out
    assert "reinterpret_cast<uintptr_t>(&b[0]) % 16 == 0" in out
    assert "*reinterpret_cast<uint4*>(a_pack) = *reinterpret_cast<const uint4*>(&a[blockIdx.x * n + i_first]);" in out
    assert "*reinterpret_cast<uint4*>(&out[blockIdx.x * n + i_first]) = *reinterpret_cast<const uint4*>(out_pack);" \
        in out
    assert "for (int i = (n) / kPack * kPack + tid; i < n; i += blockDim.x)" in out  # the tail
    assert out.count("for (int i = tid; i < n; i += blockDim.x)") == 1  # the fallback: the original loop
    assert compiles(tmp_path, out, "template __global__ void add_rows<float>(float*, const float*, const float*, int);"
                    "\n#include <cuda_bf16.h>\ntemplate __global__ void add_rows<__nv_bfloat16>(__nv_bfloat16*, "
                    "const __nv_bfloat16*, const __nv_bfloat16*, int);") == ""


def test_an_offset_start_and_a_serial_loop_keep_their_elements(tmp_path):
    source = """
#include <cstdint>
__global__ void fill_tail(float* __restrict__ out, const float* __restrict__ in, int start, int n) {
  for (int i = start + threadIdx.x; i < n; i += blockDim.x) out[i] = in[i] * 2.0f;
  if (threadIdx.x == 0) {
    for (int j = start; j < n; ++j) out[n + j] = in[j];
  }
}
"""
    result = all_passes()["vectorize"].apply(source)
    assert result.applies, result.reason
    out = result.source
    # packs of [start, n): thread t takes packs t, t + blockDim.x, ... and the tail resumes after the last
    assert "if ((start) < (n) &&" in out and "reinterpret_cast<uintptr_t>(&in[start]) % 16 == 0" in out
    assert "for (int i_pack = threadIdx.x; i_pack < ((n) - (start)) / kPack; i_pack += blockDim.x)" in out
    assert "&in[start + i_first]" in out
    assert "for (int i = start + ((n) - (start)) / kPack * kPack + threadIdx.x; i < n; i += blockDim.x)" in out
    assert "for (int j_pack = 0; j_pack < ((n) - (start)) / kPack2; ++j_pack)" in out  # the serial loop
    assert "&out[n + start + j_first]" in out
    assert compiles(tmp_path, out) == ""


def test_refusals_say_which_precondition_failed():
    cases = {
        "a running sum": ("__global__ void k(const float* x, float* y, int n) {\n  float s = 0.f;\n"
                          "  for (int i = threadIdx.x; i < n; i += blockDim.x) { s += x[i]; y[i] = s; }\n}\n",
                          "s is read elsewhere in the loop"),
        "a conditional store": ("__global__ void k(const float* x, float* y, int n) {\n"
                                "  for (int i = threadIdx.x; i < n; i += blockDim.x) { if (x[i] > 0) y[i] = x[i]; }\n}\n",
                                "under a condition"),
        "another use of i": ("__global__ void k(const float* x, float* y, int n) {\n"
                             "  for (int i = threadIdx.x; i < n; i += blockDim.x) { y[i] = x[2 * i]; }\n}\n",
                             "other than as a pointer's index"),
        "i given to a call": ("__device__ float f(int);\n__global__ void k(const float* x, float* y, int n) {\n"
                              "  for (int i = threadIdx.x; i < n; i += blockDim.x) { y[i] = x[i] * f(i); }\n}\n",
                              "other than as a pointer's index"),
        "a start not at the thread's place": ("__global__ void k(const float* x, float* y, int n) {\n"
                                              "  for (int i = 2 * threadIdx.x; i < n; i += blockDim.x) y[i] = x[i];\n}\n",
                                              "thread's place in its stride"),
        "mixed types of unknown size": ("template <typename T>\n__global__ void k(const T* x, double* y, int n) {\n"
                                       "  for (int i = threadIdx.x; i < n; i += blockDim.x) { y[i] = x[i]; }\n}\n",
                                       "different element types, T of a size unknown"),
        "a register array": ("__global__ void k(const float* x, float* y) {\n  float v[4];\n"
                             "  for (int i = 0; i < 4; ++i) { v[i] = x[i]; }\n"
                             "  for (int i = 0; i < 4; ++i) { y[i] = v[i]; }\n}\n",
                             "not a pointer (a register array"),
        "a base that loads": ("__global__ void k(float* const* rows, const float* x, int n) {\n"
                              "  for (int i = threadIdx.x; i < n; i += blockDim.x) { rows[blockIdx.x][i] = x[i]; }\n}\n",
                              "an indexed base loads or calls"),
        "16-byte elements": ("__global__ void k(const float4* x, float4* y, int n) {\n"
                             "  for (int i = threadIdx.x; i < n; i += blockDim.x) { y[i] = x[i]; }\n}\n",
                             "16-byte elements"),
        "an alias used otherwise": ("__global__ void k(const float* x, float* y, int n) {\n"
                                    "  for (int i = threadIdx.x; i < n; i += blockDim.x) {\n"
                                    "    const int j = n + i;\n    y[j] = x[j] * j;\n  }\n}\n",
                                    "j is used other than as a pointer's index"),
    }
    for name, (source, reason) in cases.items():
        result = all_passes()["vectorize"].apply(source)
        assert not result.applies and reason in result.reason, (name, result.reason)


def test_member_pointers_and_an_index_alias_are_packed(tmp_path):
    source = """
#include <cstdint>
struct Rows {
  const float* src;
  float* dst;
};
__global__ void copy_rows(Rows rows, float* __restrict__ out, int n) {
  const int row_offset = blockIdx.x * n;
  for (int i = threadIdx.x; i < n; i += blockDim.x) {
    const int idx = row_offset + i;
    out[idx] = rows.src[idx] * 0.5f;
  }
}
"""
    result = all_passes()["vectorize"].apply(source)
    assert result.applies, result.reason
    out = result.source
    assert "reinterpret_cast<uintptr_t>(&rows.src[row_offset]) % 16 == 0" in out
    assert "*reinterpret_cast<uint4*>(src_pack) = *reinterpret_cast<const uint4*>(&rows.src[row_offset + i_first]);" \
        in out
    assert "out_pack[lane] = src_pack[lane] * 0.5f;" in out
    packed = out[out.index("#pragma unroll"):out.index("} else {")]
    assert "const int idx" not in packed.split("for (int i =")[0]  # the alias is gone from the packed body
    assert out.count("const int idx = row_offset + i;") == 2  # kept in the tail and the fallback
    assert compiles(tmp_path, out) == ""


def test_mixed_element_types_move_kpack_elements_each(tmp_path):
    source = """
#include <cstdint>
#include <cuda_fp16.h>
__global__ void widen(float* __restrict__ out, const __half* __restrict__ in, const float* scale, int n) {
  for (int i = 0; i < n; ++i) out[i] = __half2float(in[i]) * scale[i];
}
"""
    result = all_passes()["vectorize"].apply(source)
    assert result.applies, result.reason
    out = result.source
    assert "constexpr int kPack = 16 / sizeof(float);" in out
    assert "reinterpret_cast<uintptr_t>(&in[0]) % 8 == 0" in out  # four halves: 8 bytes
    assert "reinterpret_cast<uintptr_t>(&out[0]) % 16 == 0" in out
    assert "alignas(8) __half in_pack[kPack];" in out
    assert "*reinterpret_cast<uint2*>(in_pack) = *reinterpret_cast<const uint2*>(&in[i_first]);" in out
    assert "*reinterpret_cast<uint4*>(&out[i_first]) = *reinterpret_cast<const uint4*>(out_pack);" in out
    assert compiles(tmp_path, out) == ""


def test_class_elements_are_stored_through_their_assignment(tmp_path):
    source = """
#include <cstdint>
#include <cuda_bf16.h>
struct Pair {
  unsigned short lo, hi;
  __device__ Pair& operator=(float v) { lo = static_cast<unsigned short>(v); return *this; }  // keeps hi
};
__global__ void scale(__nv_bfloat16* __restrict__ q, const __nv_bfloat16* __restrict__ in, float s, int n) {
  for (int i = threadIdx.x; i < n; i += blockDim.x) {
    q[i] = __float2bfloat16_rn(static_cast<float>(in[i]) * s);
  }
}
__global__ void low_halves(Pair* __restrict__ p, const float* __restrict__ v, int n) {
  for (int i = threadIdx.x; i < n; i += blockDim.x) {
    p[i] = v[i];
  }
}
"""
    result = all_passes()["vectorize"].apply(source)
    assert result.applies, result.reason
    assert "scale line 9" in result.reason and "low_halves line 14" in result.reason
    out = result.source
    # bf16's defaulted assignment writes the whole element: its pack is stored, never loaded
    assert "*reinterpret_cast<uint4*>(&q[i_first]) = *reinterpret_cast<const uint4*>(q_pack);" in out
    assert "reinterpret_cast<const uint4*>(&q[i_first])" not in out
    assert "q_pack[lane] = __float2bfloat16_rn(static_cast<float>(in_pack[lane]) * s);" in out
    # Pair's own operator= keeps `hi`: the pack is loaded first, so the bytes it keeps are stored back as they were
    assert "*reinterpret_cast<uint4*>(p_pack) = *reinterpret_cast<const uint4*>(&p[i_first]);" in out
    assert "*reinterpret_cast<uint4*>(&p[i_first]) = *reinterpret_cast<const uint4*>(p_pack);" in out
    assert compiles(tmp_path, out) == ""


def test_the_loop_variable_as_a_stored_value(tmp_path):
    source = """
#include <cstdint>
__global__ void first_indices(int32_t* __restrict__ out, int32_t length, int n) {
  for (int i = threadIdx.x; i < n; i += blockDim.x) {
    out[i] = (i < length) ? i : -1;
  }
}
"""
    result = all_passes()["vectorize"].apply(source)
    assert result.applies, result.reason
    out = result.source
    lane_loop = out[out.index("for (int lane = 0"):out.index("*reinterpret_cast<uint4*>(&out[i_first])")]
    assert "const int i = i_first + lane;" in lane_loop  # the element's own index
    assert "out_pack[lane] = (i < length) ? i : -1;" in lane_loop
    assert compiles(tmp_path, out) == ""


def test_uses_that_may_write_an_element_elsewhere_are_refused():
    cases = {
        "by reference": ("__device__ void bump(float& x);\n__global__ void k(const float* x, float* y, int n) {\n"
                         "  for (int i = threadIdx.x; i < n; i += blockDim.x) { y[i] = x[i]; bump(y[i]); }\n}\n",
                         "given by reference to a call that may write it"),
        "a call a template leaves open": ("template <typename T> __device__ void bump(T& x);\n"
                                          "template <typename T> __global__ void k(const T* x, T* y, int n) {\n"
                                          "  for (int i = threadIdx.x; i < n; i += blockDim.x) { y[i] = x[i]; bump(y[i]); }"
                                          "\n}\n", "given by reference to a call that may write it"),
        "volatile": ("__global__ void k(const float* x, volatile float* y, int n) {\n"
                     "  for (int i = threadIdx.x; i < n; i += blockDim.x) { y[i] = x[i]; }\n}\n",
                     "y is volatile"),
        "bases that may overlap": ("struct Rows { const float* src; float* dst; };\n"
                                   "__global__ void k(Rows rows, int n) {\n"
                                   "  for (int i = 0; i < n; ++i) { rows.dst[i] = rows.src[i]; }\n}\n",
                                   "rows.dst and rows.src may overlap"),
        "a local pointer": ("__global__ void k(float* __restrict__ x, int n) {\n  const float* in = x + 1;\n"
                            "  for (int i = 0; i < n; ++i) { x[i] = in[i]; }\n}\n", "x and in may overlap"),
        "a scalar read that may overlap": ("__global__ void k(float* y, const float* x, const float* s, int n) {\n"
                                           "  for (int i = 0; i < n; ++i) { y[i] = x[i] * s[0]; }\n}\n",
                                           "y and x may overlap"),
        "a pointer given to a call": ("__device__ float at(const float* p);\n"
                                      "__global__ void k(float* __restrict__ y, const float* x, int n) {\n"
                                      "  for (int i = 0; i < n; ++i) { y[i] = at(x); }\n}\n",
                                      "gives at a pointer"),
        "a field": ("struct P { float a, b; };\n__global__ void k(const float* x, P* y, float* z, int n) {\n"
                    "  for (int i = threadIdx.x; i < n; i += blockDim.x) { z[i] = x[i]; y[i].a = x[i]; }\n}\n",
                    "field or non-`const` method"),
    }
    for name, (source, reason) in cases.items():
        result = all_passes()["vectorize"].apply(source)
        assert not result.applies and reason in result.reason, (name, result.reason)


def test_a_strided_loop_packs_only_where_its_places_cover_the_stride():
    cases = {
        "a guard on the thread": ("__global__ void k(const float* x, float* y, int n) {\n"
                                  "  if (threadIdx.x >= 64) {\n"
                                  "    for (int i = threadIdx.x; i < n; i += blockDim.x) { y[i] = x[i]; }\n  }\n}\n",
                                  "not every thread of the CTA reaches the loop"),
        "a device function": ("__device__ void f(const float* x, float* y, int n) {\n"
                              "  for (int i = threadIdx.x; i < n; i += blockDim.x) { y[i] = x[i]; }\n}\n",
                              "not every thread of the CTA reaches the loop"),
        "a stride of unknown threads": ("__global__ void k(const float* x, float* y, int n, int s) {\n"
                                        "  for (int i = threadIdx.x; i < n; i += s) { y[i] = x[i]; }\n}\n",
                                        "is not known to be the number of places"),
        "a lane's place": ("__global__ void k(const float* x, float* y, int n) {\n"
                           "  for (int i = threadIdx.x % 32; i < n; i += 32) { y[i] = x[i]; }\n}\n",
                           "a lane's place"),
    }
    for name, (source, reason) in cases.items():
        result = all_passes()["vectorize"].apply(source)
        assert not result.applies and reason in result.reason, (name, result.reason)


LAUNCHED = LAUNCHER + """
constexpr int kThreads = 128;
__global__ void copy(const float* __restrict__ x, float* __restrict__ y, int n) {
  for (int i = threadIdx.x; i < n; i += kThreads) { y[i] = x[i]; }
}
void run(const float* x, float* y, int n, cudaStream_t stream) {
  LaunchKernel(1, BLOCK, stream)(copy, x, y, n);
}
"""


def test_a_constant_stride_every_launch_gives_as_its_block(tmp_path):
    result = all_passes()["vectorize"].apply(LAUNCHED.replace("BLOCK", "kThreads"))
    assert result.applies, result.reason
    assert "for (int i_pack = threadIdx.x; i_pack < (n) / kPack; i_pack += kThreads)" in result.source
    assert compiles(tmp_path, result.source) == ""
    other = all_passes()["vectorize"].apply(LAUNCHED.replace("BLOCK", "256"))
    assert not other.applies and "is not known to be the number of places" in other.reason


def test_a_stride_in_the_kernels_template_parameters_its_launches_bind(tmp_path):
    source = LAUNCHER + """
template <int kWarps>
__global__ void zero(float* __restrict__ y, int n) {
  for (int i = threadIdx.x; i < n; i += kWarps * 32) { y[i] = 0.f; }
}
template <int kWarps>
void run(float* y, int n, cudaStream_t stream) {
  LaunchKernel(1, kWarps * 32, stream)(zero<kWarps>, y, n);
}
template void run<4>(float*, int, cudaStream_t);
"""
    result = all_passes()["vectorize"].apply(source)
    assert result.applies, result.reason
    assert "i_pack += kWarps * 32" in result.source
    assert compiles(tmp_path, result.source) == ""
    other = all_passes()["vectorize"].apply(source.replace("LaunchKernel(1, kWarps * 32", "LaunchKernel(1, kWarps * 64"))
    assert not other.applies and "is not known to be the number of places" in other.reason


LOOSE = {"tolerance": {"bfloat16": {"atol": 1e-2, "rtol": 1e-2}, "float32": {"atol": 1e-5, "rtol": 1e-5}}}
EXACT = {"tolerance": {"bfloat16": {"atol": 0.0, "rtol": 0.0}}}
REDUCE = """
#include <cstdint>
#include <cuda_bf16.h>
template <typename T, typename Op>
__device__ T block_combine(T v, Op op) {
  __shared__ T parts[1024];
  parts[threadIdx.x] = v;
  __syncthreads();
  T total = parts[0];
  int k = 1;
  while (k < blockDim.x) total = op(total, parts[k++]);  // a while loop: no site of the pass
  __syncthreads();
  return total;
}
template <typename T>
__device__ T blockReduceSum(T v) { return block_combine(v, [](T a, T b) { return a + b; }); }
__device__ float blockReduceMax(float v) { return block_combine(v, [](float a, float b) { return fmaxf(a, b); }); }
"""
RMSNORM = REDUCE + """
__global__ void rms_partial(const __nv_bfloat16* __restrict__ x, float* __restrict__ partial, int d) {
  float sum_sq = 0.f;
  for (int i = threadIdx.x; i < d; i += blockDim.x) {
    const float v = __bfloat162float(x[blockIdx.x * d + i]);
    sum_sq += v * v;
  }
  sum_sq = blockReduceSum(sum_sq);
  if (threadIdx.x == 0) partial[blockIdx.x] = rsqrtf(sum_sq / d + 1e-6f);
}
"""
ABSMAX = REDUCE + """
__global__ void absmax(const float* __restrict__ x, float* __restrict__ scale, int n) {
  float amax = 0.f;
  int nonzero = 0;
  for (int i = threadIdx.x; i < n; i += blockDim.x) {
    amax = fmaxf(fabsf(x[blockIdx.x * n + i]), amax);
    nonzero += x[blockIdx.x * n + i] != 0.f;
  }
  amax = blockReduceMax(amax);
  nonzero = blockReduceSum(nonzero);
  if (threadIdx.x == 0) scale[blockIdx.x] = amax * nonzero;
}
"""


def test_a_float_sum_of_squares_is_packed_where_the_tolerance_admits_regrouping(tmp_path):
    result = all_passes()["vectorize"].apply(RMSNORM, LOOSE)
    assert result.applies, result.reason
    assert "the float sum into sum_sq regrouped: the spec's tolerance admits a few ulp" in result.reason
    out = result.source
    assert "*reinterpret_cast<uint4*>(x_pack) = *reinterpret_cast<const uint4*>(&x[blockIdx.x * d + i_first]);" in out
    assert "const float v = __bfloat162float(x_pack[lane]);" in out
    assert out.count("sum_sq += v * v;") == 3  # the packs, the tail, the fallback: one accumulator throughout
    assert "float sum_sq = 0.f;" in out and out.count("float sum_sq") == 1
    assert compiles(tmp_path, out) == ""
    # no spec: the harness's tolerance decides, as for fast_math
    unchecked = all_passes()["vectorize"].apply(RMSNORM)
    assert unchecked.applies and "no spec given: the harness's tolerance decides" in unchecked.reason


def test_a_float_sum_is_refused_on_a_bit_exact_spec():
    for spec in (EXACT, {"tolerance": {}}):
        result = all_passes()["vectorize"].apply(RMSNORM, spec)
        assert not result.applies
        assert "sum_sq accumulates a float sum, whose rounding depends on which elements each thread takes" \
            in result.reason
        assert "exact" in result.reason


def test_max_and_integer_accumulators_need_no_tolerance(tmp_path):
    result = all_passes()["vectorize"].apply(ABSMAX, EXACT)
    assert result.applies, result.reason
    assert "regrouped" not in result.reason
    out = result.source
    assert "amax = fmaxf(fabsf(x_pack[lane]), amax);" in out and "nonzero += x_pack[lane] != 0.f;" in out
    assert compiles(tmp_path, out) == ""
    # a float max through a `max` that may not be IEEE's maxNum asks the spec, as a sum does
    generic = ABSMAX.replace("fmaxf(fabsf(", "max(fabsf(")
    refused = all_passes()["vectorize"].apply(generic, EXACT)
    assert not refused.applies and "amax accumulates a float max, through `max`" in refused.reason


def test_a_serial_loop_keeps_its_order_and_its_float_sum():
    source = ("__global__ void k(const float* __restrict__ x, float* __restrict__ y, int n) {\n  float s = 0.f;\n"
              "  for (int i = 0; i < n; ++i) s += x[i];\n  y[0] = s;\n}\n")
    result = all_passes()["vectorize"].apply(source, EXACT)
    assert result.applies, result.reason
    assert "for (int i_pack = 0; i_pack < (n) / kPack; ++i_pack)" in result.source


def test_writes_that_are_not_accumulator_updates_are_refused():
    head = ("__device__ float blockReduceSum(float);\n__device__ float blockReduceMax(float);\n"
            "__device__ float warpReduceSum(float);\n"
            "__global__ void k(const float* __restrict__ x, float* __restrict__ y, int n{}) {{\n{}")
    loop = "  for (int i = threadIdx.x; i < n; i += blockDim.x) {{ {} }}\n  y[blockIdx.x] = blockReduceSum(s);\n}}\n"
    cases = {
        "read elsewhere": ("  float s = 0.f;\n", "s += x[i]; if (s > 1.f) y[i] = x[i];",
                           "s is read elsewhere in the loop"),
        "a conditional update": ("  float s = 0.f;\n", "if (x[i] > 0.f) s += x[i];", "under a condition"),
        "an update reading another accumulator": ("  float s = 0.f, m = 1.f;\n", "m = fmaxf(m, x[i]); s += x[i] / m;",
                                                  "the update of s reads m, another accumulator"),
        "an update reading itself": ("  float s = 0.f;\n", "s += s * x[i];", "the update of s reads s"),
        "two updates": ("  float s = 0.f;\n", "s += x[i]; s *= 0.5f;", "writes s (declared outside the loop) more than once"),
        "not an update form": ("  float s = 0.f;\n", "s = x[i] - s;", "other than as an accumulator update"),
        "an integer rounding a float": ("  int s = 0;\n", "s += x[i];", "s is an integer updated with a value of type"),
        "a pointer": ("  const float* s = x;\n", "s += 1; y[i] = x[i];", "declared outside the loop and a pointer"),
        "__shared__": ("  __shared__ float s;\n", "s += x[i];", "`__shared__` or `static` memory"),
        "an array element": ("  float a[2] = {0.f, 0.f};\n  float s = 0.f;\n", "y[i] = x[i]; a[0] += x[i];",
                             "the body writes a[0], neither an element it packs nor a local of its own"),
        "a reference": ("  float t = 0.f;\n  float& s = t;\n", "s += x[i];",
                        "declared outside the loop and a reference"),
        "bound to a reference": ("  float s = 0.f;\n  float& r = s;\n", "s += x[i] * r;",
                                 "s's address is taken or a reference is bound to it"),
        "a parameter": ("", "s += x[i];", "the body writes s, a parameter"),
        "the last value stored": ("  float s = 0.f;\n", "y[i] = x[i]; y[n + threadIdx.x] = x[i];",
                                  "the body writes y[n + threadIdx.x], neither an element it packs"),
    }
    # a strided loop's partials are per thread: packs change them, and only the CTA's combination is the same
    partial = "  float s = 0.f;\n  for (int i = threadIdx.x; i < n; i += blockDim.x) {{ s += x[i]; }}\n{}}}\n"
    combined = {
        "a thread's own partial stored": ("", partial.format("  y[threadIdx.x] = s;\n"),
                                          "s is read after the loop other than by a block-wide sum reduction"),
        "a warp's reduction": ("", partial.format("  y[threadIdx.x] = warpReduceSum(s);\n"),
                               "other than by a block-wide sum reduction"),
        "a block reduction of another kind": ("", partial.format("  y[0] = blockReduceMax(s);\n"),
                                              "other than by a block-wide sum reduction"),
        "the grid's index": ("", "  float s = 0.f;\n  for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < n; "
                                 "i += blockDim.x * gridDim.x) { s += x[i]; }\n  y[0] = blockReduceSum(s);\n}\n",
                             "accumulates per thread of the grid"),
        "a partial carried over rounds": ("", "  float s = 0.f;\n  for (int r = 0; r < 4; ++r) {\n"
                                              "    for (int i = threadIdx.x; i < n; i += blockDim.x) { s += x[r * n + i]; }\n"
                                              "    y[r] = blockReduceSum(s);\n  }\n}\n",
                                          "s is declared outside a loop around this one"),
    }
    for name, (before, statements, reason) in {**cases, **combined}.items():
        tail = statements if name in combined else loop.format(statements)
        source = head.format(", float s" if name == "a parameter" else "", before) + tail
        result = all_passes()["vectorize"].apply(source, LOOSE)
        if name == "a partial carried over rounds":  # the outer loop refuses first: the inner one's reason
            unit = parse(source)
            reasons = []
            for _, _, edit in _loops(unit, LOOSE):
                try:
                    edit()
                except Refusal as refusal:
                    reasons.append(str(refusal))
            result = PassResult(False, None, "; ".join(reasons))
        assert not result.applies and reason in result.reason, (name, result.reason)


def test_an_integer_count_combined_by_an_atomic_into_shared_memory(tmp_path):
    source = """
#include <cstdint>
__global__ void count_routes(const int32_t* __restrict__ ids, int32_t* __restrict__ counts, int32_t n) {
  __shared__ int32_t count;
  if (threadIdx.x == 0) count = 0;
  __syncthreads();
  int32_t local_count = 0;
  for (int32_t i = threadIdx.x; i < n; i += blockDim.x) {
    local_count += ids[i] == static_cast<int32_t>(blockIdx.x);
  }
  atomicAdd(&count, local_count);
  __syncthreads();
  if (threadIdx.x == 0) counts[blockIdx.x] = count;
}
"""
    result = all_passes()["vectorize"].apply(source, EXACT)
    assert result.applies, result.reason
    assert "local_count += ids_pack[lane] == static_cast<int32_t>(blockIdx.x);" in result.source
    assert compiles(tmp_path, result.source) == ""
    per_thread = source.replace("atomicAdd(&count, local_count);", "atomicAdd(&counts[threadIdx.x], local_count);")
    refused = all_passes()["vectorize"].apply(per_thread, EXACT)
    assert not refused.applies and "other than by a block-wide sum reduction" in refused.reason
    guarded = source.replace("atomicAdd(&count, local_count);", "if (threadIdx.x < 32) atomicAdd(&count, local_count);")
    refused = all_passes()["vectorize"].apply(guarded, EXACT)
    assert not refused.applies and "not every thread of the CTA reaches the reduction of local_count" in refused.reason
