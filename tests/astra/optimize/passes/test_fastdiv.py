"""fastdiv: a thread's index split by launch arguments with a multiply-high and a shift, in a copy of the kernel
launched where the values fit; checked on small kernels of our own, compiled with the real nvcc, and the
emitted arithmetic run on this machine's CPU against the division it replaces."""

import random
import subprocess

import pytest

from astra.optimize.passes import all_passes
from astra.optimize.passes.fastdiv import HELPER
from tests.astra.optimize.passes.nvcc import compiles
from tests.astra.optimize.passes.test_coarsen import LAUNCHER

KERNEL = LAUNCHER + """
namespace demo {
constexpr int kPack = 2;

template <typename T>
__global__ void rope_like(T* __restrict__ out, const T* __restrict__ in, const float* __restrict__ table,
                          int64_t total, int64_t heads, int64_t half, int64_t seq) {
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  const int64_t per_token = heads * half;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < total; i += stride) {
    const int64_t pair = i % half;
    const int64_t row = i / per_token;
    const int64_t token = row % seq;
    const int64_t lane = (i / kPack) % (half * kPack);
    out[i] = static_cast<T>(static_cast<float>(in[i]) * table[token * half + pair] + lane * 0.f);
  }
}

template <typename T>
struct RopeLike {
  static void run(T* out, const T* in, const float* table, int64_t total, int64_t heads, int64_t half,
                  int64_t seq, cudaStream_t stream) {
    LaunchKernel((total + 255) / 256, 256, stream)(rope_like<T>, out, in, table, total, heads, half, seq);
  }
};
}  // namespace demo
"""


def fastdiv(source: str):
    return all_passes()["fastdiv"].apply(source)


def test_a_copy_divides_by_multiplying_and_the_launch_takes_it_where_the_values_fit(tmp_path):
    result = fastdiv(KERNEL)
    assert result.applies, result.reason
    out = result.source
    assert "rope_like (4 sites:" in result.reason
    # the original stays whole, for values that do not fit
    assert "const int64_t pair = i % half;" in out
    assert "__global__ void rope_like_fastdiv(T* __restrict__ out" in out
    assert ("int64_t seq, AstraFastDivisor half_div, AstraFastDivisor per_token_div, AstraFastDivisor seq_div, "
            "AstraFastDivisor half_kPack_div) {") in out
    assert "const int64_t pair = static_cast<int64_t>(astra_mod(static_cast<uint32_t>(i), half_div));" in out
    assert "const int64_t row = static_cast<int64_t>(astra_div(static_cast<uint32_t>(i), per_token_div));" in out
    assert "const int64_t token = static_cast<int64_t>(astra_mod(static_cast<uint32_t>(row), seq_div));" in out
    # a remainder of a quotient by a constant: the compiler divides by the constant already, kept; its bound joins
    assert "astra_mod(static_cast<uint32_t>((i / kPack)), half_kPack_div)" in out
    # the host computes the divisors from the launch's own arguments, the const local through its initializer
    # a constant of the file's namespaces is named in full: a launch may stand in another namespace
    assert ("if (astra_fastdiv_fits((total), (half), ((heads) * (half)), (seq), ::demo::kPack, ((half) * "
            "::demo::kPack))) {") in out
    assert "rope_like_fastdiv<T>, out, in, table, total, heads, half, seq, astra_fast_divisor((half))" in out
    assert "} else {\n      LaunchKernel((total + 255) / 256, 256, stream)(rope_like<T>, out, in" in out
    assert out.index("struct AstraFastDivisor") < out.index("template <typename T>\n__global__ void rope_like(")
    assert compiles(tmp_path, out, "template struct demo::RopeLike<float>;") == ""


def test_a_chevron_launch_and_a_struct_parameter(tmp_path):
    source = """
#include <cstdint>
#include <cuda_runtime.h>
struct Params { float* out; const float* in; int channels; int spatial; int n; };
__global__ void per_channel(const Params __grid_constant__ p) {
  for (int v = blockIdx.x * blockDim.x + threadIdx.x; v < p.n; v += blockDim.x * gridDim.x) {
    const int c = (v / p.spatial) % p.channels;
    p.out[v] = p.in[v] * c;
  }
}
void launch(const Params& params, cudaStream_t stream) {
  if (params.n > 0)
    per_channel<<<(params.n + 127) / 128, 128, 0, stream>>>(params);
}
"""
    result = fastdiv(source)
    assert result.applies, result.reason
    out = result.source
    assert ("const int c = static_cast<int>(astra_mod(static_cast<uint32_t>((static_cast<int>(astra_div("
            "static_cast<uint32_t>(v), p_spatial_div)))), p_channels_div));") in out
    # an int counter: exact below 2^31, so the launch's thread count joins the values that must fit
    assert ("if (astra_fastdiv_fits((params).n, astra_fastdiv_threads(dim3((params.n + 127) / 128), dim3(128)), "
            "(params).spatial, (params).channels)) {") in out
    assert ("per_channel_fastdiv<<<(params.n + 127) / 128, 128, 0, stream>>>(params, "
            "astra_fast_divisor((params).channels), astra_fast_divisor((params).spatial));") in out
    assert "  if (params.n > 0)\n    if (astra_fastdiv_fits(" in out  # one statement under the caller's `if`
    assert compiles(tmp_path, out) == ""


