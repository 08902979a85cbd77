"""The reviewed specs in extracted_kernels/: their float64 references (checked on small CPU inputs
against independent formulations and known properties) and the specs' structure."""

from __future__ import annotations

import hashlib
import importlib.util
import math
from pathlib import Path

import pytest
import torch
import yaml

from astra.spec.expr import evaluate, render

SPECS = Path(__file__).resolve().parents[3] / "extracted_kernels"
NAMES = ["silu_and_mul", "fused_add_rmsnorm", "rmsnorm", "qknorm", "per_token_group_quant", "store_cache"]
REQUIRED = ("name", "module", "source", "build", "entry", "dims", "dtypes", "arguments", "shapes",
            "tolerance", "bytes")
F64 = torch.float64


def load_reference(name: str):
    path = SPECS / name / "reference.py"
    spec = importlib.util.spec_from_file_location(f"astra_ref_{name}", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def raw_spec(name: str) -> dict:
    return yaml.safe_load((SPECS / name / "kernel.yaml").read_text())


@pytest.fixture
def gen():
    g = torch.Generator()
    g.manual_seed(1234)
    return g


def randn(gen, *shape, std=1.0, mean=0.0):
    return torch.randn(*shape, generator=gen, dtype=F64) * std + mean


# ---------------------------------------------------------------------------------------------
# silu_and_mul


def test_silu_and_mul_matches_exp_formula_and_layout(gen):
    ref = load_reference("silu_and_mul").reference
    tokens, d = 5, 24
    x = randn(gen, tokens, 2 * d, std=3.0)
    out = ref({"input": x.clone(), "out": torch.empty(tokens, d, dtype=F64), "type": "silu"},
              {"tokens": tokens, "d": d})["out"]
    gate, up = x[:, :d], x[:, d:]
    expected = gate / (1.0 + torch.exp(-gate)) * up
    assert out.shape == (tokens, d)
    torch.testing.assert_close(out, expected, rtol=1e-14, atol=1e-14)
    # gate is the FIRST half: swapping halves must change the answer
    swapped = torch.cat([up, gate], dim=1)
    assert not torch.allclose(ref({"input": swapped, "out": None, "type": "silu"}, {})["out"], out)


def test_silu_and_mul_known_values():
    ref = load_reference("silu_and_mul").reference
    assert torch.count_nonzero(ref({"input": torch.zeros(3, 16, dtype=F64), "type": "silu"}, {})["out"]) == 0
    x = torch.tensor([[1.0, -2.0, 2.0, 3.0]], dtype=F64)  # gates (1, -2), ups (2, 3)
    out = ref({"input": x, "type": "silu"}, {})["out"]
    expected = [1.0 / (1.0 + math.exp(-1.0)) * 2.0, -2.0 / (1.0 + math.exp(2.0)) * 3.0]
    assert out.flatten().tolist() == pytest.approx(expected, rel=1e-15)
    # very negative gates saturate to -0, never NaN
    big = torch.tensor([[-1000.0, 5.0]], dtype=F64)
    assert ref({"input": big, "type": "silu"}, {})["out"].item() == 0.0


# ---------------------------------------------------------------------------------------------
# norms


def test_fused_add_rmsnorm_contract(gen):
    ref = load_reference("fused_add_rmsnorm").reference
    tokens, hidden, eps = 4, 48, 1e-6
    x, r = randn(gen, tokens, hidden), randn(gen, tokens, hidden, std=2.0)
    w = randn(gen, hidden, mean=1.0, std=0.25)
    args = {"input": x.clone(), "residual": r.clone(), "weight": w.clone(), "eps": eps}
    out = ref(args, {"tokens": tokens, "hidden": hidden})
    assert set(out) == {"input", "residual"}
    # residual receives the sum, input the normalized sum times weight
    torch.testing.assert_close(out["residual"], x + r, rtol=0, atol=0)
    expected = torch.nn.functional.rms_norm(x + r, (hidden,), w, eps)
    torch.testing.assert_close(out["input"], expected, rtol=1e-13, atol=1e-13)
    rms = (out["input"] / w).pow(2).mean(-1).sqrt()
    torch.testing.assert_close(rms, torch.ones(tokens, dtype=F64), rtol=1e-5, atol=0)
    # the reference does not modify its arguments
    assert torch.equal(args["input"], x) and torch.equal(args["residual"], r)


def test_rmsnorm_unit_rms_and_scale_invariance(gen):
    ref = load_reference("rmsnorm").reference
    tokens, hidden = 6, 64
    x = randn(gen, tokens, hidden, std=5.0)
    w = randn(gen, hidden, mean=1.0, std=0.25)
    out = ref({"input": x, "weight": w, "out": torch.empty_like(x), "eps": 0.0}, {})["out"]
    torch.testing.assert_close((out / w).pow(2).mean(-1), torch.ones(tokens, dtype=F64), rtol=1e-12, atol=0)
    scaled = ref({"input": 37.0 * x, "weight": w, "eps": 0.0}, {})["out"]
    torch.testing.assert_close(scaled, out, rtol=1e-12, atol=1e-12)
    with_eps = ref({"input": x, "weight": w, "eps": 1e-6}, {})["out"]
    torch.testing.assert_close(with_eps, torch.nn.functional.rms_norm(x, (hidden,), w, 1e-6), rtol=1e-13, atol=1e-13)


def test_rmsnorm_eps_dominates_tiny_rows():
    ref = load_reference("rmsnorm").reference
    x = torch.full((1, 64), 1e-6, dtype=F64)
    out = ref({"input": x, "weight": torch.ones(64, dtype=F64), "eps": 1e-6}, {})["out"]
    # rsqrt(1e-12 + 1e-6) ~ 1000: the output stays near 1e-3, not 1
    assert torch.allclose(out, torch.full_like(x, 1e-6 / math.sqrt(1e-12 + 1e-6)))


def test_qknorm_per_head_with_own_weights(gen):
    ref = load_reference("qknorm").reference
    rms_ref = load_reference("rmsnorm").reference
    tokens, qh, kh, hd, eps = 3, 4, 2, 64, 1e-6
    q, k = randn(gen, tokens, qh, hd, std=3.0), randn(gen, tokens, kh, hd)
    qw, kw = randn(gen, hd, mean=1.0, std=0.25), randn(gen, hd, mean=1.0, std=0.25)
    out = ref({"q": q, "k": k, "q_weight": qw, "k_weight": kw, "eps": eps}, {})
    assert out["q"].shape == q.shape and out["k"].shape == k.shape
    # each head normalized independently: same as rmsnorm over rows of head_dim
    as_rows = rms_ref({"input": q.reshape(-1, hd), "weight": qw, "eps": eps}, {})["out"]
    torch.testing.assert_close(out["q"], as_rows.reshape(q.shape), rtol=1e-14, atol=1e-14)
    torch.testing.assert_close((out["k"] / kw).pow(2).mean(-1), torch.ones(tokens, kh, dtype=F64),
                               rtol=1e-5, atol=0)
    # q uses q_weight only, k uses k_weight only
    other = ref({"q": q, "k": k, "q_weight": qw, "k_weight": 2 * kw, "eps": eps}, {})
    assert torch.equal(other["q"], out["q"])
    torch.testing.assert_close(other["k"], 2 * out["k"])


# ---------------------------------------------------------------------------------------------
# per_token_group_quant


def _e4m3_ulp(q: torch.Tensor) -> torch.Tensor:
    """Spacing of the e4m3fn grid at |q| (independent of the reference's own rounding code)."""
    a = q.abs().clamp(min=2.0 ** -6)
    return torch.exp2(torch.floor(torch.log2(a)) - 3)


def test_per_token_group_quant_scales_values_and_rounding(gen):
    mod = load_reference("per_token_group_quant")
    tokens, groups, size = 4, 3, 128
    x = randn(gen, tokens, groups * size, std=2.0)
    out = mod.reference({"input": x, "output_q": None, "output_s": torch.empty(tokens, groups)}, {})
    q, s = out["output_q"], out["output_s"]
    assert q.shape == x.shape and s.shape == (tokens, groups)
    amax = x.reshape(tokens, groups, size).abs().amax(-1)
    torch.testing.assert_close(s, amax / 448.0, rtol=1e-15, atol=0)
    qg = q.reshape(tokens, groups, size)
    assert qg.abs().amax(-1).eq(448.0).all()  # each group's largest element maps to +-448 exactly
    assert q.abs().max() <= 448.0
    # q is on the fp8 grid and equals torch's own float8 conversion of the exact scaled value
    v = (x.reshape(tokens, groups, size) / s.unsqueeze(-1)).reshape(x.shape)
    torch.testing.assert_close(q, v.to(torch.float8_e4m3fn).to(F64), rtol=0, atol=0)
    # dequantized values sit within half an fp8 ulp (times the scale) of the input
    deq = (qg * s.unsqueeze(-1)).reshape(x.shape)
    bound = 0.5 * _e4m3_ulp(q) * s.repeat_interleave(size, dim=1)
    assert ((deq - x).abs() <= bound * (1 + 1e-12)).all()


def test_per_token_group_quant_zero_group_and_ties():
    mod = load_reference("per_token_group_quant")
    x = torch.zeros(1, 256, dtype=F64)
    x[0, 128] = -448.0  # amax 448: the second group's scale is exactly 1
    x[0, 129] = 25.0  # a tie between 24 and 26 (spacing 2 in [16, 32)): nearest even -> 24
    out = mod.reference({"input": x, "output_s": torch.empty(1, 2)}, {})
    assert out["output_s"][0, 0].item() == pytest.approx(1e-10 / 448.0, rel=1e-15)
    assert out["output_s"][0, 1].item() == 1.0
    assert torch.count_nonzero(out["output_q"][0, :128]) == 0
    assert out["output_q"][0, 128].item() == -448.0
    assert out["output_q"][0, 129].item() == 24.0
    grid = mod.round_to_e4m3(torch.tensor([0.0009765625, 0.0029296875, 464.0, 1000.0, -17.0], dtype=F64))
    # 2^-10 is half the smallest subnormal (2^-9): tie -> 0; 1.5 * 2^-9: tie -> 2 * 2^-9 (even);
    # 464 = 14.5 steps of 32: tie -> 448; 1000 saturates to 448; -17 ties between 16 and 18 -> -16
    assert grid.tolist() == [0.0, 2.0 ** -8, 448.0, 448.0, -16.0]


# ---------------------------------------------------------------------------------------------
# store_cache


def test_store_cache_writes_exactly_the_indexed_rows(gen):
    ref = load_reference("store_cache").reference
    tokens, slots, row = 6, 32, 16
    k, v = randn(gen, tokens, row), randn(gen, tokens, row)
    k_cache, v_cache = randn(gen, slots, row), randn(gen, slots, row)
    idx = torch.tensor([7, 0, 31, 3, 12, 20])  # includes the reserved slot 0
    args = {"k": k, "v": v, "k_cache": k_cache.clone(), "v_cache": v_cache.clone(), "indices": idx,
            "size_limit": slots, "reserved_skip_index": 0}
    out = ref(args, {})
    written = [i for i in idx.tolist() if i != 0]
    untouched = [i for i in range(slots) if i not in written]
    for t, slot in enumerate(idx.tolist()):
        if slot != 0:
            assert torch.equal(out["k_cache"][slot], k[t]) and torch.equal(out["v_cache"][slot], v[t])
    assert torch.equal(out["k_cache"][untouched], k_cache[untouched])  # slot 0 skipped, others kept
    assert torch.equal(out["v_cache"][untouched], v_cache[untouched])
    assert torch.equal(args["k_cache"], k_cache)  # the reference works on copies
    # indices arriving upcast to float64, and skipping disabled with -1
    out2 = ref({**args, "indices": idx.to(F64), "reserved_skip_index": -1}, {})
    assert torch.equal(out2["k_cache"][0], k[1]) and torch.equal(out2["v_cache"][31], v[2])


# ---------------------------------------------------------------------------------------------
# template arguments encoded as expressions


def _kvcache_threads_heuristic(k_row: int, v_row: int) -> int:
    """SGLang 0.5.23's num_split=0 choice, restated: 32 threads unless both rows split evenly into
    32; then double while each thread's share of both rows is a multiple of 8 bytes and K+V keep at
    least 64 bytes per thread."""
    threads = 32
    if k_row % 32 or v_row % 32:
        return threads
    kb, vb = k_row / 32, v_row / 32
    while kb % 8 == 0 and vb % 8 == 0 and kb + vb >= 64:
        threads, kb, vb = threads * 2, kb / 2, vb / 2
    return threads


def test_store_cache_num_threads_expression_matches_loader_heuristic():
    derived = raw_spec("store_cache")["derived"]
    for head_dim in (8, 24, 64, 72, 80, 96, 128, 192, 256, 576):
        for heads in (1, 2, 3, 4, 8, 16, 32, 64, 128):
            for dtype in ("bfloat16", "float8_e4m3fn"):
                names = {"kv_heads": heads, "head_dim": head_dim, "dtype": dtype, "tokens": 1}
                for key, expr in derived.items():
                    names[key] = evaluate(expr, names)
                row = names["row_bytes"]
                assert names["num_threads"] == _kvcache_threads_heuristic(row, row), (heads, head_dim, dtype)
    entry = raw_spec("store_cache")["build"]["wrappers"][0]["entry"]
    names = {"kv_heads": 8, "head_dim": 128, "dtype": "bfloat16", "tokens": 1}
    for key, expr in derived.items():
        names[key] = evaluate(expr, names)
    assert render(entry, names) == "StoreKVCacheKernel<2048, 2048, 128, true>::run"


def _rmsnorm_class(hidden: int) -> str:
    if hidden <= 256:
        return "RMSNormWarpKernel"
    if hidden == 512 or (hidden >= 2048 and hidden % 512 == 0):
        return "RMSNormHalfKernel"
    return "RMSNormKernel"


def test_rmsnorm_kernel_class_expression():
    raw = raw_spec("rmsnorm")
    entry = raw["build"]["wrappers"][0]["entry"]
    legal = [64, 128, 256] + list(range(512, 8193, 256)) + list(range(8704, 16385, 512))
    for hidden in legal:
        names = {"hidden": hidden, "dtype": "bfloat16", "tokens": 1}
        assert all(evaluate(c, names) for c in raw["shapes"]["constraints"]), hidden
        assert render(entry, names) == f"{_rmsnorm_class(hidden)}<{hidden}, true, bf16_t>::run"
    for hidden in (32, 192, 384, 8448, 16896):
        names = {"hidden": hidden, "dtype": "bfloat16", "tokens": 1}
        assert not all(evaluate(c, names) for c in raw["shapes"]["constraints"]), hidden


# ---------------------------------------------------------------------------------------------
# spec structure


@pytest.mark.parametrize("name", NAMES)
def test_spec_has_required_fields_and_reference_covers_outputs(name):
    raw = raw_spec(name)
    missing = [k for k in REQUIRED if k not in raw]
    assert not missing, f"{name}: missing {missing}"
    assert raw["name"] == name
    assert raw["signature"] is None
    assert raw["reference"] == "reference.py"
    src = raw["source"]
    assert src["sglang_version"] == "0.5.23"
    assert src["repo_path"] == "python/sglang/kernels/jit/csrc/" + src["kernel_file"]
    assert len(src["sha256"]) == 64 and ":" in src["loader"]
    assert raw["entry"] in [w["export"] for w in raw["build"]["wrappers"]]
    assert src["kernel_file"] in raw["build"]["cuda_files"]
    for dtype in raw["dtypes"]:
        assert {"atol", "rtol", "floor"} <= set(raw["tolerance"][dtype])

    # run the reference on the smallest edge shape, inputs built from the spec's own shapes
    edge = min(raw["shapes"]["edge"], key=lambda d: math.prod(d.values()))
    names = {**edge, "dtype": raw["dtypes"][0]}
    for key, expr in (raw.get("derived") or {}).items():
        names[key] = evaluate(expr, names)
    assert all(evaluate(c, names) for c in raw["shapes"].get("constraints", []))
    g = torch.Generator()
    g.manual_seed(0)
    args, outputs = {}, {}
    for a in raw["arguments"]:
        if a["kind"] != "tensor":
            args[a["name"]] = a["value"]
            continue
        shape = [int(evaluate(e, names)) for e in a["shape"]]
        if a["init"]["dist"] == "perm":
            args[a["name"]] = torch.randperm(int(evaluate(a["init"]["high"], names)), generator=g)[: math.prod(shape)]
        else:
            args[a["name"]] = torch.randn(*shape, generator=g, dtype=F64)
        if a["role"] in ("out", "inout"):
            outputs[a["name"]] = shape
    result = load_reference(name).reference(args, edge)
    assert set(result) == set(outputs)
    for key, shape in outputs.items():
        assert list(result[key].shape) == shape and result[key].dtype == F64
        assert torch.isfinite(result[key]).all()


def test_specs_pass_the_validator():
    spec = pytest.importorskip("astra.spec.model")
    for name in NAMES:
        loaded = spec.load(SPECS / name / "kernel.yaml")
        assert loaded.shape_cases(), name


@pytest.mark.network
@pytest.mark.parametrize("name", NAMES)
def test_source_sha256_matches_sglang_wheel(name, sglang_0523):
    src = raw_spec(name)["source"]
    path = sglang_0523.csrc_dir / src["kernel_file"]
    assert hashlib.sha256(path.read_bytes()).hexdigest() == src["sha256"]
    assert sglang_0523.repo_path(path) == src["repo_path"]
