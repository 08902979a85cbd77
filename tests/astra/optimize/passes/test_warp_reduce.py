"""warp_reduce: a shared-memory tree reduction becomes shuffles when the block is one warp."""

from astra.optimize.passes import all_passes
from tests.astra.optimize.passes.nvcc import compiles

KERNEL = """
__global__ void row_max(float* __restrict__ out, const float* __restrict__ in, int n) {
  __shared__ float buf[1024];
  const int tid = threadIdx.x;
  float m = -1e30f;
  for (int i = tid; i < n; i += blockDim.x) m = fmaxf(m, in[blockIdx.x * n + i]);
  buf[tid] = m;
  __syncthreads();
  for (int s = blockDim.x / 2; s > 0; s >>= 1) {
    if (tid < s) {
      buf[tid] = fmaxf(buf[tid], buf[tid + s]);
    }
    __syncthreads();
  }
  if (tid == 0) out[blockIdx.x] = buf[0];
}
"""


def test_guarded_shuffles_replace_the_tree_and_build(tmp_path):
    result = all_passes()["warp_reduce"].apply(KERNEL)
    assert result.applies, result.reason
    out = result.source
    guard, original = out.index("if (blockDim.x == 32) {"), out.index("for (int s = blockDim.x / 2")
    assert guard < out.index("__shfl_xor_sync(0xffffffffu, value, offset)") < original
    assert "value = fmaxf(value, __shfl_xor_sync(0xffffffffu, value, offset));" in out
    assert "if (tid == 0) buf[0] = value;" in out and "__syncwarp();" in out
    assert compiles(tmp_path, out) == ""


def test_refused_without_a_tree_reduction():
    source = KERNEL.replace("__syncthreads();\n  }", "}")  # no barrier in the loop: not the tree it knows
    result = all_passes()["warp_reduce"].apply(source)
    assert not result.applies and "no shared-memory tree reduction" in result.reason


# the final stage of a two-level block reduction: warp partials in shared memory, a barrier, warp 0 (or
# thread 0) reduces them and broadcasts the result through shared memory behind a second barrier
TWO_LEVEL = """
__global__ void row_scale(float* __restrict__ out, const float* __restrict__ in, int n, float eps) {
  __shared__ float partial[32];
  const unsigned tid = threadIdx.x;
  const unsigned lane = tid % 32;
  const unsigned warp = tid / 32;
  float sum = 0.0f;
  for (int i = tid; i < n; i += blockDim.x) sum += in[blockIdx.x * n + i] * in[blockIdx.x * n + i];
  for (int offset = 16; offset > 0; offset >>= 1) sum += __shfl_xor_sync(0xffffffffu, sum, offset);
  if (lane == 0) partial[warp] = sum;
  __syncthreads();
  if (warp == 0) {
    float v = tid < blockDim.x / 32 ? partial[tid] : 0.0f;
    for (int offset = 16; offset > 0; offset >>= 1) v += __shfl_xor_sync(0xffffffffu, v, offset);
    partial[tid] = rsqrtf(v / n + eps);
  }
  __syncthreads();
  const float scale = partial[warp];
  for (int i = tid; i < n; i += blockDim.x) out[blockIdx.x * n + i] = in[blockIdx.x * n + i] * scale;
}
"""

SERIAL = """
__global__ void block_count(int* __restrict__ counts, const int* __restrict__ in, int n) {
  __shared__ int warp_sums[8];
  __shared__ int total;
  int partial = 0;
  for (int i = threadIdx.x; i < n; i += 256) partial += in[i] > 0;
  for (int offset = 16; offset >= 1; offset /= 2) partial += __shfl_xor_sync(0xffffffffu, partial, offset);
  if ((threadIdx.x & 31) == 0) warp_sums[threadIdx.x >> 5] = partial;
  __syncthreads();
  if (threadIdx.x == 0) {
    int sum = 0;
    for (int w = 0; w < 8; ++w) sum += warp_sums[w];
    total = sum;
    counts[blockIdx.x] = sum;
  }
  __syncthreads();
  if (threadIdx.x < total) counts[gridDim.x + threadIdx.x] = total;
}
"""


