"""Offsets into the tokens (cu_seqlens, qsl, CSR indptr) are drawn as offsets, not random indices
(astra.spec.argument_kinds.offsets_init), by the n + 1 shape a host check gives them."""

from __future__ import annotations

import pytest

from astra.spec.argument_kinds import offsets_init
from tests.astra_home import cached_home


def _tensor(name, shape, dtype="int64", role="in", init=None):
    return {"name": name, "kind": "tensor", "shape": shape, "dtype": dtype, "role": role,
            "init": init or {"dist": "randint", "low": 0, "high": "min(cache_d0, nseq)"}}


def test_n_plus_one_integers_become_equal_runs_of_the_tokens():
    args = [_tensor("cu", ["cu_d0"]), _tensor("x", ["t", "d"], dtype="{dtype}"), _tensor("lens", ["nseq"]),
            _tensor("out_offsets", ["cu_d0"], role="out"), _tensor("w", ["nseq + 1"], dtype="float32")]
    notes = offsets_init(args, {"cu_d0": "nseq + 1"}, "t")
    assert args[0]["init"] == {"dist": "arange", "start": 0, "step": "t // max(1, nseq)"}
    assert [a["init"]["dist"] for a in args[1:]] == ["randint"] * 4  # not n + 1, an output, a float
    assert notes == ["tensor `cu`: nseq + 1 integers, drawn as the offsets of nseq equal runs of `t` (0, t // nseq, ...)"]


def test_offsets_of_the_swept_batch_run_over_the_dim_they_were_bounded_by():
    args = [_tensor("qsl", ["b + 1"], dtype="int32", init={"dist": "randint", "low": 0, "high": "min(t, cache_d0)"})]
    offsets_init(args, {}, "b")
    assert args[0]["init"]["step"] == "t // max(1, b)"
    unbounded = [_tensor("qsl", ["b + 1"], init={"dist": "randint", "low": 0, "high": 64})]
    offsets_init(unbounded, {}, "b")
    assert unbounded[0]["init"]["dist"] == "randint"  # nothing to run over: left as drafted


@pytest.mark.network
def test_the_causal_conv1d_draft_draws_cu_as_offsets(sglang_0523, tmp_path, monkeypatch):
    """inkling/causal_conv1d.cuh checks `cu.size(0) == NS.unwrap() + 1` ("cu must have length nseq+1")."""
    from astra.spec import extract, jobs
    from astra.spec import model as spec

    monkeypatch.setenv("ASTRA_HOME", str(cached_home(tmp_path / "home")))
    loaded = spec.load(extract.extract(sglang_0523, "inkling_causal_conv1d", build_check=False).draft)
    cu = next(a for a in loaded.raw["arguments"] if a["name"] == "cu")
    assert cu["init"]["dist"] == "arange"
    for case in jobs.cases(loaded)[0]:
        arg = next(a for a in case.args if a.name == "cu")
        t, nseq = case.dims["t"], case.dims["nseq"]
        assert arg.shape == [nseq + 1] and arg.init["step"] * nseq <= t


def test_a_one_row_tensor_never_bounds_an_index():
    """`num_token_non_padded` of shape [1] is not what an index tensor indexes: min(..., 1) would draw
    every index as 0 (and a length, low 1, from an empty range)."""
    from astra.spec.argument_kinds import tensor_init

    others = [("count", ["1"]), ("table", ["capacity"]), ("x", ["tokens", "hidden"])]
    assert tensor_init("page_idx", "int64", ["tokens"], others, "tokens") == {"dist": "randint", "low": 0,
                                                                                  "high": "capacity"}
    assert tensor_init("seq_lens", "int32", ["tokens"], [("count", ["1"])], "tokens")["high"] == 64


def test_token_counts_that_break_a_settled_template_value_are_dropped():
    """muse_spark_router_gemm: compiling settles kMaxTokens at 64 (128 needs more shared memory than
    sm_90a has), and `num_tokens <= max_tokens` then refuses the sweep's 128: dropped, with a note."""
    import copy

    import yaml

    from astra.spec import model as spec_mod
    from astra.spec.draft_cases import refit_tokens

    raw = copy.deepcopy(yaml.safe_load(spec_mod.spec_path("rmsnorm").read_text()))
    raw["derived"] = {"max_tokens": "64", **(raw.get("derived") or {})}
    raw["shapes"]["constraints"] = ["tokens <= max_tokens"]
    for entry in raw["shapes"]["models"]:
        entry["tokens"] = [1, 8, 64, 128]
    raw["shapes"]["edge"] = [{"tokens": 256, "hidden": 128}, {"tokens": 2, "hidden": 128}]
    notes = refit_tokens(raw)
    assert all(entry["tokens"] == [1, 8, 64] for entry in raw["shapes"]["models"])
    assert raw["shapes"]["edge"] == [{"tokens": 2, "hidden": 128}]
    assert len(notes) == len(raw["shapes"]["models"]) and "[128] dropped" in notes[0]
