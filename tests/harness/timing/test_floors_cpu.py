"""Floors and the suspect rule without a GPU: the arithmetic of harness.timing.roofline on an H100's numbers, the
judge applying it to recorded timings, the split of a case's bytes, and the performance model's cache
(harness.timing.perf_model) with an injected measurement. One `gpu` test measures the model for real."""

from __future__ import annotations

import json

import pytest

from harness.job import ArgSpec, BuildBase, Case, Job, dtype_size, role_bytes, split_bytes
from harness.judge.timings import apply_mode, rotation_sets
from harness.judge.verdict import CaseResult, Verdict
from harness.timing import perf_model
from harness.timing.perf_model import PerfModel
from harness.timing.roofline import dram_bytes, floors

MiB = 1 << 20
# An H100 SXM as DESIGN.md measured it: HBM3 peak 3.35 TB/s, copy 2.80-2.94 TB/s, empty graph launch 0.84 us.
H100 = PerfModel(read_Bps=3.05e12, write_Bps=2.95e12, copy_Bps=2.85e12, launch_graph_us=0.84, launch_cold_us=2.4,
                 peak_dram_Bps=3.35e12, peak_source="test", l2_bytes=50 * MiB)


def _stats(us: float) -> dict:
    return {"median_us": us, "p10_us": us * 0.98, "p90_us": us * 1.02, "n": 50, "rel_stderr": 0.005}


def _tensor(name: str, role: str, shape: list[int], dtype: str = "bfloat16", **kw) -> ArgSpec:
    return ArgSpec(name, "tensor", role, shape, dtype, **kw)


def silu_and_mul(tokens: int, d: int) -> Case:
    return Case(id=f"silu/tokens={tokens},d={d}", band="middle", label="t", dtype="bfloat16",
                dims={"tokens": tokens, "d": d}, variant="v", bytes=3 * tokens * d * 2,
                args=[_tensor("out", "out", [tokens, d]), _tensor("input", "in", [tokens, 2 * d])])


def store_cache(tokens: int, row_elems: int, slots: int = 32768) -> Case:
    row = row_elems * 2
    return Case(id=f"store_cache/tokens={tokens}", band="middle", label="t", dtype="bfloat16", dims={"tokens": tokens},
                variant="v", bytes=4 * tokens * row + 8 * tokens,
                args=[_tensor("k", "in", [tokens, row_elems]), _tensor("v", "in", [tokens, row_elems]),
                      _tensor("k_cache", "inout", [slots, row_elems]), _tensor("v_cache", "inout", [slots, row_elems]),
                      _tensor("indices", "in", [tokens], "int64")])


def _judge(case: Case, view: str, orig_us: float, cand_us: float, model: PerfModel = H100) -> CaseResult:
    result = CaseResult(id=case.id, band=case.band, label=case.label, dtype=case.dtype, dims=case.dims, timed=True,
                        bytes=case.bytes)
    env = {"perf_model": model.to_dict()}
    assert apply_mode(result, view, {"orig": _stats(orig_us), "cand": _stats(cand_us)}, env, case) is None
    return result


# ---------------------------------------------------------------- the arithmetic


def test_physical_and_practical_floors():
    read, written = 200 * MiB, 100 * MiB
    cold = floors("cold", read, written, H100)
    assert cold["dram_bytes"] == read + written - 50 * MiB  # writes up to L2 may stay dirty after the end event
    assert cold["physical_us"] == pytest.approx(cold["dram_bytes"] / 3.35e12 * 1e6)
    assert cold["practical_us"] == pytest.approx((read / 3.05e12 + written / 2.95e12) * 1e6)
    graph = floors("graph", read, written, H100, sets=1, in_place=False)
    assert graph["dram_bytes"] == read + written - 50 * MiB and graph["peak_Bps"] == 3.35e12
    assert dram_bytes("graph", read, written, l2_bytes=50 * MiB, sets=1, in_place=True) == read + written - 100 * MiB
    assert dram_bytes("graph", read, written, l2_bytes=50 * MiB, sets=8, in_place=True) == read + written - 100 * MiB // 8
    assert dram_bytes("graph", 4 * MiB, 4 * MiB, l2_bytes=50 * MiB, sets=2) == 0  # the whole cycle fits in L2
    tiny = floors("graph", 1000, 1000, H100, sets=16384)
    assert tiny["physical_us"] == tiny["practical_us"] == 0.84  # never below an empty launch of the view
    assert floors("cold", 1000, 1000, H100)["physical_us"] == 2.4
    assert floors("cold", read, written, H100)["practical_us"] >= floors("cold", read, written, H100)["physical_us"]


