"""Discovery of load_jit call sites: on loaders written here, and on real SGLang wheels."""

import textwrap

import pytest

from astra.sglang.discovery import scan_file

LOADER = textwrap.dedent('''
    from sglang.kernels.jit.utils import cache_once, load_jit, make_cpp_args
    from sglang.srt.utils.custom_op import register_custom_op

    FLAGS = ["--use_fast_math"]

    @cache_once
    def _jit_scale_module(dtype, fast: bool = True, width: int = 256):
        args = make_cpp_args(width, is_arch_support_pdl(), dtype)
        return load_jit(
            "scale" if fast else "scale_exact",
            *args,
            cuda_files=["elementwise/scale.cuh"],
            extra_cuda_cflags=FLAGS if fast else [],
            cuda_wrappers=[("scale", f"ScaleKernel<{args}>::run"), ("scale_inplace", f"ScaleKernel<{args}>::run_inplace")],
        )

    @register_custom_op(mutates_args=["out"])
    def scale(x, out, alpha: float = 1.0) -> None:
        _jit_scale_module(x.dtype).scale(x, out, alpha)

    def _other():
        if is_hip_runtime():
            return load_jit("hip_only", cpp_files=["x.cpp"], cpp_wrappers=[("f", "f")], header_only=False)
''')


@pytest.fixture
def loader_file(tmp_path):
    path = tmp_path / "sglang" / "kernels" / "ops" / "demo" / "scale.py"
    path.parent.mkdir(parents=True)
    path.write_text(LOADER)
    return path, tmp_path


def test_module_names_follow_the_if_expression_and_pair_with_flags(loader_file):
    path, root = loader_file
    sites = {s.module_name: s for s in scan_file(path, root)}
    assert set(sites) == {"scale", "scale_exact", "hip_only"}
    assert sites["scale"].extra_cuda_cflags == ["--use_fast_math"]
    assert sites["scale_exact"].extra_cuda_cflags == []


def test_wrappers_keep_template_arguments_symbolic(loader_file):
    path, root = loader_file
    site = next(s for s in scan_file(path, root) if s.module_name == "scale")
    assert [(w.export, w.entry, w.lang) for w in site.wrappers] == [
        ("scale", "ScaleKernel<{args}>::run", "cuda"),
        ("scale_inplace", "ScaleKernel<{args}>::run_inplace", "cuda"),
    ]
    assert site.template_args == {"args": ["width", "is_arch_support_pdl()", "dtype"]}
    assert site.cuda_files == ["elementwise/scale.cuh"]
    assert site.loader == "_jit_scale_module"
    assert site.loader_defaults == {"fast": "True", "width": "256"}
    assert site.file == "sglang/kernels/ops/demo/scale.py"


def test_callers_and_mutated_arguments(loader_file):
    path, root = loader_file
    site = next(s for s in scan_file(path, root) if s.module_name == "scale")
    assert [(c.name, c.mutates_args, c.params, c.defaults) for c in site.callers] == [("scale", ["out"], ["x", "out", "alpha"], {"alpha": "1.0"})]


def test_guards_and_header_only(loader_file):
    path, root = loader_file
    site = next(s for s in scan_file(path, root) if s.module_name == "hip_only")
    assert site.guards == ["is_hip_runtime()"]
    assert site.header_only is False
    assert [(w.export, w.lang) for w in site.wrappers] == [("f", "cpp")]


@pytest.fixture(scope="module")
def sites_0523(sglang_0523):
    """The call sites of SGLang 0.5.23 (a scan of the whole tree, seconds), scanned once for this file's tests."""
    from astra.sglang.discovery import scan_tree

    return scan_tree(sglang_0523)


@pytest.mark.network
def test_real_fused_add_rmsnorm_call_site(sites_0523):
    site = next(s for s in sites_0523 if s.module_name == "fused_add_rmsnorm")
    assert site.cuda_files == ["elementwise/fused_add_rmsnorm.cuh"]
    assert site.wrappers[0].export == "fused_add_rmsnorm"
    assert site.wrappers[0].entry == "FusedAddRMSNormKernel<{args}>::run"
    assert site.template_args["args"] == ["cast_x_before_out_mul", "dtype"]


@pytest.mark.network
def test_real_flags_from_helper_functions(sites_0523):
    sites = {s.module_name: s for s in sites_0523}
    assert sites["activation"].extra_cuda_cflags == ["--use_fast_math"]
    assert sites["rounded_activation"].extra_cuda_cflags == []
    kv = sites["kvcache"]
    assert kv.callers and any(c.mutates_args == ["k_cache", "v_cache"] for c in kv.callers)
