"""Wrapper facts on real SGLang sources (0.5.23: sglang/kernels/ops, 0.5.10: sglang/jit_kernel).

Every expected value below was read off the wheel's source by hand."""

import json
from dataclasses import asdict

import pytest

from astra.sglang.discovery import scan_file
from astra.sglang.wrapper_facts import entry_points, facts

pytestmark = pytest.mark.network


def _site(tree, rel, module_name):
    """The call site as discovery reads it (one file, not the whole registry: fast)."""
    return next(s for s in scan_file(tree.root / rel, tree.root) if s.module_name == module_name)


def _function(wf, name):
    return next(f for f in wf.functions if f.name == name)


@pytest.mark.parametrize("tree_fixture, rel", [
    ("sglang_0523", "sglang/kernels/ops/attention/clamp_position.py"),
    ("sglang_0510", "sglang/jit_kernel/clamp_position.py"),
])
def test_clamp_position_dtype_from_seq_lens_and_allocated_output(request, tree_fixture, rel):
    tree = request.getfixturevalue(tree_fixture)
    wf = facts(tree, _site(tree, rel, "clamp_position"))
    fn = _function(wf, "clamp_position_cuda")
    assert fn.public and fn.params == ["seq_lens"] and fn.returns == ["dst"]
    assert fn.dtypes == ["int32", "int64"]  # "Supported dtypes: torch.int32, torch.int64."
    (call,) = fn.calls
    assert call.export == "clamp_position"
    dtype = call.loader_args["dtype"]
    assert (dtype.expr, dtype.tensor, dtype.dim, dtype.attr) == ("seq_lens.dtype", "seq_lens", None, "dtype")
    out, src = call.args
    assert (out.written, out.expr, out.allocated) == ("dst", "torch.empty_like(seq_lens)", True)
    assert (src.expr, src.param, src.allocated) == ("seq_lens", "seq_lens", False)
    (alloc,) = fn.allocations
    assert (alloc.name, alloc.like, alloc.shape, alloc.dtype) == ("dst", "seq_lens", "seq_lens.shape", "seq_lens.dtype")
    assert alloc.returned and alloc.condition is None and alloc.feeds == ["clamp_position[0]"]
    json.dumps(asdict(wf))  # plain data


def test_qknorm_head_dim_from_q_and_loader_default(sglang_0523):
    wf = facts(sglang_0523, _site(sglang_0523, "sglang/kernels/ops/layernorm/norm.py", "qknorm"))
    assert wf.loader == "_jit_qknorm_module" and wf.loader_params == ["head_dim", "dtype", "half_warp"]
    fn = _function(wf, "fused_inplace_qknorm")
    assert fn.defaults == {"eps": "1e-06", "head_dim": "0"}
    (call,) = fn.calls
    head_dim = call.loader_args["head_dim"]  # head_dim = head_dim or q.size(-1)
    assert (head_dim.expr, head_dim.tensor, head_dim.dim, head_dim.attr) == ("head_dim or q.size(-1)", "q", -1, "size")
    assert (head_dim.param, head_dim.default) == ("head_dim", "0")
    assert call.loader_args["dtype"].expr == "q.dtype"
    assert (call.loader_args["half_warp"].expr, call.loader_args["half_warp"].written) == ("True", "<default>")
    assert [a.expr for a in call.args] == ["q", "k", "q_weight", "k_weight", "eps"]
    assert (call.args[4].param, call.args[4].default) == ("eps", "1e-06")


def test_store_cache_row_bytes_mutates_args_and_branch_values_stay_named(sglang_0510):
    wf = facts(sglang_0510, _site(sglang_0510, "sglang/jit_kernel/kvcache.py", "kvcache"))
    fn = _function(wf, "store_cache")
    assert fn.mutates_args == ["k_cache", "v_cache"]  # @register_custom_op(mutates_args=[...])
    (call,) = fn.calls
    row = call.loader_args["row_bytes"]  # row_bytes = row_bytes or k.shape[-1] * k.element_size()
    assert (row.expr, row.tensor, row.dim, row.attr) == ("row_bytes or k.shape[-1] * k.element_size()", "k", -1, "shape")
    # num_split is set to 4, 2 or 1 in branches: it stays a name, with its parameter default
    assert (call.args[5].expr, call.args[5].param, call.args[5].default) == ("num_split", "num_split", "0")


def test_conditional_output_and_two_exports_behind_one_name(sglang_0523):
    rel = "sglang/kernels/ops/attention/dsv4/compress.py"
    wf = facts(sglang_0523, _site(sglang_0523, rel, "compress_{ratio}_v2"))
    fn = _function(wf, "compress_forward")
    assert sorted(wf.by_export()) == ["decode", "prefill"]  # fn = module.decode if ... else module.prefill
    (alloc,) = fn.allocations
    assert alloc.call == "kv_score_input.new_empty((num_q_tokens, head_dim))"
    assert (alloc.shape, alloc.dtype, alloc.condition, alloc.returned) == (
        "(num_q_tokens, head_dim)", "kv_score_input.dtype", "out is None", True)
    assert alloc.feeds == ["decode[2]", "prefill[2]"]
    dtype_out = fn.calls[0].loader_args["dtype_out"]
    assert (dtype_out.expr, dtype_out.tensor, dtype_out.attr) == ("out.dtype", "out", "dtype")


def test_exports_reached_through_helpers(sglang_0523):
    # hadamard: `_hadamard_transform_impl(x, scale, 8, module.hadamard_transform)` calls it as `fn(...)`
    wf = facts(sglang_0523, _site(sglang_0523, "sglang/kernels/ops/quantization/hadamard.py", "hadamard"))
    calls = wf.by_export()["hadamard_transform_12n"]
    assert calls[0].function == "_hadamard_transform_impl"
    assert calls[0].loader_args["dtype"].expr == "x.dtype"
    # sparse prefill: `dispatch_fn, _, _ = _get_entries()`, which returns `(m["dispatch"], ...)`
    rel = "sglang/kernels/ops/attention/sparse_mla_q8kv8_prefill_sm90.py"
    wf = facts(sglang_0523, _site(sglang_0523, rel, "sparse_mla_q8kv8_prefill_sm90"))
    assert sorted(wf.by_export()) == ["dispatch", "dispatch_full", "dispatch_topk_length"]
    assert _function(wf, "_sparse_mla_q8kv8_prefill_op").mutates_args == ["out", "max_logits", "lse"]


def test_entry_points_follow_fused_op_registration(sglang_0523):
    site = _site(sglang_0523, "sglang/kernels/ops/attention/clamp_position.py", "clamp_position")
    points = {(ep.name, ep.kind) for ep in entry_points(sglang_0523, site)}
    # clamp_position -> _CLAMP_POSITION = register_fused_op(ClampPositionOp(), ...) -> forward_jit
    # -> clamp_position_cuda -> module.clamp_position
    assert points == {("clamp_position_cuda", "function"), ("ClampPositionOp", "class"),
                      ("_CLAMP_POSITION", "alias"), ("clamp_position", "function"),
                      ("_jit_clamp_position_module", "loader")}
