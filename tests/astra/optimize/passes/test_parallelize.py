"""parallelize: a loop one thread of a CTA (or lane of a warp) runs is spread over the group, soundly or not at all."""

from astra.optimize.passes import all_passes
from tests.astra.optimize.passes.nvcc import compiles

CTA = """
__global__ void renorm(float* __restrict__ out, int* __restrict__ idx, const float* __restrict__ in, int top_k,
                       bool renormalize, int* __restrict__ done) {
  const int row = blockIdx.x;
  float row_sum = 0.f;
  if (threadIdx.x == 0) {
    for (int k = 0; k < top_k; ++k) {
      out[row * top_k + k] = in[row * top_k + k];
      row_sum += in[row * top_k + k];
    }
  }
  __syncthreads();
  if (renormalize && threadIdx.x == 0) {
    const float inv = 1.f / row_sum;
    for (int k = 0; k < top_k; ++k) {
      const int at = row * top_k + k;
      out[at] = out[at] * inv;
      idx[at] = k;
    }
    done[row] = 1;
  }
  if (threadIdx.x == 0) done[row] += 1;
}
"""

WARP = """
__global__ void pick(float* __restrict__ out, const float* __restrict__ scores, const int* __restrict__ chosen,
                     int top_k, float scale) {
  const int lane = threadIdx.x % 32;
  const int warp = threadIdx.x / 32;
  const int row = blockIdx.x * (blockDim.x / 32) + warp;
  float total = 1.f;
  if (lane == 0) total = scores[row];
  if (lane == 0) {
    const float inv = scale / total;
    for (int k = 0; k < top_k; ++k) {
      out[row * top_k + k] = scores[chosen[k]] * inv;
    }
  }
}
"""


def apply(source: str):
    return all_passes()["parallelize"].apply(source)


def test_cta_loop_spread_with_the_guard_threads_values_shared_and_barriers(tmp_path):
    result = apply(CTA)
    assert result.applies, result.reason
    assert "renorm line 13 (CTA)" in result.reason
    out = result.source
    # the reduction into row_sum stays on thread 0: its loop is untouched
    assert "if (threadIdx.x == 0) {\n    for (int k = 0; k < top_k; ++k) {\n      out[row * top_k + k]" in out
    # thread 0 computes inv and hands it over through shared memory, then the whole CTA runs the loop
    hand = ("  __shared__ float inv_shared;\n  if (renormalize && threadIdx.x == 0) {\n    const float inv = 1.f / row_sum;\n"
            "    inv_shared = inv;\n  }\n  __syncthreads();")
    assert hand in out
    spread = ("  if (renormalize) {\n    const float inv = inv_shared;\n"
              "    for (int k = threadIdx.x; k < top_k; k += blockDim.x) {\n      const int at = row * top_k + k;\n"
              "      out[at] = out[at] * inv;\n      idx[at] = k;\n    }\n  }\n  __syncthreads();")
    assert spread in out
    # what followed the loop in the guard stays thread 0's, after the barrier
    assert out.index(spread) < out.index("  if (renormalize && threadIdx.x == 0) {\n    done[row] = 1;\n  }")
    assert compiles(tmp_path, out) == ""


def test_warp_loop_spread_with_a_shuffle_from_lane_0(tmp_path):
    result = apply(WARP)
    assert result.applies, result.reason
    out = result.source
    assert "  float inv_lane0{};" in out and "    inv_lane0 = inv;" in out
    assert "  __syncwarp();" in out
    assert "    const float inv = __shfl_sync(0xffffffffu, inv_lane0, 0, 32);" in out
    assert "    for (int k = lane; k < top_k; k += 32) {" in out
    # `row` is the same across a warp (blockIdx and the warp's index): read directly, not shuffled
    assert "__shfl_sync(0xffffffffu, row" not in out
    assert "if (lane == 0) total = scores[row];" in out  # a guard without a loop is left alone
    assert compiles(tmp_path, out) == ""


