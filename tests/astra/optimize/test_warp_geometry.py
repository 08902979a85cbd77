"""A CTA's warp count written as linked literals (astra.optimize.warp_geometry), and the thread floor of
`std::max(n, 128)`: found in kernels written here and in SGLang 0.5.23's own, moved together, and
the moved text still compiles for Hopper."""

from __future__ import annotations

import subprocess

from astra.optimize import param_space, warp_geometry
from harness.building.toolchain import nvcc_path
from tests.toolchain import needs_nvcc

ROWS = """
#include <cuda_runtime.h>
#include <cstdint>
namespace {
constexpr int kWarpThreads = 32;

// one warp per head, four warps per CTA
__global__ __launch_bounds__(128) void heads_kernel(const float* x, float* y, int heads) {
  const int warp = threadIdx.x / kWarpThreads, lane = threadIdx.x % kWarpThreads;
  __shared__ float rows[4][32];
  for (int h = warp; h < heads; h += 4) {
    rows[warp][lane] = x[(blockIdx.x * heads + h) * 32 + lane];
    __syncwarp();
    y[(blockIdx.x * heads + h) * 32 + lane] = rows[warp][31 - lane] * 2.0f;
  }
}

// one warp per row: the grid divides the rows by the warp count
__global__
__launch_bounds__(256) void rows_kernel(const float* x, float* y, int n) {
  const int warp = threadIdx.x / kWarpThreads;
  const int row = blockIdx.x * 8 + warp;
  __shared__ float slot[8];
  if (row < n && threadIdx.x % kWarpThreads == 0) { slot[warp] = x[row]; y[row] = slot[warp]; }
}

// launched with a block size computed at run time: not a geometry to move
__global__ __launch_bounds__(128) void dynamic_kernel(float* y) {
  __shared__ float s[4];
  s[threadIdx.x / 32] = 0.f;
  y[threadIdx.x] = s[0];
}
}  // namespace

void run(const float* x, float* y, int tokens, int heads, int n, int threads) {
  heads_kernel<<<tokens, 128>>>(x, y, heads);
  rows_kernel<<<(n + 7) / 8, 256>>>(x, y, n);  // not div_ceil: the grid's literal is not recognized
  dynamic_kernel<<<1, threads>>>(y);
}
"""


def test_linked_literals_move_together_and_nothing_else():
    found = {g.kernel: g for g in warp_geometry.find(ROWS)}
    assert set(found) == {"heads_kernel"}  # rows_kernel's grid and dynamic_kernel's block are not literal
    geometry = found["heads_kernel"]
    assert geometry.threads == 128 and geometry.choices() == (64, 256, 512)
    params = param_space.find_params(ROWS)
    warps = next(p for p in params if p.kind == "warps")
    # the linked literals are not offered alone
    assert not [p for p in params if p.kind in ("bounds", "launch") and p.start in {s for s, _, _ in warps.links}]
    text = param_space.render(ROWS, params, {warps.name: 256})
    assert "__launch_bounds__(256) void heads_kernel" in text and "rows[8][32]" in text and "h += 8)" in text
    assert "heads_kernel<<<tokens, 256>>>" in text
    assert text.count("256") == ROWS.count("256") + 2  # bounds and launch; the rows kernel untouched
    assert "8 warps" in param_space.describe(params, {warps.name: 256})


def test_a_row_per_warp_kernel_moves_its_grid_with_its_warp_count():
    text = ROWS.replace("rows_kernel<<<(n + 7) / 8, 256>>>", "rows_kernel<<<div_ceil(n, 8), 256>>>")
    found = {g.kernel: g for g in warp_geometry.find(text)}
    assert set(found) == {"heads_kernel", "rows_kernel"}
    params = param_space.find_params(text)
    warps = next(p for p in params if p.kind == "warps" and p.value == 256)
    moved = param_space.render(text, params, {warps.name: 512})
    assert "blockIdx.x * 16 +" in moved and "slot[16]" in moved and "rows_kernel<<<div_ceil(n, 16), 512>>>" in moved
    assert "__launch_bounds__(512) void rows_kernel" in moved