def test_final_warp_runs_in_every_warp_without_the_broadcast_barrier(tmp_path):
    result = all_passes()["warp_reduce"].apply(TWO_LEVEL)
    assert result.applies, result.reason
    out = result.source
    assert "final stage run by every warp" in out and out.count("__syncthreads();") == 1
    assert "float v = (tid % 32) < blockDim.x / 32 ? partial[(tid % 32)] : 0.0f;" in out
    assert "partial_tid = rsqrtf(v / n + eps);" in out and "const float scale = partial_tid;" in out
    assert "if (warp == 0)" not in out
    assert compiles(tmp_path, out) == ""


def test_serial_final_thread_runs_in_every_thread_and_keeps_its_global_store(tmp_path):
    result = all_passes()["warp_reduce"].apply(SERIAL)
    assert result.applies, result.reason
    out = result.source
    assert "final stage run by every thread" in out and out.count("__syncthreads();") == 1
    assert "total_value = sum;" in out and "if (threadIdx.x == 0) counts[blockIdx.x] = sum;" in out
    assert "if (threadIdx.x < total_value) counts[gridDim.x + threadIdx.x] = total_value;" in out
    assert compiles(tmp_path, out) == ""


def _refusal(source: str) -> str:
    result = all_passes()["warp_reduce"].apply(source)
    assert not result.applies
    return result.reason


def test_refused_in_a_loop():
    looped = TWO_LEVEL.replace("  float sum = 0.0f;", "  for (int r = 0; r < 2; ++r) {\n  float sum = 0.0f;").replace(
        "  const float scale = partial[warp];", "  const float scale = partial[warp];\n  out[r] = scale;\n  }")
    assert "inside a loop" in _refusal(looped)


def test_refused_when_the_stored_value_differs_between_lanes():
    # no butterfly: each lane of warp 0 stores its own partial
    source = TWO_LEVEL.replace("    for (int offset = 16; offset > 0; offset >>= 1) v += __shfl_xor_sync(0xffffffffu, v, "
                               "offset);\n", "")
    assert "may differ between the lanes" in _refusal(source)


def test_refused_with_a_lane_dependent_shuffle():
    source = TWO_LEVEL.replace("v += __shfl_xor_sync(0xffffffffu, v, offset)", "v += __shfl_down_sync(0xffffffffu, v, offset)")
    assert "__shfl_down_sync" in _refusal(source)


def test_refused_when_the_partials_are_written_again_before_a_barrier():
    source = TWO_LEVEL.replace("  const float scale = partial[warp];", "  const float scale = partial[warp];\n"
                               "  partial[lane] = 0.0f;")
    assert "partial is written after the final stage" in _refusal(source)
    other = SERIAL.replace("  if (threadIdx.x < total)", "  warp_sums[threadIdx.x >> 5] = 0;\n  if (threadIdx.x < total)")
    assert "warp_sums is used again after the final stage before a barrier" in _refusal(other)


def test_refused_when_a_slot_is_read_that_the_stage_does_not_store():
    source = SERIAL.replace("if (threadIdx.x < total)", "if (threadIdx.x < warp_sums[1])")
    assert "warp_sums" in _refusal(source)
    slot = TWO_LEVEL.replace("partial[tid] = rsqrtf", "partial[0] = rsqrtf")
    assert "partial[warp] is read after the final stage" in _refusal(slot)


def test_refused_for_a_stage_that_reads_global_memory_or_uses_the_thread_index():
    source = SERIAL.replace("int sum = 0;", "int sum = counts[0];")
    assert "reads memory other than shared memory" in _refusal(source)
    assert "reads the thread's index" in _refusal(SERIAL.replace("sum += warp_sums[w];", "sum += warp_sums[w] + threadIdx.x;"))


def test_refused_in_a_device_helper():
    helper = SERIAL.replace("__global__ void block_count", "__device__ void block_count")
    assert "device helper" in _refusal(helper)
