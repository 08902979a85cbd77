"""Launch-geometry template arguments passed by the spec's wrapper entry (astra.optimize.entry_templates)
as `tmpl` parameters of the offline search (astra.optimize.param_space), on host entries written here."""

from __future__ import annotations

import shutil
import subprocess

import pytest

from astra.optimize import param_space

# A host entry whose block size only the caller writes (`my_launch<{max_n}, 256>`); the launcher is a
# stand-in written here so the file builds on its own.
FUNCTION = r"""#include <cuda_runtime.h>

struct LaunchKernel {
  dim3 grid, block;
  cudaStream_t stream;
  LaunchKernel(dim3 g, dim3 b, cudaStream_t s) : grid(g), block(b), stream(s) {}
  template <typename F, typename... Args>
  void operator()(F kernel, Args... args) const { kernel<<<grid, block, 0, stream>>>(args...); }
};

template <int MAX_N>
__global__ void clamp_rows(const float* in, float* out, int n) {
  const int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) out[i] = fminf(in[i], static_cast<float>(MAX_N));
}

template <int MAX_N, int BLOCK_DIM>
void my_launch(const float* in, float* out, int n, cudaStream_t stream) {  // host entry
  const dim3 grid((n + BLOCK_DIM - 1) / BLOCK_DIM);
  LaunchKernel(grid, BLOCK_DIM, stream)(clamp_rows<MAX_N>, in, out, n);
}

template void my_launch<64, 256>(const float*, float*, int, cudaStream_t);
"""

STRUCT = r"""template <int Threads>
struct MyKernel {
  static void run(const float* in, float* out, int n) {
    for (int i = 0; i < n; i += Threads) out[i] = in[i];
  }
};
"""

NOT_TUNABLE = r"""template <int kTopK, bool kPdl>
struct K {
  static void run(const int* ids, int* out) {
    out[0] = kPdl ? ids[kTopK - 1] : ids[0];
  }
};
"""


def _tmpl(text: str, entries) -> list[param_space.Param]:
    return [p for p in param_space.find_params(text, entries) if p.kind == "tmpl"]


def test_the_block_size_of_a_function_template_entry_is_a_param():
    params = _tmpl(FUNCTION, ["my_launch<{max_n}, 256>"])
    assert [(p.name, p.value, p.choices) for p in params] == [("BLOCK_DIM", 256, (64, 128, 512, 1024))]
    assert "function my_launch" in params[0].note


def test_render_sets_the_block_size_in_the_body():
    params = param_space.find_params(FUNCTION, ["my_launch<{max_n}, 256>"])
    text = param_space.render(FUNCTION, params, {"BLOCK_DIM": 64})
    lines = text.splitlines()
    head = lines.index("template <int MAX_N, int /*BLOCK_DIM: set in the body*/>")
    assert "BLOCK_DIM" not in lines[head].replace("/*BLOCK_DIM: set in the body*/", "")  # the list no longer names it
    brace = lines[head + 1]
    assert brace == "void my_launch(const float* in, float* out, int n, cudaStream_t stream) {  // host entry"
    assert lines[head + 2].strip().startswith("constexpr int BLOCK_DIM = 64;")  # the body's first statement
    assert "  LaunchKernel(grid, BLOCK_DIM, stream)(clamp_rows<MAX_N>, in, out, n);" in lines
    # everything else is as it was
    restored = "\n".join(lines[:head + 2] + lines[head + 3:]) + "\n"
    assert restored.replace("/*BLOCK_DIM: set in the body*/", "BLOCK_DIM") == FUNCTION


def test_describe_says_where_the_value_came_from():
    params = param_space.find_params(FUNCTION, ["my_launch<{max_n}, 256>"])
    assert param_space.describe(params, {"BLOCK_DIM": 64}) == (
        "BLOCK_DIM 256 -> 64 (the template argument of function my_launch, set in the file)")


def test_a_struct_template_entry_gets_a_static_member():
    params = param_space.find_params(STRUCT, ["MyKernel<128>::run"])
    tmpl = [p for p in params if p.kind == "tmpl"]
    assert [(p.name, p.value, p.choices) for p in tmpl] == [("Threads", 128, (32, 64, 256, 512))]
    text = param_space.render(STRUCT, params, {"Threads": 32})
    lines = text.splitlines()
    assert lines[0] == "template <int /*Threads: set in the body*/>"
    assert lines[1] == "struct MyKernel {"
    assert lines[2].strip().startswith("static constexpr int Threads = 32;")
    assert lines[3:] == STRUCT.splitlines()[2:]
    assert param_space.describe(params, {"Threads": 32}) == (
        "Threads 128 -> 32 (the template argument of struct MyKernel, set in the file)")


def test_a_template_parameter_with_a_non_tunable_name_is_no_param():
    assert _tmpl(NOT_TUNABLE, ["K<512, true>::run"]) == []


@pytest.mark.parametrize("entry", ["my_launch<{max_n}, {block_dim}>", "my_launch<128, {block_dim}>"])
def test_a_placeholder_argument_is_no_param(entry):
    assert _tmpl(FUNCTION, [entry]) == []  # and MAX_N (a maximum) is not tunable even when it is a literal


@pytest.mark.parametrize("entry", ["other_launch<{max_n}, 256>", "Missing<128>::run"])
def test_an_entry_whose_template_is_not_defined_here_is_no_param(entry):
    assert _tmpl(FUNCTION, [entry]) == []


def test_a_wrong_argument_count_is_no_param():
    assert _tmpl(FUNCTION, ["my_launch<256>"]) == []


def test_without_entries_nothing_changes():
    for text in (FUNCTION, STRUCT):
        assert _tmpl(text, []) == [] and _tmpl(text, ()) == []
        assert param_space.find_params(text) == param_space.find_params(text, [])


@pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc not found")
def test_the_rendered_function_template_compiles(tmp_path):
    params = param_space.find_params(FUNCTION, ["my_launch<{max_n}, 256>"])
    source = tmp_path / "entry.cu"
    source.write_text(param_space.render(FUNCTION, params, {"BLOCK_DIM": 64}))
    done = subprocess.run(["nvcc", "-std=c++17", "-c", "-x", "cu", str(source), "-o", str(tmp_path / "entry.o")],
                          capture_output=True, text=True, timeout=240)
    assert done.returncode == 0, done.stderr[-2000:]