def test_peak_unknown_falls_back_to_measured_and_says_so():
    model = PerfModel(read_Bps=3.0e12, write_Bps=2.9e12, copy_Bps=2.8e12, launch_graph_us=0.8, launch_cold_us=2.0)
    assert model.floor_Bps == pytest.approx(1.10 * 3.0e12) and "peak is unknown" in model.floor_source
    above = PerfModel(**{**model.__dict__, "peak_dram_Bps": 2.5e12})
    assert above.floor_Bps == 3.0e12 and "above" in above.floor_source
    assert H100.floor_Bps == 3.35e12 and H100.floor_source == "device peak"
    legacy = PerfModel.from_env({"copy_bandwidth_Bps": 2.8e12, "launch_floor_us": 0.8, "cold_launch_floor_us": 2.0})
    assert legacy.read_Bps == legacy.write_Bps == 2.8e12 and legacy.peak_dram_Bps is None and legacy.cache == "legacy env"


# ---------------------------------------------------------------- the suspect rule on SGLang's own kernels


def test_kernels_that_read_more_than_they_write_are_not_suspect():
    """DESIGN.md's H100 numbers that the copy-rate 'floor' flagged: originals, timed against themselves."""
    silu = silu_and_mul(1024, 14336)  # reads 2x what it writes
    assert silu.bytes / 2.85e12 * 1e6 * 0.9 > 27.8  # under the old copy-rate rule this was suspect
    result = _judge(silu, "cold", 27.8, 27.8)
    assert result.suspect == [] and result.floors["cold"]["cand_x_practical"] < 1.05
    quant = Case(id="quant", band="prefill", label="t", dtype="bfloat16", dims={}, variant="v",
                 bytes=16384 * 2304 * 3 + 16384 * 18 * 4,
                 args=[_tensor("x", "in", [16384, 2304]), _tensor("q", "out", [16384, 2304], "float8_e4m3fn"),
                       _tensor("s", "out", [16384, 18], "float32")])
    assert _judge(quant, "cold", 35.9, 35.9).suspect == []
    cache = store_cache(1024, 8 * 128)  # Llama-3.1-8B tp1: 2048-byte rows into 64 MiB caches
    assert rotation_sets(cache, 50 * MiB) == 2  # 8 MiB touched per launch, 16 MiB per cycle: L2-resident
    result = _judge(cache, "graph", 2.08, 2.08)
    assert result.suspect == [] and result.floors["graph"]["physical_us"] == 0.84


def test_a_candidate_doing_half_the_work_is_suspect():
    silu = silu_and_mul(1024, 14336)
    result = _judge(silu, "cold", 27.8, 27.8 / 2)
    assert result.suspect and "cold: candidate 13.9 us is under the physical floor" in result.suspect[0]
    assert "3.35 TB/s" in result.suspect[0] and str(silu.bytes) in result.suspect[0]
    big = silu_and_mul(16384, 14336)  # 1.4 GB: graph mode rotates a single set through L2
    orig_us = big.bytes / 3.0e12 * 1e6
    assert _judge(big, "graph", orig_us, orig_us).suspect == []
    assert _judge(big, "graph", orig_us, orig_us / 2).suspect
    assert _judge(big, "cold", orig_us, orig_us / 2).suspect