@pytest.mark.parametrize("body, reason", [
    ("out[i] = in[i / 4];", "no integer division or remainder by a launch argument"),  # the compiler's
    ("out[i] = in[(i * 3) / n];", "is not known to lie in [0, 2^31)"),
    ("out[i] = in[i / in_n[0]];", "reads memory or calls"),
    ("n -= 1; out[i] = in[i % n];", "changes its parameter n"),
    ("out[i] = in[i / (n + threadIdx.x)];", "no integer division or remainder by a launch argument"),
    ("out[i] = in[i / (n * sizeof(T))];", "depends on the kernel's template parameter T"),
    ("const int w = n * sizeof(T); out[i] = in[i % w];", "depends on the kernel's template parameter T"),
])
def test_it_refuses_what_it_cannot_prove(body, reason):
    source = LAUNCHER + f"""
template <typename T>
__global__ void k(float* out, const float* in, const int* in_n, int total, int n) {{
  for (int i = threadIdx.x; i < total; i += blockDim.x) {{ {body} }}
}}
void launch(float* out, const float* in, const int* in_n, int total, int n, cudaStream_t s) {{
  LaunchKernel(1, 128, s)(k<float>, out, in, in_n, total, n);
}}
"""
    result = fastdiv(source)
    assert not result.applies
    assert reason in result.reason, result.reason


def test_an_index_checked_against_a_launch_argument_and_blockidx_need_no_loop(tmp_path):
    source = LAUNCHER + """
__global__ void gather(float* out, const float* in, int n, int cols, int64_t rows_per_cta, int groups) {
  const int idx = blockIdx.x * blockDim.x + threadIdx.x;
  const int64_t group = blockIdx.x % groups;  // blockIdx.x < 2^31 on every launch
  if (idx >= n || cols == 0) return;
  const int row = idx / cols;
  out[idx] = in[row * cols + idx % cols] + group;
  if (threadIdx.x == 0) out[n] = static_cast<float>(blockIdx.x / rows_per_cta);
}
__global__ void inside(float* out, int64_t n, int64_t cols) {
  const int64_t idx = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  const int64_t before = idx / cols;  // before its check: refused, and the kernel keeps its division
  if (idx < n) out[idx] = static_cast<float>(idx % cols + before);
}
void launch(float* out, const float* in, int n, int cols, int groups, cudaStream_t s) {
  LaunchKernel((n + 255) / 256, 256, s)(gather, out, in, n, cols, int64_t{4}, groups);
  LaunchKernel(dim3((n + 255) / 256), dim3(256), s)(inside, out, int64_t{n}, int64_t{cols});
}
"""
    result = fastdiv(source)
    assert result.applies, result.reason
    out = result.source
    assert "gather (4 sites:" in result.reason
    # `before` divides before the check: a thread's linear index is below the launch's thread count, which joins
    assert "inside (2 sites: idx % cols, idx / cols)" in result.reason
    assert ("if (astra_fastdiv_fits(astra_fastdiv_threads(dim3(dim3((n + 255) / 256)), dim3(dim3(256))), (int64_t{cols}), "
            "(int64_t{n}))) {") in out
    assert ("const int64_t group = static_cast<unsigned int>(astra_mod(static_cast<uint32_t>(blockIdx.x), groups_div));"
            in out)  # the remainder's own type: blockIdx.x is unsigned
    assert "const int row = static_cast<int>(astra_div(static_cast<uint32_t>(idx), cols_div));" in out
    assert "static_cast<int64_t>(astra_div(static_cast<uint32_t>(blockIdx.x), rows_per_cta_div))" in out
    assert ("if (astra_fastdiv_fits((groups), (n), astra_fastdiv_threads(dim3((n + 255) / 256), dim3(256)), (cols), "
            "(int64_t{4}))) {") in out
    assert compiles(tmp_path, out) == ""
    before_only = LAUNCHER + """
__global__ void early(float* out, int64_t n, int64_t cols) {
  const int64_t idx = static_cast<int64_t>(blockIdx.x) * blockDim.x * 2 + threadIdx.x;
  const int64_t row = idx / cols;
  if (idx < n) out[idx] = static_cast<float>(row);
}
void launch(float* out, int64_t n, int64_t cols, cudaStream_t s) { LaunchKernel(1, 256, s)(early, out, n, cols); }
"""
    result = fastdiv(before_only)
    assert not result.applies and "`idx / cols`: the dividend `static_cast<int64_t>(blockIdx.x) * blockDim.x * 2 + " \
        "threadIdx.x` is not known to lie in [0, 2^31)" in result.reason


