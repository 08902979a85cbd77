"""What a kernel's dimension names mean, and which model configurations give them values.

A drafted spec names its dims after the kernel's own symbols (`SymbolicSize H{"num_heads"}`, a
wrapper's `make_cpp_args(head_dim, ...)`). Each name is matched against the meanings below, in order;
a meaning names the model field that holds it (models.yaml), how tensor parallelism divides it, and a
value to use when a model lacks the field. A name that matches nothing gets a neutral default and a
`TODO(review)` in the draft.
"""

from __future__ import annotations

import re
from dataclasses import dataclass


@dataclass(frozen=True)
class Meaning:
    key: str  # what the dim is, e.g. "head_dim"
    pattern: str  # regex over the lower-cased name (symbol, label or Python name)
    field: str | None  # the models.yaml field that holds it
    default: int  # when the model lacks the field (or no field applies)
    tp_divides: bool = False  # sharded by tensor parallelism (heads, intermediate size per rank)


TOKEN_PATTERN = re.compile(
    r"^(n|m|b|t|bs|bsz|n_?tokens|num_?tokens|tokens?|total_tokens|batch|batch_?size|num_rows|rows|"
    r"num_elements|numel|num_reqs|num_seqs|seq|q_len|n_rows|m_)$|num_tokens|batch_sym|tokens_sym")

MEANINGS: tuple[Meaning, ...] = (
    Meaning("rope_dim", r"rope|rot(ary)?_?dim|rot_dim|qk_rope", "qk_rope_head_dim", 64),
    Meaning("nope_dim", r"nope", "qk_nope_head_dim", 128),
    Meaning("kv_lora_rank", r"lora_rank|kv_lora|latent|ckv|kv_dim", "kv_lora_rank", 512),
    Meaning("world_size", r"world_?size|num_?ranks|^ranks$|^tp_?size$|^sp_?size$|ulysses", None, 4),
    Meaning("v_head_dim", r"(^|_)v_head_?dim|value_dim|^v_dim|^dv$", "v_head_dim", 128),
    Meaning("head_dim", r"head_?dim|head_?size|headdim|^d_?head$|^hd$", "head_dim", 128),
    Meaning("num_kv_heads", r"kv_?heads|num_kv|^hkv$|^h_?kv$|^kv_h|heads_(k|v|kv)$|(^|_)k_heads$", "num_key_value_heads", 8, True),
    Meaning("num_heads", r"^h_?$|^hq$|num_?heads|^heads$|q_?heads|qo_?heads|num_head|local_?heads", "num_attention_heads", 32,
            True),
    Meaning("num_experts", r"^e_?$|expert", "num_experts", 8),
    Meaning("topk", r"top_?k|^k_?$|^topk", "num_experts_per_tok", 2),
    Meaning("moe_intermediate", r"moe_?inter", "moe_intermediate_size", 1536, True),
    Meaning("intermediate", r"inter|ffn|^i$", "intermediate_size", 14336, True),
    Meaning("vocab", r"vocab", "vocab_size", 32000),
    Meaning("group_size", r"group|^g_?$|gsize", None, 128),
    Meaning("page_size", r"page_?size|^p_?$|block_?size|kpagesize", None, 64),
    Meaning("capacity", r"capacity|slots|num_?pages|num_?blocks|cache|max_?pos|max_?seq|entries|pool|^l_?$",
            None, 32768),
    Meaning("conv_width", r"conv_?w|kernel_?width|^w_?$|^width$|^kw$", None, 4),
    Meaning("state_len", r"state_len|state", None, 3),
    Meaning("hidden", r"hidden|^d_?$|^dim$|^c$|channels?|^k_?hidden|model_dim|^embed", "hidden_size", 4096),
)

# Models per kind of kernel: small and large dense, a GQA and an MLA model, MoE, diffusion.
DENSE = [("Llama-3.1-8B", 1), ("Qwen3-32B", 1), ("Llama-3.1-70B", 8)]
MLA = [("DeepSeek-V3", 1), ("DeepSeek-V3", 8)]
MOE = [("Qwen3-235B-A22B", 8), ("DeepSeek-V3", 8), ("Mixtral-8x7B", 2)]
DIFFUSION = [("Wan2.1-T2V-14B", 1), ("FLUX.1-dev", 1), ("HunyuanVideo", 1)]
TOKENS = [1, 8, 64, 256, 1024, 4096, 16384]


def meaning_of(name: str) -> Meaning | None:
    low = name.lower().removeprefix("k") if re.match(r"^k[A-Z]", name) else name.lower()
    for meaning in MEANINGS:
        if re.search(meaning.pattern, low):
            return meaning
    return None


def is_token_name(name: str) -> bool:
    return TOKEN_PATTERN.search(name.lower()) is not None


def pick_models(meanings: set[str], category: str) -> list[tuple[str, int]]:
    """The model configurations a draft's suite uses, by what its dims mean and its category."""
    if category == "diffusion":
        return DIFFUSION
    if meanings & {"rope_dim", "nope_dim", "kv_lora_rank"} and "head_dim" not in meanings:
        return MLA
    if meanings & {"num_experts", "topk", "moe_intermediate"}:
        return MOE
    return DENSE


def value_for(meaning: Meaning | None, fields: dict, tp: int) -> tuple[str | int, bool]:
    """(value or field expression, whether it came from the model) of a dim for one model."""
    if meaning is None:
        return 128, False
    if meaning.field and meaning.field in fields:
        field = meaning.field
        if meaning.tp_divides and tp > 1:
            return f"max(1, {field} // tp)", True
        return field, True
    if meaning.key == "head_dim" and "hidden_size" in fields and "num_attention_heads" in fields:
        return "hidden_size // num_attention_heads", True
    if meaning.key == "num_kv_heads" and "num_attention_heads" in fields:
        return ("max(1, num_attention_heads // tp)" if tp > 1 else "num_attention_heads"), True
    if meaning.key == "world_size" and tp > 1:  # the ranks a collective-free relayout spans: the model's TP
        return "tp", True
    if meaning.key == "rope_dim" and "head_dim" in fields:
        return "head_dim", True
    return meaning.default, False
