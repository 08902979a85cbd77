"""Spec drafts inferred from real SGLang sources (0.5.23 and 0.5.10, downloaded at test time):
the C++ checks (libclang), the call site's template arguments and the model configurations."""

from __future__ import annotations

import pytest

from astra.sglang import cxx_facts, registry, variants
from astra.spec import draft, infer, meanings
from astra.spec.extract import extract
from astra.spec.model import load

pytest.importorskip("clang.cindex")


def _facts(tree, name: str, export_index: int = 0) -> cxx_facts.EntryFacts:
    module = registry.find(tree, name)
    return draft.module_facts(tree, module)[export_index][1]


def _args(spec: dict) -> dict:
    return {a["name"]: a for a in spec["arguments"]}


def test_free_function_template_checks_are_read(sglang_0523):
    """moe_topk_softmax's checks sit in a free function template (`topk_softmax<T>`), not a class."""
    facts = _facts(sglang_0523, "moe_topk_softmax")
    assert facts.found and facts.qualified_name == "sglang::topk_softmax"
    assert facts.tensors["gating_output"].shapes == [["N", "E"]]
    assert facts.tensors["topk_indices"].dtypes == ["int32_t"]
    assert facts.sizes["E"].label == "num_experts"
    spec, _ = draft.draft_module(sglang_0523, registry.find(sglang_0523, "moe_topk_softmax"))
    args = _args(spec)
    assert args["gating_output"]["shape"] == ["num_tokens", "num_experts"]
    assert args["topk_indices"]["dtype"] == "int32" and args["topk_weights"]["dtype"] == "float32"
    assert spec["shapes"]["token_dim"] == "num_tokens"
    # dims by meaning: the MoE models give experts and top-k from their configurations
    models = {m["model"]: m["dims"] for m in spec["shapes"]["models"]}
    assert models["DeepSeek-V3"]["num_experts"] == "num_experts"
    assert models["DeepSeek-V3"]["topk"] == "num_experts_per_tok"
    assert args["correction_bias"]["present"] is False  # Optional<TensorView> without a check: None


def test_set_value_dims_and_file_constants_become_derived(sglang_0523):
    """concat_mla_k fixes every dim but the token count with `X.set_value(CONSTANT)` just before
    its TensorMatcher checks; the constants are file-level constexprs (K = NOPE + ROPE)."""
    spec, _ = draft.draft_module(sglang_0523, registry.find(sglang_0523, "concat_mla_k"))
    assert list(spec["dims"]) == ["num_tokens"]
    assert spec["derived"] == {"num_heads": "128", "k_head_dim": "192", "nope_head_dim": "128",
                               "rope_head_dim": "64"}
    assert _args(spec)["k_rope"]["shape"] == ["num_tokens", "1", "rope_head_dim"]


def test_int64_pointer_casts_give_index_dtypes(sglang_0523):
    """rotary_embedding checks with RuntimeCheck, not TensorMatcher: its positions are known to be
    int64 only from `static_cast<const int64_t*>(positions.data_ptr())`."""
    facts = _facts(sglang_0523, "rotary_embedding")
    assert facts.tensors["positions"].elem_types == ["int64_t"]
    assert facts.tensors["positions"].const_cast
    assert facts.tensors["key"].optional
    assert dict(facts.scalars) == {"head_size": "int64_t", "is_neox": "bool"}


def test_typed_pointer_helpers_give_dtypes_and_writes(sglang_0523):
    """fused_metadata_copy reads its tensors through `unwrap_data_ptr<int32_t>(x, "x")` (a dtype check of
    its own) and writes through `unwrap_data_ptr_mut<int32_t>(...)`: int32, read or written."""
    facts = _facts(sglang_0523, "fused_metadata_copy")
    assert facts.tensors["cache_seqlens_src"].elem_types[0] == "int32_t" and facts.tensors["cache_seqlens_src"].const_cast
    assert facts.tensors["cache_seqlens_dst"].elem_types[0] == "int32_t" and facts.tensors["cache_seqlens_dst"].mutable_cast
    spec, _ = draft.draft_module(sglang_0523, registry.find(sglang_0523, "fused_metadata_copy"))
    assert _args(spec)["cache_seqlens_src"]["dtype"] == "int32" and _args(spec)["cache_seqlens_dst"]["role"] == "out"


def test_optional_tensors_are_passed_as_the_presence_checks_allow(sglang_0523):
    """dsa/kpool_topk_transform.cuh: `!(page_table_opt.has_value() && topk_indices_offset_opt.has_value())`
    and `!page_table_row_index_opt.has_value() || page_table_opt.has_value()`. Every optional tensor
    passed broke the first on every case; the draft keeps the most tensors that satisfy both."""
    spec, notes = draft.draft_module(sglang_0523, registry.find(sglang_0523, "kpool_topk_transform_{group_topk}"))
    present = {a["name"]: a["present"] for a in spec["arguments"] if "present" in a}
    assert present["page_table_opt"] and present["page_table_row_index_opt"]
    assert present["topk_indices_offset_opt"] is False
    assert any("`topk_indices_offset_opt`: drafted as None" in n for n in notes)
    assert not any(n.startswith("tensor `topk_indices_offset_opt` is optional") for n in notes)