def test_a_loop_that_does_not_start_at_a_thread_s_place_and_a_query_are_refused():
    source = LAUNCHER + """
__global__ void k(float* out, int total, int n, int start) {
  for (int i = start; i < total; ++i) out[i] = i % n;
}
void launch(float* out, int total, int n, cudaStream_t s) {
  LaunchKernel(1, 128, s)(k, out, total, n, 0);
}
"""
    result = fastdiv(source)
    assert not result.applies and "the dividend i is not known to lie in [0, 2^31)" in result.reason
    queried = LAUNCHER + """
__global__ void k(float* out, int total, int n) {
  for (int i = threadIdx.x; i < total; i += blockDim.x) out[i] = i % n;
}
void launch(float* out, int total, int n, cudaStream_t s) {
  cudaFuncSetAttribute(k, cudaFuncAttributeMaxDynamicSharedMemorySize, 0);
  LaunchKernel(1, 128, s)(k, out, total, n);
}
"""
    result = fastdiv(queried)
    assert not result.applies and "queried by cudaFuncSetAttribute" in result.reason
    assert not fastdiv(fastdiv(KERNEL).source).applies  # applied once per file


def test_the_emitted_arithmetic_is_the_division_it_replaces(tmp_path):
    """The helper compiled for this machine's CPU (its host branch is the device's __umulhi) and run on
    divisors across [1, 2^31) and dividends at the edges of [0, 2^31) and at random."""
    from harness import BuildFailure, nvcc_path

    try:
        nvcc = nvcc_path()
    except BuildFailure as err:
        pytest.skip(str(err))
    rng = random.Random(7)
    divisors = sorted({*range(1, 300), *(1 << k for k in range(31)), *((1 << k) - 1 for k in range(2, 32)),
                       *((1 << k) + 1 for k in range(1, 31)), *(rng.randrange(1, 1 << 31) for _ in range(300)),
                       0x7FFFFFFF})
    program = "#include <cstdint>\n" + HELPER + """
#include <cstdio>
int main() {
  static const int64_t divisors[] = {%s};
  uint64_t state = 12345, checked = 0;
  for (int64_t d : divisors) {
    AstraFastDivisor f = astra_fast_divisor(d);
    uint32_t edges[] = {0u, 1u, uint32_t(d - 1), uint32_t(d), uint32_t(d + 1), 0x7ffffffeu, 0x7fffffffu,
                        uint32_t((0x7fffffffu / d) * d), uint32_t((0x7fffffffu / d) * d - 1)};
    for (int k = 0; k < 2000; ++k) {
      uint32_t n;
      if (k < 9) n = edges[k]; else { state = state * 6364136223846793005ull + 1442695040888963407ull; n = uint32_t(state >> 33); }
      if (n > 0x7fffffffu) continue;
      if (astra_div(n, f) != n / uint32_t(d) || astra_mod(n, f) != n %% uint32_t(d)) {
        std::printf("wrong: %%u / %%lld\\n", n, (long long)d);
        return 1;
      }
      ++checked;
    }
  }
  std::printf("ok %%llu\\n", (unsigned long long)checked);
  return 0;
}
""" % ", ".join(str(d) for d in divisors)
    path = tmp_path / "check.cu"
    path.write_text(program)
    build = subprocess.run([nvcc, "-O2", "-o", str(tmp_path / "check"), str(path)], capture_output=True, text=True,
                           timeout=300)
    assert build.returncode == 0, build.stdout + build.stderr
    run = subprocess.run([str(tmp_path / "check")], capture_output=True, text=True, timeout=120)
    assert run.returncode == 0 and run.stdout.startswith("ok "), run.stdout
    assert int(run.stdout.split()[1]) > len(divisors) * 1000
    assert astra_fastdiv_fits_refuses_out_of_range(tmp_path, nvcc)


def astra_fastdiv_fits_refuses_out_of_range(tmp_path, nvcc: str) -> bool:
    program = "#include <cstdint>\n" + HELPER + """
#include <cstdio>
int main() {
  bool fits = astra_fastdiv_fits(int64_t{1}, 0x7fffffff, 5u);
  bool zero = astra_fastdiv_fits(int64_t{0}, 7);
  bool big = astra_fastdiv_fits(int64_t{1} << 31, 7);
  bool negative = astra_fastdiv_fits(int64_t{-3}, 7);
  bool huge = astra_fastdiv_fits(~uint64_t{0});
  std::printf("%d%d%d%d%d\\n", fits, zero, big, negative, huge);
}
"""
    path = tmp_path / "fits.cu"
    path.write_text(program)
    subprocess.run([nvcc, "-O2", "-o", str(tmp_path / "fits"), str(path)], check=True, capture_output=True,
                   timeout=300)
    return subprocess.run([str(tmp_path / "fits")], capture_output=True, text=True).stdout.strip() == "10000"
