"""What a drafted kernel moves (`bytes`) and which index tensors it draws distinct, on hand-made argument
lists and on real SGLang 0.5.23 sources (downloaded at test time). Both rules came from the H100 check
sample of 2026-11-23: rotary_embedding's original was "suspect" under a floor that counted its whole
cos/sin table, and set_mla_kv_concat_q_fp8's original disagreed with itself because `loc` repeated."""

from __future__ import annotations

import pytest

from astra.sglang import registry
from astra.spec import draft
from astra.spec.draft_traffic import bytes_expr, distinct_scatter_indices, lookups
from astra.spec.expr import evaluate


def _tensor(name, shape, dtype="{dtype}", role="in", **extra):
    return {"name": name, "kind": "tensor", "shape": shape, "dtype": dtype, "role": role, **extra}


def _index(name, shape, high, dist="randint"):
    init = {"dist": dist, "high": high} | ({"low": 0} if dist == "randint" else {})
    return _tensor(name, shape, "int64", "in", init=init)


def _bytes(arguments, **dims) -> int:
    return int(evaluate(bytes_expr(arguments), {**dims, "dtype": "bfloat16"}))


def test_a_table_looked_up_by_index_moves_the_rows_named():
    rope = [_index("positions", ["tokens"], "rows"), _tensor("query", ["tokens", "d"], role="inout"),
            _tensor("cos_sin_cache", ["rows", "rot"])]
    # 256 tokens over a 32768-row table: 256 rows of it, not 32768
    assert _bytes(rope, tokens=256, rows=32768, d=128, rot=128) == 256 * 8 + 2 * 256 * 128 * 2 + 256 * 128 * 2
    # more lookups than rows: never more than the table
    assert _bytes(rope, tokens=64, rows=16, d=128, rot=128) == 64 * 8 + 2 * 64 * 128 * 2 + 16 * 128 * 2
    assert lookups(rope) == {"rows": ["tokens"]}


def test_an_absent_optional_tensor_moves_nothing():
    args = [_tensor("x", ["tokens", "d"]), _tensor("key", ["tokens", "d"], role="inout", present=False)]
    assert _bytes(args, tokens=8, d=64) == 8 * 64 * 2
    assert "key" not in bytes_expr(args) and "2 *" not in bytes_expr(args)


def test_indices_of_several_tensors_add_up_and_an_index_is_counted_whole():
    args = [_index("src_idx", ["n"], "pool"), _index("dst_idx", ["m"], "pool"), _tensor("pool_t", ["pool", "d"], role="inout")]
    assert _bytes(args, n=3, m=5, pool=100, d=4) == 3 * 8 + 5 * 8 + 2 * 8 * 4 * 2
    plain = [_tensor("x", ["t", "d"]), _index("ids", ["t"], "t")]  # an index into its own dim: no table
    assert _bytes(plain, t=10, d=4) == 10 * 4 * 2 + 10 * 8


def test_a_scatter_index_into_a_written_tensor_is_drawn_distinct():
    args = [_tensor("kv", ["pool", "d"], "uint8", "inout"), _index("loc", ["b"], "pool"),
            _index("positions", ["b"], "rows"), _tensor("table", ["rows", "d"]),
            _index("expert_ids", ["b"], "experts"), _tensor("counts", ["experts"], "int32", "out")]
    notes: list[str] = []
    distinct_scatter_indices(args, notes)
    init = {a["name"]: a.get("init") for a in args}
    assert init["loc"] == {"dist": "perm", "high": "pool"}
    assert init["positions"]["dist"] == "randint"  # a gather from a table that is only read
    assert init["expert_ids"]["dist"] == "randint"  # expert ids repeat in SGLang (atomics count them)
    assert len(notes) == 1 and "`loc`" in notes[0]


def _draft(tree, name):
    spec, notes = draft.draft_module(tree, registry.find(tree, name))
    return spec, notes, {a["name"]: a for a in spec["arguments"]}


def test_rotary_embedding_draft_counts_the_rows_its_positions_read(sglang_0523):
    pytest.importorskip("clang.cindex")
    spec, _, args = _draft(sglang_0523, "rotary_embedding")
    assert args["key"]["present"] is False
    assert "min(cos_sin_cache_rows, positions_d0)" in spec["bytes"] and "hidden" not in spec["bytes"]
    names = {"tokens": 256, "positions_d0": 256, "query_d1": 4096, "cos_sin_cache_rows": 32768, "rot_dim": 128,
             "hidden": 4096, "head_size": 128, "dtype": "bfloat16"}
    assert evaluate(spec["bytes"], names) == 256 * 8 + 2 * 256 * 4096 * 2 + 256 * 128 * 2


def test_set_mla_kv_concat_q_draft_writes_distinct_slots(sglang_0523):
    pytest.importorskip("clang.cindex")
    spec, notes, args = _draft(sglang_0523, "set_mla_kv_concat_q_fp8")
    assert args["loc"]["init"] == {"dist": "perm", "high": "kv_buffer_d0"}
    assert "(batch_size) <= kv_buffer_d0" in spec["shapes"]["constraints"]
    assert any("`loc`" in n and "distinct" in n for n in notes)


def test_only_read_index_tensors_make_a_table_and_workspaces_move_nothing():
    """An int8 output drawn below some size is not an index (convrot_int8's `xq` made its weight a table),
    nor a length; a numeric high is no dim; a scratch workspace and an alias move nothing of their own."""
    args = [_tensor("weight_q", ["n", "k"], "int8"),
            {**_index("xq", ["m", "k"], "n"), "role": "out", "dtype": "int8"},
            _index("seq_lens", ["m"], "n"), _index("expert_ids", ["m"], "2"),
            _tensor("ws", ["n"], "int32", "scratch"), _tensor("y", ["m", "k"], role="out"),
            {**_tensor("y2", ["m", "k"], role="alias"), "alias": "y"}]
    assert lookups(args) == {}
    assert _bytes(args, n=64, m=2, k=16) == 64 * 16 + 2 * 16 + 2 * 8 + 2 * 8 + 2 * 2 * 16 * 2  # y read and written (aliased)


def test_a_tensor_whose_shape_is_a_guess_is_left_out_of_bytes():
    args = [_tensor("topk_ids", ["t", "k"], "int32"), {**_tensor("sorted", ["t", "h"], "int32", "inout"),
                                                       "counted": False}]
    assert _bytes(args, t=4, k=8, h=4096) == 4 * 8 * 4  # the guessed [t, h] buffer is not counted


def test_moe_lora_align_draft_counts_only_the_tensors_it_knows(sglang_0523):
    """On an H100 the drafted floor (every tensor but topk_ids guessed as [tokens, hidden]) was 424 us
    where the original ran 379.6 us; only topk_ids has a shape the entry checks."""
    pytest.importorskip("clang.cindex")
    spec, notes, args = _draft(sglang_0523, "moe_lora_align_block_size")
    guessed = {n for n, a in args.items() if a.get("counted") is False}
    assert {"sorted_token_ids", "expert_ids", "token_mask"} <= guessed and "topk_ids" not in guessed
    assert "hidden" not in spec["bytes"] and "topk_ids_d0" in spec["bytes"]
    assert {n.split("`")[1] for n in notes if "left out of `bytes`" in n} == guessed
    from astra.spec.checks import check_tensor_options

    known = set(spec["dims"]) | set(spec["derived"])
    assert not [p for p in check_tensor_options(args["sorted_token_ids"], "x", known) if "counted" in p]
    assert any("`counted` is true or false" in p
               for p in check_tensor_options({**args["sorted_token_ids"], "counted": "no"}, "x", known))
