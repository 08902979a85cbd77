"""Host checks of C++ entries (`RuntimeCheck`, `CHECK_HOST`, a panicking `if` or `switch`) read as
relations between a draft's dims: equalities become derived dims, divisibility, ranges and
disjunctions become constraints that every drafted case meets. Real SGLang sources (0.5.23 and
0.5.10, downloaded at test time) and small C++ snippets."""

from __future__ import annotations

from pathlib import Path

import pytest

from astra.sglang import host_checks, registry
from astra.spec import draft, infer
from astra.spec.expr import evaluate
from astra.spec.model import KernelSpec


def _checks(src: str) -> list[tuple[str, str | None]]:
    spellings = host_checks.tokenize(src)
    return [(c.cond, c.guard) for c in host_checks.checks_in(spellings, [1] * len(spellings), "f")]


def test_else_branches_run_under_the_negation_of_their_chain():
    src = """{
      CHECK_HOST(a) << "always";
      if constexpr (kInner) { CHECK_HOST(b) << "inner"; } else { CHECK_HOST(c) << "outer"; }
      if (p1) RuntimeCheck(d, "1"); else if (p2) { RuntimeCheck(e, "2"); } else { RuntimeCheck(f, "3"); }
      RuntimeCheck(g, "after");
    }"""
    assert _checks(src) == [
        ("a", None),
        ("b", "( kInner )"),
        ("c", "! ( kInner )"),
        ("d", "( p1 )"),
        ("e", "! ( p1 ) && ( p2 )"),
        ("f", "! ( p1 ) && ! ( p2 )"),  # not `!(!p1 && p2)`, which would let p1 through
        ("g", None),
    ]


def test_panicking_if_and_switch_default_become_conditions():
    src = """{
      if (n > 4096) { Panic("too many"); }
      switch (head_dim) { case 64: run<64>(); break; case 128: run<128>(); break; default: Panic("bad"); }
    }"""
    assert _checks(src) == [("! ( n > 4096 )", None),
                            ("( head_dim ) == ( 64 ) || ( head_dim ) == ( 128 )", None)]


def test_conditions_read_as_python_over_spec_names():
    env = host_checks.CondEnv(sizes={"D": "hidden"}, shapes={"x": ["tokens", "hidden"]}, names={"kVec": "8"},
                              unshaped={"pos"})
    read = host_checks.to_python("static_cast<int64_t>(D.unwrap()) % kVec == 0 && x.size(0) <= x.numel()", env)
    assert host_checks.conjuncts(read) == ["hidden % 8 == 0", "tokens <= tokens * hidden"]
    assert host_checks.to_python("pos.ndim() == 1", env) == "(_t_pos__ndim == 1)"
    # what cannot be named is dropped, not guessed
    assert host_checks.conjuncts(host_checks.to_python("D.unwrap() > 0 && ptr != nullptr", env)) == ["hidden > 0"]


def test_satisfy_meets_an_equality_through_a_derived_dim():
    derived = {"width": "heads * 4"}
    moved = infer.satisfy({"heads": 3, "tokens": 8}, derived, ["width == 64"], {"heads"}, "bfloat16")
    assert moved == {"heads": 16, "tokens": 8}
    # either side may be the one that moves (the fixed bug: Eq targets were swapped)
    assert infer.satisfy({"d": 5}, {}, ["128 == d"], {"d"}, "bfloat16") == {"d": 128}
    assert infer.satisfy({"d": 5}, {}, ["d == 128"], {"d"}, "bfloat16") == {"d": 128}
    assert infer.violated(moved, derived, ["width == 64"], "bfloat16") == []


def test_satisfy_takes_the_first_option_of_a_disjunction_a_rule_meets():
    constraints = ["num_axes == 1 or num_axes == 3", "hidden % (16 // elt(dtype)) == 0"]
    moved = infer.satisfy({"num_axes": 128, "hidden": 100}, {}, constraints, {"num_axes", "hidden"}, "bfloat16")
    assert moved == {"num_axes": 1, "hidden": 104}
    assert infer.violated(moved, {}, constraints, "bfloat16") == []
    # a dim that may not move is left alone, and the constraint stays broken
    assert infer.satisfy({"num_axes": 2}, {}, constraints[:1], set(), "bfloat16") == {"num_axes": 2}


# ---- real SGLang sources ---------------------------------------------------------------------------------

def _draft(tree, name: str) -> tuple[dict, list[str]]:
    pytest.importorskip("clang.cindex")
    return draft.draft_module(tree, registry.find(tree, name), runtime=False)


def _facts(tree, name: str):
    pytest.importorskip("clang.cindex")
    return draft.module_facts(tree, registry.find(tree, name))[0][1]


def _args(spec: dict) -> dict:
    return {a["name"]: a for a in spec["arguments"]}


