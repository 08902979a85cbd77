"""Passes compose: each reads another's output, and the result of all of them still builds."""

from astra.optimize.passes import all_passes
from tests.astra.optimize.passes.nvcc import compiles
from tests.astra.optimize.passes.test_coarsen import LAUNCHER

KERNEL = LAUNCHER + """
template <typename T>
__global__ void softmax_scale(T* __restrict__ out, const T* __restrict__ in, const float* __restrict__ temp, int n) {
  const int row = blockIdx.x;
  for (int i = threadIdx.x; i < n; i += blockDim.x) {
    out[row * n + i] = static_cast<T>(expf(static_cast<float>(in[row * n + i]) / temp[row]));
  }
}

template <typename T>
void launch(T* out, const T* in, const float* temp, int rows, int n, cudaStream_t stream) {
  LaunchKernel(rows, 256, stream)(softmax_scale<T>, out, in, temp, n);
}
"""


def test_every_pass_applies_to_the_previous_ones_output_and_it_builds(tmp_path):
    source, done = KERNEL, []
    for name in ("reuse", "fast_math", "vectorize", "coarsen"):
        result = all_passes()[name].apply(source)
        assert result.applies, (name, result.reason)
        source, done = result.source, done + [name]
    assert "const int row = block_row;" in source
    # reuse took the division by temp[row] out of the loop as a reciprocal; fast_math made that one __fdividef
    assert "const float temp_rcp = __fdividef(1.0f, (temp[row]));" in source and "* temp_rcp" in source
    assert "__expf(" in source and "__fdividef(" in source
    assert "alignas(16) T out_pack[kPack];" in source
    assert "static_cast<uint32_t>(rows)" in source
    assert compiles(tmp_path, source, "template void launch<float>(float*, const float*, const float*, int, int, "
                                      "cudaStream_t);") == ""
    again = all_passes()["reuse"].apply(source)  # nothing left to move: it says so instead of rewriting
    assert not again.applies and again.reason