def test_times_under_an_empty_launch_are_suspect_in_either_view():
    tiny = silu_and_mul(1, 16)
    assert _judge(tiny, "graph", 1.2, 0.9).suspect == []
    assert "empty launch" in _judge(tiny, "graph", 1.2, 0.6).suspect[0]
    assert "empty launch" in _judge(tiny, "cold", 3.0, 1.5).suspect[0]


def test_the_verdict_carries_floors_per_view():
    silu = silu_and_mul(1024, 14336)
    result = _judge(silu, "graph", 30.0, 25.0)
    _judge(silu, "cold", 32.0, 27.0)
    entry = result.floors["graph"]
    assert {"physical_us", "practical_us", "orig_us", "cand_us", "orig_x_practical", "cand_x_practical"} <= set(entry)
    assert entry["orig_us"] == 30.0 and entry["cand_x_practical"] == pytest.approx(25.0 / entry["practical_us"])
    assert result.roofline["graph"]["floor_us"] == entry["practical_us"]
    assert result.roofline["graph"]["cand_fraction"] == pytest.approx(entry["practical_us"] / 25.0)
    verdict = Verdict(status="correct", reason="", correct=True, cases=[result], env={"perf_model": H100.to_dict()})
    data = json.loads(verdict.to_json())
    assert data["cases"][0]["floors"]["graph"]["practical_us"] == entry["practical_us"]
    assert data["env"]["perf_model"]["peak_dram_Bps"] == 3.35e12 and data["env"]["perf_model"]["floor_source"]
    assert Verdict.from_json(verdict.to_json()).cases[0].floors == result.floors


# ---------------------------------------------------------------- bytes read and written


def test_split_by_roles():
    args = [_tensor("x", "in", [4, 8]), _tensor("y", "out", [4, 8], "float32"), _tensor("r", "inout", [4, 8]),
            _tensor("ws", "scratch", [1000]), _tensor("opt", "in", [], present=False),
            ArgSpec("eps", "scalar", "in", value=1e-6)]
    assert role_bytes(args) == (64 + 64, 128 + 64)
    assert split_bytes(320, args) == (128, 192, "roles")
    read, written, how = split_bytes(160, args)
    assert (read, written) == (64, 96) and "scaled" in how and "less than the 320" in how
    assert split_bytes(10, [ArgSpec("n", "scalar", "in", value=1)]) == (5, 5, "half/half (no tensor roles to split by)")
    in_place = [_tensor("x", "in", [4]), _tensor("x_out", "alias", [4], alias="x")]
    assert role_bytes(in_place) == (8, 8)
    assert [dtype_size(d) for d in ("torch.bfloat16", "uint64", "uint16", "complex64", "float4_e2m1fn_x2")] == [2, 8, 2, 8, 1]


def test_a_job_keeps_its_split_and_an_older_job_is_split_by_roles():
    case = silu_and_mul(2, 8)
    assert case.traffic() == (64, 32, "roles") and not case.in_place()
    case.bytes_read, case.bytes_written, case.bytes_split = 60, 36, "spec"
    assert case.traffic() == (60, 36, "spec")
    job = Job(name="j", entry="e", kernel_file="k.cuh", build=BuildBase("/", [], []), variants={}, cases=[case],
              tolerance={})
    data = json.loads(job.to_json())
    assert Job.from_dict(data).cases[0].traffic() == (60, 36, "spec")
    for key in ("bytes_read", "bytes_written", "bytes_split"):
        del data["cases"][0][key]
    assert Job.from_dict(data).cases[0].traffic() == (64, 32, "roles")


# ---------------------------------------------------------------- the cache


@pytest.fixture
def fresh_memory():
    perf_model.forget()
    yield
    perf_model.forget()


def _fake(calls: list, read: float = 3.0e12):
    def measure() -> PerfModel:
        calls.append(1)
        return PerfModel(read_Bps=read, write_Bps=2.9e12, copy_Bps=2.8e12, launch_graph_us=0.8, launch_cold_us=2.2)
    return measure