def _cases_meet_constraints(spec: dict) -> int:
    """Every drafted case meets every constraint, for every dtype; the number of cases."""
    ks = KernelSpec(Path("x/kernel.yaml"), spec)
    cases = ks.shape_cases()
    constraints = spec["shapes"].get("constraints") or []
    for case in cases:
        for dtype in spec["dtypes"]:
            names = ks.names_for(case.dims, dtype)
            broken = [c for c in constraints if not evaluate(c, names)]
            assert broken == [], (case.case_id(dtype), broken)
    return len(cases)


def test_bias_residual_add_divisibility_and_promoted_scalar(sglang_0523):
    """`CHECK_HOST(numel % kVec == 0)` with a file constant kVec = 8, and the channel-outer branch's
    `spatial % kVec == 0 && numel % (channels * spatial) == 0`: the scalar `spatial` becomes a dim."""
    facts = _facts(sglang_0523, "bias_residual_add")
    messages = {c.message: c for c in facts.checks}
    assert messages["numel must be a multiple of"].cond == "numel % kVec == 0"
    assert messages["channels must be a multiple of"].guard == "( kChannelsInner )"
    assert messages["spatial must be a multiple of  and divide numel"].guard == "! ( kChannelsInner )"
    spec, notes = _draft(sglang_0523, "bias_residual_add")
    assert spec["build"]["wrappers"][0]["entry"].endswith("Kernel<false>::run")  # channel-outer: the else branch
    assert spec["shapes"]["constraints"] == ["numel % 8 == 0", "spatial % 8 == 0", "numel % (channels * spatial) == 0"]
    assert _args(spec)["spatial"]["value"] == "spatial" and "spatial" in spec["dims"]
    assert "scalar `spatial` became dim `spatial`: a host check constrains it" in notes
    assert _cases_meet_constraints(spec) > 0


def test_rope_store_width_equality_becomes_a_derived_dim(sglang_0523):
    """bf16_rope_scale_store: `input_width == query_width + kv_heads * (head_dim + value_dim)` derives
    the fused width; `Query width must contain whole heads` stays a divisibility. (A sum on the right
    was once read as `input_width == query_width`, which left the draft without a case.)"""
    facts = _facts(sglang_0523, "bf16_rope_scale_store")
    assert facts.equal_sizes == []
    spec, _ = _draft(sglang_0523, "bf16_rope_scale_store")
    assert spec["derived"] == {"input_width": "query_width + kv_heads * (head_dim + value_dim)"}
    args = _args(spec)
    assert args["qkv"]["shape"] == ["tokens", "input_width"] and args["query"]["shape"] == ["tokens", "query_width"]
    constraints = spec["shapes"]["constraints"]
    assert "query_width % head_dim == 0" in constraints
    assert {"rotary_dim > 0", "rotary_dim % 2 == 0", "rotary_dim <= head_dim"} <= set(constraints)
    assert _cases_meet_constraints(spec) > 0


@pytest.mark.parametrize("tree_fixture", ["sglang_0523", "sglang_0510"])
def test_concat_mla_absorb_q_product_equality(request, tree_fixture):
    """`a.size(0) * a.size(1) must equal b.size(0) * b.size(1)` and `a.size(1) must equal b.size(1)`:
    b shares a's dim 1 and its dim 0 is derived from a's (not `b_dim_0 = a_dim_1`, a misreading of the
    product as `N1_a == N0_b`)."""
    tree = request.getfixturevalue(tree_fixture)
    assert _facts(tree, "concat_mla_absorb_q").equal_sizes == [("N1_a", "N1_b")]
    spec, _ = _draft(tree, "concat_mla_absorb_q")
    assert _args(spec)["b"]["shape"] == ["b_dim_0", "a_dim_1", "b_last_dim"]
    assert spec["derived"]["b_dim_0"] == "a_dim_0"
    assert spec["shapes"]["constraints"] == ["a_dim_0 * a_dim_1 == b_dim_0 * a_dim_1"]
    assert _cases_meet_constraints(spec) > 0


def test_activation_dimension_check_through_a_local(sglang_0523):
    """`hidden_size * 2 == D_in.unwrap()` over the local `hidden_size = static_cast<uint32_t>(D_out.unwrap())`
    derives the input width; `hidden_size % kVecSize == 0` with kVecSize = kMaxVecBytes / sizeof(T)
    becomes a divisibility that depends on the dtype."""
    facts = _facts(sglang_0523, "activation")
    check = next(c for c in facts.checks if c.message == "invalid activation dimension")
    assert check.cond == "hidden_size * 2 == D_in . unwrap ( )" and "hidden_size" in check.locals
    spec, _ = _draft(sglang_0523, "activation")
    assert spec["derived"] == {"input_width": "output_width * 2"}
    assert _args(spec)["input"]["shape"] == ["num_tokens", "input_width"]
    assert "output_width % (16 // elt(dtype)) == 0" in spec["shapes"]["constraints"]
    assert _cases_meet_constraints(spec) > 0


def test_qsa_indexer_disjunction_leaves_cases(sglang_0523):
    """`num_axes == 1 || num_axes == 3`: the draft's cases take one of the two (it once had none)."""
    spec, _ = _draft(sglang_0523, "qsa_indexer")
    assert "num_axes == 1 or num_axes == 3" in spec["shapes"]["constraints"]
    assert spec["shapes"]["models"] and all(m["dims"]["num_axes"] in (1, 3) for m in spec["shapes"]["models"])
    assert _cases_meet_constraints(spec) > 0