def test_type_aliases_of_the_file_name_dtypes(sglang_0523):
    """deepseek_v4/c_plan.cuh checks `with_dtype<RID_T>()` after `using RID_T = int64_t;`: int64, where
    the draft had the activation dtype."""
    from astra.spec.argument_kinds import type_aliases

    assert type_aliases("using A = int64_t;\n  typedef std::int32_t B;\nusing C = Foo<int>;\nusing int32_t = int;") == {
        "A": "int64_t", "B": "int32_t"}
    spec, _ = draft.draft_module(sglang_0523, registry.find(sglang_0523, "compress_plan"))
    dtypes = {a["name"]: a["dtype"] for a in spec["arguments"] if a["kind"] == "tensor"}
    assert dtypes["req_pool_indices"] == "int64" and dtypes["seq_lens"] == "int64" and dtypes["pin_buffer"] == "uint8"


def test_written_tensors_from_non_const_casts(sglang_0523):
    facts = _facts(sglang_0523, "clamp_position")
    assert facts.tensors["dst"].mutable_cast and not facts.tensors["dst"].const_cast
    assert facts.tensors["seq_lens"].const_cast and not facts.tensors["seq_lens"].mutable_cast
    spec, _ = draft.draft_module(sglang_0523, registry.find(sglang_0523, "clamp_position"))
    assert _args(spec)["dst"]["role"] == "out" and _args(spec)["seq_lens"]["role"] == "in"


def test_wrapper_template_arguments_become_dims(sglang_0523):
    """rmsnorm_hf: `make_cpp_args(hidden_size, is_arch_support_pdl(), dtype)` feeds
    `HFRMSNorm*Kernel<kDim, kUsePDL, DType>`, whose class the Python picks at run time; kDim fixes
    the checks' D with set_value, so the hidden size is a spec dim and the entry a template over it."""
    spec, _ = draft.draft_module(sglang_0523, registry.find(sglang_0523, "rmsnorm_hf"))
    entry = spec["build"]["wrappers"][0]["entry"]
    assert entry.endswith("<{hidden_size}, true, {cpp_dtype(dtype)}>::run") and "HFRMSNorm" in entry
    assert "hidden_size" in spec["dims"] and spec["derived"] == {"d": "hidden_size"}
    assert _args(spec)["input"]["shape"] == ["num_tokens", "d"]
    assert spec["dtypes"] == ["bfloat16", "float16"]
    assert {m["dims"]["hidden_size"] for m in spec["shapes"]["models"]} == {"hidden_size"}


def test_draft_on_0510_layout_validates(sglang_0510, tmp_path):
    """The older `sglang/jit_kernel` layout drafts too, and the draft is a valid spec."""
    result = extract(sglang_0510, "clamp_position", out_dir=tmp_path / "clamp_position")
    spec = load(result.draft)
    assert spec.entry == "clamp_position"
    assert [a.name for a in spec.arguments] == ["dst", "seq_lens"]
    assert "TODO(review)" in result.draft.read_text()


def test_case_sizes_are_bounded(sglang_0523):
    """No drafted case holds more than MAX_CASE_BYTES of tensors (the 550 GB guess of old)."""
    spec, _ = draft.draft_module(sglang_0523, registry.find(sglang_0523, "concat_mla_k"))
    from pathlib import Path

    from astra.spec.expr import evaluate
    from astra.spec.model import KernelSpec
    ks = KernelSpec(Path("x/kernel.yaml"), spec)
    for case in ks.shape_cases():
        names = ks.names_for(case.dims, "bfloat16")
        total = 0
        for a in spec["arguments"]:
            n = 1
            for s in a["shape"]:
                n *= int(evaluate(str(s), names))
            total += n * 2
        assert total <= draft.MAX_CASE_BYTES
    assert ks.shape_cases()


@pytest.mark.parametrize("text,table,expected", [
    ("kHeadDim / 2", {"kHeadDim": "head_dim"}, "head_dim // 2"),
    ("A + B", {"A": "128", "B": "64"}, "128 + 64"),
    ("x.size(0)", {}, None),
    ("kUnknown", {}, None),
])
def test_translate_size_expressions(text, table, expected):
    assert infer.translate(text, table) == expected


def test_meanings_pick_fields_and_models():
    assert meanings.meaning_of("kHeadDim").key == "head_dim"
    assert meanings.meaning_of("num_kv_heads").key == "num_kv_heads"
    assert meanings.meaning_of("qk_rope_head_dim").key == "rope_dim"
    assert meanings.is_token_name("num_tokens") and not meanings.is_token_name("head_dim")
    assert meanings.pick_models({"num_experts"}, "moe") == meanings.MOE
    assert meanings.pick_models(set(), "diffusion") == meanings.DIFFUSION
    value, from_model = meanings.value_for(meanings.meaning_of("num_heads"), {"num_attention_heads": 64}, 8)
    assert value == "max(1, num_attention_heads // tp)" and from_model


def test_guessed_variant_is_reported(sglang_0523):
    guess = variants.guess(registry.find(sglang_0523, "clamp_position").call_sites[0])
    assert guess.guessed == ["dtype"]


def test_ranks_and_local_heads_get_model_values(sglang_0523):
    """diffusion_usp_relayout's dims were all "given 128" (world_size 128, 512 MiB per case): the rank count
    is now a sequence-parallel degree (the model's TP where it has one) and local heads are heads."""
    spec, _ = draft.draft_module(sglang_0523, registry.find(sglang_0523, "diffusion_usp_relayout"))
    for entry in spec["shapes"]["models"]:
        assert entry["dims"]["world_size"] == 4 and entry["dims"]["local_heads"] == "num_attention_heads"
    assert meanings.value_for(meanings.meaning_of("num_ranks"), {}, 8) == ("tp", True)
    assert meanings.meaning_of("kv_lora_rank").key == "kv_lora_rank"  # `rank` alone is not a rank count