def test_what_only_looks_like_a_warp_count_is_not_linked():
    """A comment or a ternary that names another kernel, a loop that starts at `warp * 4` (a stride of its
    own), a shared buffer not indexed by the warp, a nested div_ceil: each is left alone, or the kernel is."""
    fixed = ROWS.replace("rows_kernel<<<(n + 7) / 8, 256>>>", "rows_kernel<<<div_ceil(n, 8), 256>>>")
    commented = fixed.replace("  heads_kernel<<<tokens, 128>>>", "  // heads_kernel must run before rows_kernel\n  heads_kernel<<<tokens, 128>>>")
    assert {g.kernel for g in warp_geometry.find(commented)} == {"heads_kernel", "rows_kernel"}
    assert next(g for g in warp_geometry.find(commented) if g.kernel == "rows_kernel").links[0][0] > commented.index("rows_kernel<<<")
    either = fixed.replace("heads_kernel<<<tokens, 128>>>(x, y, heads);", "LaunchKernel(tokens, 128)(heads > 8 ? heads_kernel : dynamic_kernel, x, y, heads);")
    assert "heads_kernel" not in {g.kernel for g in warp_geometry.find(either)}
    strided = ROWS.replace("for (int h = warp; h < heads; h += 4)", "for (int h = warp * 4; h < heads; h += 4)")
    params = param_space.find_params(strided)
    heads = next(p for p in params if p.kind == "warps" and "heads_kernel" in p.note)
    moved = param_space.render(strided, params, {heads.name: 256})
    assert "rows[8][32]" in moved and "h = warp * 4; h < heads; h += 4)" in moved  # the loop's own stride kept
    buffered = ROWS.replace("__shared__ float rows[4][32];", "__shared__ float rows[4][32];\n  __shared__ float stage[4];")
    heads = next(g for g in warp_geometry.find(buffered) if g.kernel == "heads_kernel")
    assert buffered.index("stage[4]") + 6 not in {a for a, _, _ in heads.links}  # never indexed by the warp
    nested = fixed.replace("div_ceil(n, 8)", "div_ceil(div_ceil(n, 8), 8)")
    rows = next(g for g in warp_geometry.find(nested) if g.kernel == "rows_kernel")
    grid = [a for a, _, d in rows.links if a > nested.index("rows_kernel<<<") and d == 32]
    assert grid == [nested.index("), 8), 256>>>") + 3]  # the outer div_ceil's divisor, not the inner one's


def test_a_floor_is_a_thread_count_only():
    text = """void launch(int n) {
  const int num_thread = std::max(n, 128);
  const int smem_per_block = std::max(n * 4, 256);
}"""
    floors = [p for p in param_space.find_params(text) if p.kind == "floor"]
    assert [text[p.start:p.end] for p in floors] == ["128"]


def test_overloaded_kernels_are_left_alone():
    twice = ROWS + ROWS.replace("void run(", "void run2(").replace("const float* x, float* y, int heads)",
                                                                    "const double* x, float* y, int heads)")
    assert "heads_kernel" not in {g.kernel for g in warp_geometry.find(twice)}


def test_sglang_qsa_indexer_and_lora_align(sglang_0523):
    """qsa_indexer's per-token CTA of 4 warps (bounds, launch, per-warp smem rows, the head stride) and its
    compress kernel's row-per-warp grid; moe_lora_align's `std::max(num_experts, 128)` thread floor."""
    qsa = (sglang_0523.csrc_dir / "attention/qsa_indexer.cuh").read_text()
    found = {g.kernel: g for g in warp_geometry.find(qsa)}
    assert set(found) == {"qsa_index_q_prep_kernel", "qsa_index_k_compress_kernel"}
    assert len(found["qsa_index_q_prep_kernel"].links) == 3 and len(found["qsa_index_k_compress_kernel"].links) == 4
    params = param_space.find_params(qsa)
    prep = next(p for p in params if p.kind == "warps" and "q_prep" in p.note)
    moved = param_space.render(qsa, params, {prep.name: 512})
    assert "smem_rows[16][kHeadDim]" in moved and "h += 16)" in moved
    assert "LaunchKernel(static_cast<uint32_t>(num_tokens), 512," in moved
    align = (sglang_0523.csrc_dir / "lora/moe_lora_align_kernel.cu").read_text()
    floor = [p for p in param_space.find_params(align) if p.kind == "floor"]
    assert len(floor) == 1 and floor[0].value == 128 and floor[0].choices == (32, 64, 256, 512)
    assert "std::max((int32_t)num_experts, 32)" in param_space.render(align, [floor[0]], {floor[0].name: 32})


@needs_nvcc
def test_a_warp_count_move_on_a_real_kernel_still_compiles(sglang_0523, tmp_path):
    qsa = (sglang_0523.csrc_dir / "attention/qsa_indexer.cuh").read_text()
    params = param_space.find_params(qsa)
    moves = {p.name: max(p.choices) for p in params if p.kind == "warps"}
    source = tmp_path / "qsa_indexer.cu"
    instantiate = "".join(f"\nstatic auto* use_{i} = &sglang::{entry}<sglang::bf16_t, sglang::fp8_e4m3_t, 128, false, true>;"
                          for i, entry in enumerate(("qsa_index_q_prep", "qsa_index_k_compress")))
    source.write_text(param_space.render(qsa, params, moves) + instantiate)  # the templates, built for real
    from harness.building.toolchain import arch_flags, tvm_ffi_paths
    includes = [f"-I{sglang_0523.include_dir}", f"-I{sglang_0523.csrc_dir / 'attention'}",
                *(f"-I{d}" for d in tvm_ffi_paths()[0])]
    done = subprocess.run([nvcc_path(), *arch_flags("90a"), "-std=c++20", "--expt-relaxed-constexpr", *includes,
                           "--cubin", str(source), "-o", str(tmp_path / "k.cubin")],
                          capture_output=True, text=True, timeout=400)
    assert done.returncode == 0, done.stderr[-1500:]
    cubin = (tmp_path / "k.cubin").read_bytes()
    assert b"qsa_index_q_prep_kernel" in cubin and b"qsa_index_k_compress_kernel" in cubin  # built for real
