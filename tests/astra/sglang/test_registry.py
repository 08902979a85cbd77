"""The module registry on real SGLang wheels (downloaded once with pip, cached in the test home)."""

import pytest

from astra.sglang import registry
from astra.sglang.registry import _preprocessor_blocks_sm90

pytestmark = pytest.mark.network


def test_0523_lists_at_least_150_modules(sglang_0523):
    mods = registry.modules(sglang_0523)
    assert sglang_0523.layout == "kernels/jit"
    assert len(mods) >= 150
    names = {m.name for m in mods}
    assert {"fused_add_rmsnorm", "rmsnorm", "qknorm", "activation", "kvcache", "per_token_group_quant"} <= names
    buildable = [m for m in mods if m.sm90a == "yes"]
    assert len(buildable) >= 150


def test_0510_old_layout(sglang_0510):
    mods = {m.name: m for m in registry.modules(sglang_0510)}
    assert sglang_0510.layout == "jit_kernel"
    assert len(mods) >= 30
    assert mods["fused_add_rmsnorm"].sources == ["elementwise/fused_add_rmsnorm.cuh"]


def test_other_targets_are_not_sm90a(sglang_0523):
    mods = {m.name: m for m in registry.modules(sglang_0523)}
    assert mods["dsa_gfx950_topk"].sm90a == "no"
    assert mods["vsa_block_sparse_sm100"].sm90a == "no"
    assert mods["convrot_int8"].sm90a == "needs-dep"


def test_unknown_module_suggests_names(sglang_0523):
    from astra.errors import UnknownKernel

    with pytest.raises(UnknownKernel, match="did you mean"):
        registry.find(sglang_0523, "rmsnorm_typo_fused_add_rmsnorm")


def test_a_drafts_folder_name_finds_its_module(sglang_0523):
    """`astra extract small_gemm_bf16__trait_` (the folder `astra extract` wrote) finds small_gemm_bf16_{trait}."""
    assert registry.find(sglang_0523, "small_gemm_bf16__trait_").name == "small_gemm_bf16_{trait}"


@pytest.mark.parametrize("text,blocked", [
    ("#ifndef USE_ROCM\n#error \"rocm only\"\n#endif\n", True),
    ("#if SGL_CUDA_ARCH < 1000\n#error \"needs sm100\"\n#endif\n", True),
    ("#if SGL_CUDA_ARCH >= 900\n#else\n#error \"old\"\n#endif\n", False),
    ("#if !defined(SGL_CUDA_ARCH)\n#error \"no arch\"\n#endif\n", False),
    ("#if SGL_CUDA_ARCH != 900 && SGL_CUDA_ARCH != 1000\n#error \"x\"\n#endif\n", False),
])
def test_preprocessor_judgement(text, blocked):
    assert (_preprocessor_blocks_sm90(text) is not None) == blocked