@pytest.mark.parametrize("export,constraints", [
    ("hadamard_transform", ["dim % 8 == 0", "dim <= 32768"]),
    ("hadamard_transform_12n", ["dim % 12 == 0", "dim % (4 * 12) == 0", "dim <= 12 * 1024"]),
])
def test_template_arguments_of_a_helper_select_its_branch(sglang_0510, export, constraints):
    """hadamard's entries call `run_hadamard<1, DType>(...)`, `run_hadamard<12, DType>(...)`, ...,
    whose `if constexpr (kMultiple == 1) ... else if constexpr (kMultiple == 12) ...` chain checks
    different sizes per multiple: only the entry's branch applies (all five at once left no case)."""
    pytest.importorskip("clang.cindex")
    spec, _ = draft.draft_module(sglang_0510, registry.find(sglang_0510, "hadamard"), export=export, runtime=False)
    assert spec["build"]["wrappers"][0]["export"] == export
    assert spec["shapes"]["constraints"] == constraints
    assert _cases_meet_constraints(spec) > 0


def test_rotary_embedding_takes_one_rank_branch_and_a_table(sglang_0523):
    """`positions.ndim() == 1 || positions.ndim() == 2` picks rank 1, so the `positions_ndim == 2`
    branch's checks are skipped (reading both left `1 % head_size == 0`); `query.numel() / num_tokens`
    gives query a dim past the one its size checks read; `cos_sin_cache` (read only through
    `int rot_dim = cos_sin_cache.size(1)`) is a table of rows that positions index, not [tokens, hidden]."""
    spec, _ = _draft(sglang_0523, "rotary_embedding")
    args = _args(spec)
    assert spec["shapes"]["token_dim"] == "tokens"
    assert len(args["positions"]["shape"]) == 1 and args["query"]["shape"][0] == "tokens"
    assert len(args["query"]["shape"]) == 2 and args["positions"]["dtype"] == "int64"
    assert args["cos_sin_cache"]["shape"] == ["cos_sin_cache_rows", "rot_dim"]
    assert args["positions"]["init"]["high"] == "cos_sin_cache_rows"
    assert spec["shapes"]["models"] and all(m["dims"]["head_size"] == "head_dim" for m in spec["shapes"]["models"])
    assert _cases_meet_constraints(spec) > 0


def test_int_flag_scalar_takes_a_value_not_a_dim(sglang_0523):
    """fused_qknorm_rope's `int is_neox` is read as a truth value (`!is_neox`): a flag set to what its
    check allows (0), not a dim that would have to be 0 while dims are >= 1."""
    spec, notes = _draft(sglang_0523, "fused_qknorm_rope")
    assert "is_neox" not in spec["dims"] and _args(spec)["is_neox"]["value"] in (0, 1)
    assert any("`is_neox` is a flag" in n for n in notes)
    assert _cases_meet_constraints(spec) > 0


def test_set_value_of_the_absent_branch_is_not_the_size(sglang_0523):
    """fused_rope: `if (k.has_value()) TensorMatcher({B, K, D}).verify(k); else K.set_value(0);`: with k
    drafted present, K is a free dim (it was 0, an empty tensor, and the draft had no case)."""
    spec, _ = _draft(sglang_0523, "fused_rope")
    assert "num_k_heads" in spec["dims"] and "num_k_heads" not in spec["derived"]
    assert _cases_meet_constraints(spec) > 0


def test_shapes_over_scalars_and_locals_and_smaller_edges(sglang_0523):
    """ltx25 rope: `TensorMatcher({W, dim_w / 2})` with the local `dim_w = head_dim - dim_t - dim_h`
    and the scalars dim_t, dim_h reads as one expression; six-dim tensors outgrow the case budget at
    64 per dim, so the edge shapes take smaller dims."""
    spec, _ = _draft(sglang_0523, "diffusion_ltx25_decoder_rope")
    assert _args(spec)["cos_w"]["shape"][1] == "(head_dim - dim_t - dim_h) // 2"
    assert _args(spec)["cos_t"]["shape"][1] == "dim_t // 2"
    assert _cases_meet_constraints(spec) > 0


def test_rank_from_a_lower_bound_negative_indices_and_another_rank(sglang_0523):
    """vdn_delta_factors: `A.ndim() >= 2 && A.size(-2) == kDim && A.size(-1) == kDim` gives A rank 2, and
    `alpha.ndim() == A.ndim() - 1` gives alpha rank 1 (they read as `1 >= 2`, `1 == 1 - 1`: no case)."""
    spec, _ = _draft(sglang_0523, "diffusion_vdn_delta_factors")
    assert len(_args(spec)["A"]["shape"]) == 2 and len(_args(spec)["alpha"]["shape"]) == 1
    assert _cases_meet_constraints(spec) > 0
