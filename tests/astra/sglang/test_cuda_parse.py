"""astra.sglang.cuda_parse: what libclang finds in a CUDA file, and clean errors when a tool is missing."""

from __future__ import annotations

import dataclasses
import json
import textwrap

import pytest

from astra.errors import AstraError, ToolMissing
from astra.sglang import clang_env as clang_env_mod
from astra.sglang.cuda_parse import parse_source, parse_tree_report

DEMO = textwrap.dedent("""\
    #include <cstdint>
    #include <initializer_list>
    #include "local.cuh"

    namespace host {
    struct SymbolicSize {
      SymbolicSize(const char*) {}
      SymbolicSize(int) {}
    };
    struct TensorMatcher {
      TensorMatcher(std::initializer_list<SymbolicSize>) {}
      template <typename T> TensorMatcher& with_dtype() { return *this; }
      TensorMatcher& with_strides(std::initializer_list<int64_t>) { return *this; }
      void verify(const float*) {}
    };
    }  // namespace host

    namespace demo {

    template <typename T, int kVec = 4>
    __global__ void scale_kernel(T* __restrict__ out, const T* in, float alpha, int n) {
      int i = blockIdx.x * blockDim.x + threadIdx.x;
      if (i < n) out[i] = in[i] * alpha * kLocalScale;
    }

    __device__ float helper(float x) { return x; }

    template <typename DType>
    struct ScaleKernel {
      static void run(float* out, const float* in, float alpha, int n) {
        using namespace host;
        auto N = SymbolicSize{"n"};
        TensorMatcher({N, 1})  // out
            .with_strides({1})
            .with_dtype<DType>()
            .verify(out);
        scale_kernel<DType><<<1, 128>>>(out, in, alpha, n);
      }
      void not_static() {}
    };

    void launch_free(float* p, int n) { scale_kernel<float, 8><<<1, 32>>>(p, p, 1.0f, n); }
    void plain_host(int) {}

    #define DEMO_HOST inline
    __global__ void plain_kernel(float* p) { p[0] = 0.0f; }
    DEMO_HOST void launch_plain(float* p) {
      host::TensorMatcher({"m"}).verify(p);
      plain_kernel<<<1, 1>>>(p);
    }

    }  // namespace demo
    """)


def _needs_clang():
    """Skip (not fail) where this machine cannot parse CUDA at all."""
    clang_env_mod.clang_env.cache_clear()
    try:
        clang_env_mod.clang_env()
    except ToolMissing as exc:
        pytest.skip(str(exc))


@pytest.fixture
def demo_file(tmp_path):
    _needs_clang()
    (tmp_path / "local.cuh").write_text("#pragma once\nconstexpr float kLocalScale = 1.0f;\n")
    path = tmp_path / "demo.cuh"
    path.write_text(DEMO)
    return path


def _line(text: str) -> int:
    return DEMO.splitlines().index(text) + 1


def test_demo_kernel(demo_file):
    parsed = parse_source(demo_file, include_dirs=[])
    assert parsed.diagnostics == []
    assert [k.name for k in parsed.kernels] == ["scale_kernel", "plain_kernel"]
    kernel = parsed.kernels[0]
    assert kernel.qualified_name == "demo::scale_kernel"
    assert [dataclasses.astuple(t) for t in kernel.template_params] == [
        ("T", "type", None, None), ("kVec", "non-type", "int", "4")]
    assert [(p.name, p.type) for p in kernel.params] == [
        ("out", "T *__restrict"), ("in", "const T *"), ("alpha", "float"), ("n", "int")]
    assert kernel.start_line == _line("template <typename T, int kVec = 4>")
    assert kernel.end_line == _line("  if (i < n) out[i] = in[i] * alpha * kLocalScale;") + 1
    plain = parsed.kernels[1]
    assert (plain.qualified_name, plain.template_params, plain.start_line, plain.end_line) == (
        "demo::plain_kernel", [], _line("__global__ void plain_kernel(float* p) { p[0] = 0.0f; }"),
        _line("__global__ void plain_kernel(float* p) { p[0] = 0.0f; }"))


def test_demo_host_entries(demo_file):
    parsed = parse_source(demo_file, include_dirs=[])
    entries = {e.qualified_name: e for e in parsed.host_entries}
    assert set(entries) == {"demo::ScaleKernel::run", "demo::launch_free", "demo::launch_plain"}
    assert entries["demo::launch_plain"].launches == ["plain_kernel"]
    run = entries["demo::ScaleKernel::run"]
    assert run.class_name == "ScaleKernel"
    assert [(t.name, t.kind) for t in run.class_template_params] == [("DType", "type")]
    assert [(p.name, p.type) for p in run.params] == [
        ("out", "float *"), ("in", "const float *"), ("alpha", "float"), ("n", "int")]
    assert run.launches == ["scale_kernel"]
    assert run.start_line == _line("  static void run(float* out, const float* in, float alpha, int n) {")
    assert run.end_line == _line("  void not_static() {}") - 1
    free = entries["demo::launch_free"]
    line = _line("void launch_free(float* p, int n) { scale_kernel<float, 8><<<1, 32>>>(p, p, 1.0f, n); }")
    assert (free.class_name, free.launches) == (None, ["scale_kernel"])
    assert (free.start_line, free.end_line) == (line, line)