def test_an_unguarded_value_of_thread_0_is_handed_over_too():
    source = CTA.replace("    const float inv = 1.f / row_sum;\n", "").replace("out[at] * inv", "out[at] / row_sum")
    out = apply(source).source
    assert "__shared__ float row_sum_shared;" in out and "row_sum_shared = row_sum;" in out
    assert "const float row_sum = row_sum_shared;" in out


def refusal(source: str) -> str:
    result = apply(source)
    assert not result.applies and result.source is None
    return result.reason


def guarded(loop: str, params: str = "float* __restrict__ out, const float* __restrict__ in, int n",
            before: str = "", guard: str = "threadIdx.x == 0", qualifier: str = "__global__") -> str:
    return (f"{qualifier} void k({params}) {{\n{before}  if ({guard}) {{\n    {loop}\n  }}\n}}\n")


def test_refusals_name_the_precondition_that_failed():
    cases = {
        "carried": (guarded("for (int i = 1; i < n; ++i) { out[i] = out[i - 1] + in[i]; }"),
                    "reads out at another element than it writes"),
        "reduction": (guarded("for (int i = 0; i < n; ++i) { s += in[i]; }", before="  float s = 0.f;\n"),
                      "writes s, declared outside it"),
        "break": (guarded("for (int i = 0; i < n; ++i) { if (in[i] < 0) break; out[i] = in[i]; }"),
                  "breaks, continues, returns"),
        "atomic": (guarded("for (int i = 0; i < n; ++i) { atomicAdd(&out[0], in[i]); }"),
                   "synchronises or talks to other threads (atomicAdd)"),
        "opaque call": (guarded("for (int i = 0; i < n; ++i) { out[i] = f(in[i]); }").replace(
            "__global__", "__device__ float f(float);\n__global__"), "calls f, which may have side effects"),
        "same element twice": (guarded("for (int i = 0; i < n; ++i) { out[i / 2] = in[i]; }"),
                               "out's subscript is not the loop variable plus a loop-invariant offset"),
        "aliasing outputs": (guarded("for (int i = 0; i < n; ++i) { a[i] = 1.f; b[i] = 2.f; }",
                                     params="float* a, float* b, int n"), "writes a and b, which may alias"),
        "registers": (guarded("for (int i = 0; i < 4; ++i) { out[i] = acc[i]; }",
                              before="  float acc[4] = {1.f, 2.f, 3.f, 4.f};\n"),
                      "reads acc, a local array (the guard thread's registers)"),
        "device function": (guarded("for (int i = 0; i < n; ++i) { out[i] = in[i]; }", qualifier="__device__"),
                            "in a __device__ function"),
        "divergent return": (guarded("for (int i = 0; i < n; ++i) { out[i] = in[i]; }",
                                     before="  if (threadIdx.x >= n) return;\n"),
                             "a return at line 2 under a condition its CTA's threads may disagree on"),
        "2-D block": (guarded("for (int i = 0; i < n; ++i) { out[threadIdx.y * n + i] = in[i]; }"),
                      "threadIdx.y/z"),
        "bound in memory": (guarded("for (int i = 0; i < *len; ++i) { out[i] = in[i]; }",
                                    params="float* __restrict__ out, const float* __restrict__ in, const int* len"),
                            "the loop's bound reads memory or calls a function"),
    }
    for name, (source, reason) in cases.items():
        assert reason in refusal(source), name


def test_a_guard_under_a_thread_dependent_condition_is_refused():
    source = ("__global__ void k(float* __restrict__ out, const float* __restrict__ in, int n) {\n"
              "  if (in[threadIdx.x] > 0.f) {\n    if (threadIdx.x == 0) {\n"
              "      for (int i = 0; i < n; ++i) out[i] = in[i];\n    }\n  }\n}\n")
    assert "the guard is under a condition its CTA's threads may disagree on" in refusal(source)


def test_no_guarded_loop_says_so():
    source = "__global__ void k(float* out, int n) {\n  for (int i = threadIdx.x; i < n; i += blockDim.x) out[i] = 0.f;\n}\n"
    assert "no loop run by one thread" in refusal(source)