KEY = {"gpu": "NVIDIA H100 80GB HBM3", "uuid": "GPU-1234", "driver": "570.1", "torch": "2.11"}


def test_measured_once_then_read_from_disk(tmp_path, fresh_memory):
    calls: list = []
    first = perf_model.cached(KEY, tmp_path, _fake(calls), peak=3.35e12)
    assert calls == [1] and first.cache == "measured" and first.key == KEY
    assert perf_model.cached(KEY, tmp_path, _fake(calls)) is first and calls == [1]  # same process: memory
    perf_model.forget()
    again = perf_model.cached(KEY, tmp_path, _fake(calls), peak=3.35e12)
    assert calls == [1] and again.cache == "hit" and again.read_Bps == 3.0e12  # a new process: the file
    assert [p.name for p in tmp_path.iterdir()] == [perf_model.cache_path(tmp_path, KEY).name]
    perf_model.forget()
    other = perf_model.cached({**KEY, "driver": "580.2"}, tmp_path, _fake(calls))
    assert calls == [1, 1] and other.cache == "measured"  # another driver: its own file


@pytest.mark.parametrize("text", ["{not json", "[]", json.dumps({"version": 1, "read_Bps": -1.0}),
                                  json.dumps({"version": 99})])
def test_a_malformed_cache_is_measured_again(tmp_path, fresh_memory, text):
    calls: list = []
    perf_model.cache_path(tmp_path, KEY).write_text(text)
    model = perf_model.cached(KEY, tmp_path, _fake(calls))
    assert calls == [1] and model.cache.startswith("measured (cache file malformed")
    perf_model.forget()
    assert perf_model.cached(KEY, tmp_path, _fake(calls)).cache == "hit" and calls == [1]  # rewritten


def test_a_cache_for_another_key_or_over_the_peak_is_not_believed(tmp_path, fresh_memory):
    calls: list = []
    path = perf_model.cache_path(tmp_path, KEY)
    tampered = {**_fake([], read=9.0e12)().to_dict(), "key": KEY}
    path.write_text(json.dumps(tampered))
    model = perf_model.cached(KEY, tmp_path, _fake(calls), peak=3.35e12)
    assert calls == [1] and "over the device's peak" in model.cache and model.read_Bps == 3.0e12
    perf_model.forget()
    path.write_text(json.dumps({**tampered, "read_Bps": 3.0e12, "key": {**KEY, "uuid": "GPU-other"}}))
    assert "another GPU" in perf_model.cached(KEY, tmp_path, _fake(calls)).cache and calls == [1, 1]


def test_an_unwritable_cache_still_gives_the_model(tmp_path, fresh_memory):
    blocker = tmp_path / "file"
    blocker.write_text("")
    model = perf_model.cached(KEY, blocker / "sub", _fake([]))
    assert model.read_Bps == 3.0e12 and "not cached" in model.cache


# ---------------------------------------------------------------- on a GPU


@pytest.mark.gpu
def test_measure_the_model_on_the_gpu(tmp_path, fresh_memory):
    import torch

    device = torch.device("cuda", torch.cuda.current_device())
    model = perf_model.for_device(device, tmp_path)
    assert model.cache.startswith("measured") and model.key["gpu"] == torch.cuda.get_device_name(device)
    assert min(model.read_Bps, model.write_Bps, model.copy_Bps) > 0
    assert model.floor_Bps >= max(model.read_Bps, model.write_Bps, model.copy_Bps)
    if model.peak_dram_Bps is not None:
        assert model.peak_dram_Bps >= max(model.read_Bps, model.write_Bps, model.copy_Bps), model.to_dict()
    assert model.launch_graph_us > 0 and model.launch_cold_us > 0 and model.l2_bytes > 0
    perf_model.forget()
    assert perf_model.for_device(device, tmp_path).cache == "hit"
