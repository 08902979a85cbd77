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