def test_demo_tensor_constraints_and_includes(demo_file):
    parsed = parse_source(demo_file, include_dirs=[])
    assert len(parsed.tensor_constraints) == 2
    tc = parsed.tensor_constraints[0]
    assert tc.function == "demo::ScaleKernel::run"
    assert tc.line == _line("    TensorMatcher({N, 1})  // out")
    assert tc.dims == ["N", "1"]
    assert [(c.name, c.template_args, c.args) for c in tc.calls] == [
        ("with_strides", None, "{1}"), ("with_dtype", "DType", ""), ("verify", None, "out")]
    assert tc.verify == "out"
    assert tc.text == "TensorMatcher({N, 1}).with_strides({1}).with_dtype<DType>().verify(out)"
    plain = parsed.tensor_constraints[1]  # in a function whose extent starts with a macro
    assert (plain.function, plain.dims, plain.verify) == ("demo::launch_plain", ['"m"'], "p")
    assert parsed.includes == [str((demo_file.parent / "local.cuh").resolve())]
    json.dumps(dataclasses.asdict(parsed))  # the whole result is plain data


def test_errors_are_reported_with_file_and_line(tmp_path):
    _needs_clang()
    path = tmp_path / "broken.cu"
    path.write_text("__global__ void k(int* p) {\n  p[0] = undeclared_thing;\n}\n")
    parsed = parse_source(path, include_dirs=[])
    assert parsed.diagnostics == [f"{path.resolve()}:2: use of undeclared identifier 'undeclared_thing'"]
    assert [k.name for k in parsed.kernels] == ["k"]


def test_errors_nvcc_accepts_are_kept_apart(tmp_path):
    _needs_clang()
    path = tmp_path / "dialect.cu"
    path.write_text(textwrap.dedent("""\
        __device__ constexpr int ceil_div(int a, int b) { return (a + b - 1) / b; }
        __device__ int lane() { int id; asm("mov.u32 %0, %laneid;" : "=r"(id)); return id; }
        int blocks(int n) { return ceil_div(n, 128); }
        """))
    parsed = parse_source(path, include_dirs=[])
    assert parsed.diagnostics == []
    assert parsed.clang_only_errors == [
        f"{path.resolve()}:2: invalid % escape in inline assembly string",
        f"{path.resolve()}:3: no matching function for call to 'ceil_div'"]


def test_missing_file_is_an_astra_error(tmp_path):
    with pytest.raises(AstraError, match="no such CUDA source file"):
        parse_source(tmp_path / "nope.cuh", include_dirs=[])


def test_missing_resource_dir_is_actionable(tmp_path, monkeypatch):
    source = tmp_path / "k.cu"
    source.write_text("__global__ void k() {}\n")
    empty = tmp_path / "empty"
    empty.mkdir()
    monkeypatch.setenv(clang_env_mod.RESOURCE_ENV, str(empty))
    clang_env_mod.clang_env.cache_clear()
    try:
        with pytest.raises(ToolMissing) as info:
            parse_source(source, include_dirs=[])
    finally:
        clang_env_mod.clang_env.cache_clear()
    message = str(info.value)
    assert str(empty) in message
    assert "pip install 'libclang-ng>=22.1'" in message and "ASTRA_CLANG_RESOURCE_DIR" in message
    assert info.value.exit_code == ToolMissing.exit_code


@pytest.fixture(scope="module")
def sglang_0_5_23():
    from astra.sglang.tree import from_wheel

    return from_wheel("0.5.23")


@pytest.mark.network
def test_sglang_fused_add_rmsnorm(sglang_0_5_23):
    _needs_clang()
    tree = sglang_0_5_23
    parsed = parse_source(tree.csrc_dir / "elementwise" / "fused_add_rmsnorm.cuh", [str(tree.include_dir)])
    assert parsed.diagnostics == []
    assert [k.qualified_name for k in parsed.kernels] == ["sglang::fused_add_rmsnorm_reg_kernel"]
    kernel = parsed.kernels[0]
    assert [(t.name, t.kind, t.type) for t in kernel.template_params] == [
        ("kCastXBeforeOutMul", "non-type", "bool"), ("T", "type", None),
        ("VEC_SIZE_IN_BYTE", "non-type", "int")]
    assert [p.name for p in kernel.params] == ["input", "residual", "weight", "vec_hidden_size", "eps"]
    run = next(e for e in parsed.host_entries if e.qualified_name == "sglang::FusedAddRMSNormKernel::run")
    assert run.class_name == "FusedAddRMSNormKernel"
    assert [t.name for t in run.class_template_params] == ["kCastXBeforeOutMul", "DType"]
    assert [(p.name, p.type) for p in run.params] == [
        ("input", "const tvm::ffi::TensorView"), ("residual", "const tvm::ffi::TensorView"),
        ("weight", "const tvm::ffi::TensorView"), ("eps", "float")]
    assert run.launches == ["fused_add_rmsnorm_reg_kernel"]
    assert [(t.dims, t.verify) for t in parsed.tensor_constraints] == [
        (["N", "D"], "input"), (["D"], "weight"), (["N", "D"], "residual")]
    assert str((tree.include_dir / "sgl_kernel" / "tensor.h").resolve()) in parsed.includes  # libclang: real paths
    assert not any("/cuda" in inc or "tvm/ffi" in inc for inc in parsed.includes)


@pytest.mark.network
def test_sglang_tree_report_subset(sglang_0_5_23):
    _needs_clang()
    files = ["elementwise/rmsnorm.cuh", "elementwise/add_constant.cuh"]
    results = parse_tree_report(sglang_0_5_23, files=files, workers=1)
    assert [(r.path, r.ok, r.first_error) for r in results] == [
        ("elementwise/rmsnorm.cuh", True, None), ("elementwise/add_constant.cuh", True, None)]
    assert all(r.n_kernels >= 1 for r in results)
