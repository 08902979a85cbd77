"""The parts of evaluation that need no GPU: per-case checks with Python stand-in kernels on the CPU,
aggregation (band geomeans, slower shapes, faster, status), suspect flags, verdict JSON, build requests."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import torch

from harness.building.job_requests import build_requests
from harness.job import ArgSpec, BuildBase, Case, Job, Options, Variant
from harness.judge.acceptance import VIEW_FLOOR, slower_shapes, verified_faster
from harness.judge.both_sides import check_case
from harness.judge.correctness import OriginalFailed, ReferenceFailed, deterministic
from harness.judge.evaluate import default_cache_dir
from harness.judge.verdict import CaseResult, ModeTiming, Verdict, band_speedups, decide
from harness.timing.modes import sets_needed
from harness.timing.perf_model import PerfModel
from harness.timing.roofline import floors, suspect
from harness.timing.stats import Stats

# ---------------------------------------------------------------- a y = x * alpha + b job on the CPU


def _case(tokens: int = 4, hidden: int = 32, dtype: str = "float32") -> Case:
    return Case(
        id=f"toy/{dtype}/tokens={tokens},hidden={hidden}", band="decode", label="toy", dtype=dtype,
        dims={"tokens": tokens, "hidden": hidden}, variant="v", bytes=3 * tokens * hidden * 4,
        args=[ArgSpec("y", "tensor", "out", [tokens, hidden], dtype),
              ArgSpec("x", "tensor", "in", [tokens, hidden], dtype),
              ArgSpec("b", "tensor", "in", [hidden], dtype),
              ArgSpec("acc", "tensor", "inout", [tokens, hidden], dtype),
              ArgSpec("alpha", "scalar", "in", [], "float32", value=0.5)])


def _job(**kw) -> Job:
    base = BuildBase(source_root="/src", include_dirs=["/inc"], cuda_files=["toy.cuh"])
    return Job(name="toy", entry="toy", kernel_file="toy.cuh", build=base,
               variants={"v": Variant("v", [["toy", "Toy<float>::run"]], extra_cuda_cflags=["-DX=1"])},
               cases=[_case()], tolerance={"float32": {"atol": 1e-5, "rtol": 1e-5, "floor": 1e-6}}, **kw)


def good(args):
    y, x, b, acc, alpha = args
    y.copy_(x * alpha + b)
    acc.add_(y)


def test_original_against_itself_is_correct_and_deterministic():
    result = check_case(_case(), {"orig": good, "cand": good}, _job(), "cpu")
    assert result.correct, result.reasons
    assert result.trials == 6  # three seeds, the large, the small and the extreme trial
    assert set(result.checks) == {"y", "acc"}
    assert result.deterministic_orig and result.deterministic_cand


def test_wrong_values_fail():
    def wrong(args):
        good(args)
        args[0][0, 0] += 1.0
    result = check_case(_case(), {"orig": good, "cand": wrong}, _job(), "cpu")
    assert not result.correct and "y" in result.reasons[0] and result.checks["y"]["mismatches"] == 1


def test_unwritten_output_is_caught_by_the_poison():
    def lazy(args):
        y, x, b, acc, alpha = args
        y[:-1].copy_(x[:-1] * alpha + b)
        acc.add_(x * alpha + b)
    result = check_case(_case(), {"orig": good, "cand": lazy}, _job(), "cpu")
    assert not result.correct and result.checks["y"]["nonfinite_mismatches"] == 32


def test_forgotten_inplace_update_fails():
    def no_acc(args):
        args[0].copy_(args[1] * args[4] + args[2])
    result = check_case(_case(), {"orig": good, "cand": no_acc}, _job(), "cpu")
    assert not result.correct and any("acc" in r for r in result.reasons)


def test_writing_a_read_only_input_fails():
    def scribbler(args):
        good(args)
        args[1].mul_(1.0000001).add_(1e-3)
    result = check_case(_case(), {"orig": good, "cand": scribbler}, _job(), "cpu")
    assert not result.correct and any("read-only argument x" in r for r in result.reasons)


def test_candidate_that_raises_fails_and_original_that_raises_fails_closed():
    def boom(args):
        raise RuntimeError("launch failed: too many resources requested")
    result = check_case(_case(), {"orig": good, "cand": boom}, _job(), "cpu")
    assert not result.correct and "too many resources" in result.reasons[0]
    with pytest.raises(OriginalFailed, match="the original raised RuntimeError: launch failed"):
        check_case(_case(), {"orig": boom, "cand": good}, _job(), "cpu")


def test_reference_that_raises_fails_closed():
    def broken(args, dims):
        raise KeyError("acc")
    with pytest.raises(ReferenceFailed, match="reference.py raised KeyError"):
        check_case(_case(), {"orig": good, "cand": good}, _job(), "cpu", reference=broken)


def test_trials_include_small_and_extreme_magnitudes():
    from harness.judge.correctness import trials_for
    from harness.judge.inputs import make_inputs

    assert [kind for kind, _ in trials_for(_case(), [0, 1])] == ["seed", "seed", "large", "small", "extreme"]
    assert len({seed for _, seed in trials_for(_case(), [0, 1])}) == 5
    small = make_inputs(_case(), 7, "cpu", trial="small")["x"]
    assert 0 < small.abs().max() < 1e-3
    for dtype, tiny in (("float32", torch.finfo(torch.float32).tiny), ("bfloat16", torch.finfo(torch.bfloat16).tiny)):
        x = make_inputs(_case(dtype=dtype), 7, "cpu", trial="extreme")["x"].float()
        assert ((x != 0) & (x.abs() < tiny)).any()  # subnormals
        assert x.isfinite().all()
    half = make_inputs(_case(dtype="float16"), 7, "cpu", trial="extreme")["x"].float()
    assert half.abs().max() > 1e4 and half.isfinite().all()  # near float16's overflow
    ints = Case(id="i", band="decode", label="t", dtype="int32", dims={}, variant="v", bytes=4,
                args=[ArgSpec("i", "tensor", "in", [4], "int32", {"dist": "randint", "low": 0, "high": 9})])
    assert trials_for(ints, [0]) == [("seed", 0)]
    assert trials_for(_case(), [0], extra=False) == [("seed", 0)]  # astra bench: the original against itself


def _jitter():
    state = {"calls": 0}

    def jitter(args):
        good(args)
        state["calls"] += 1
        args[0].add_(1e-7 * (state["calls"] % 2))  # within tolerance, not bitwise stable
    return jitter


def test_nondeterminism_where_the_original_is_deterministic_fails():
    job = _job()
    job.tolerance = {"float32": {"atol": 1e-5, "rtol": 1e-5, "floor": 1e-6}}
    result = check_case(_case(), {"orig": good, "cand": _jitter()}, job, "cpu")
    assert not result.correct and result.checks["y"]["ok"]  # every value within tolerance, yet
    assert result.deterministic_orig is True and result.deterministic_cand is False
    assert result.reasons == ["the candidate is not deterministic: two runs on identical inputs gave different "
                              "outputs, where the original's are bit-identical"]
    assert deterministic(good, _case(), 0, torch.device("cpu")) is True


def test_nondeterminism_where_the_original_is_not_deterministic_too_is_reported_not_failed():
    job = _job()
    job.tolerance = {"float32": {"atol": 1e-5, "rtol": 1e-5, "floor": 1e-6}}
    result = check_case(_case(), {"orig": _jitter(), "cand": _jitter()}, job, "cpu")
    assert result.correct, result.reasons
    assert result.deterministic_orig is False and result.deterministic_cand is False


def _reference(args, dims):
    y = args["x"] * args["alpha"] + args["b"]
    return {"y": y, "acc": args["acc"] + y}


def test_reference_rule_two_times_original_error_or_floor():
    case = _case(dtype="bfloat16")
    job = _job()
    job.tolerance = {"bfloat16": {"atol": 1e-6, "rtol": 1e-6, "floor": 1e-4}}  # too tight vs the original

    def f32_math(args):  # more accurate than the bf16 original: differs from it, but passes vs the reference
        y, x, b, acc, alpha = args
        exact = x.float() * alpha + b.float()
        y.copy_(exact.to(y.dtype))
        acc.copy_((acc.float() + exact).to(acc.dtype))

    def bf16_math(args):
        y, x, b, acc, alpha = args
        y.copy_(x * alpha + b)
        acc.add_(y)

    ok = check_case(case, {"orig": bf16_math, "cand": f32_math}, job, "cpu", reference=_reference)
    assert ok.correct, ok.reasons
    assert ok.checks["y"]["mismatches"] > 0 or ok.checks["acc"]["mismatches"] > 0  # differs from the original
    assert ok.reference["y"]["cand"] <= ok.reference["y"]["orig"] + 1e-12

    def sloppy(args):
        bf16_math(args)
        args[0].mul_(1.05)
    bad = check_case(case, {"orig": bf16_math, "cand": sloppy}, job, "cpu", reference=_reference)
    assert not bad.correct and "reference" in bad.reasons[0]


# ---------------------------------------------------------------- aggregation and flags


def _timed(case_id: str, band: str, speedups: dict[str, float], timed: bool = True) -> CaseResult:
    result = CaseResult(id=case_id, band=band, label="m", dtype="bfloat16", dims={}, timed=timed, bytes=1 << 20)
    for mode, value in speedups.items():
        result.timings[mode] = ModeTiming(orig=Stats(10.0 * value, 9.0, 11.0, 20, 0.005),
                                          cand=Stats(10.0, 9.0, 11.0, 20, 0.005), speedup=value)
    return result


def test_band_geomeans_per_mode_never_mixed():
    cases = [_timed("a", "decode", {"graph": 1.0, "cold": 2.0}), _timed("b", "decode", {"graph": 4.0, "cold": 2.0}),
             _timed("c", "prefill", {"graph": 1.1, "cold": 0.9}), _timed("d", "decode", {"graph": 100.0}, timed=False)]
    bands = band_speedups(cases, ["graph", "cold"])
    assert bands["graph"]["decode"] == pytest.approx(2.0)
    assert bands["graph"]["prefill"] == pytest.approx(1.1)
    assert bands["graph"]["all"] == pytest.approx((1.0 * 4.0 * 1.1) ** (1 / 3))
    assert bands["cold"]["decode"] == pytest.approx(2.0)
    assert "middle" not in bands["graph"]
    assert band_speedups([], ["graph"]) == {}


def test_slower_shapes_and_faster():
    cases = [_timed("a", "decode", {"graph": 1.2, "cold": 1.01}), _timed("b", "middle", {"graph": 0.97, "cold": 1.3}),
             _timed("c", "prefill", {"graph": 0.99})]
    slower = slower_shapes(cases, threshold=0.02)
    assert slower == [{"id": "b", "mode": "graph", "speedup": 0.97}]
    assert decide(cases, ["graph", "cold"], 0.02).faster is False
    fast = [_timed("a", "decode", {"graph": 1.2, "cold": 1.01}), _timed("c", "prefill", {"graph": 0.99})]
    assert decide(fast, ["graph", "cold"], 0.02).faster is True
    noisy = _timed("n", "decode", {"graph": 0.97})
    noisy.timings["graph"].ratio_rel_stderr = 0.012  # 3 sigma = 3.6%: a 3% slowdown is noise
    assert slower_shapes([noisy], 0.02) == []
    noisy.timings["graph"].ratio_rel_stderr = 0.005
    assert slower_shapes([noisy], 0.02) == [{"id": "n", "mode": "graph", "speedup": 0.97}]
    # the cold view resolves VIEW_FLOOR["cold"] between two processes, whatever one run's standard error says
    precise = _timed("p", "decode", {"cold": 0.97})
    precise.timings["cold"].ratio_rel_stderr = 0.001
    assert slower_shapes([precise], 0.02) == []
    precise.timings["cold"].speedup = 1.0 - VIEW_FLOOR["cold"] - 0.01
    assert slower_shapes([precise], 0.02) == [{"id": "p", "mode": "cold", "speedup": precise.timings["cold"].speedup}]
    cold_only = [_timed("a", "decode", {"graph": 1.0, "cold": 1.0 + VIEW_FLOOR["cold"] - 0.01})]
    assert decide(cold_only, ["graph", "cold"], 0.02).faster is False
    cold_only = [_timed("a", "decode", {"graph": 1.0, "cold": 1.0 + VIEW_FLOOR["cold"] + 0.01})]
    assert decide(cold_only, ["graph", "cold"], 0.02).faster is True
    same = [_timed("a", "decode", {"graph": 1.0})]
    assert decide(same, ["graph"], 0.02).faster is False
    assert not verified_faster(decide(same, ["graph"], 0.02)).ok
    assert decide([_timed("a", "decode", {})], ["graph"], 0.02).faster is None


def test_decide_statuses():
    good_cases = [_timed("a", "decode", {"graph": 1.5})]
    verdict = decide(good_cases, ["graph"], 0.02)
    assert verdict.status == "correct" and verdict.correct and verdict.faster and "1.500x" in verdict.reason
    failing = [_timed("a", "decode", {}), _timed("b", "decode", {})]
    failing[0].fail("seed 0: y: 3 of 8 elements outside")
    failing[1].fail("x")
    verdict = decide(failing, ["graph"], 0.02)
    assert verdict.status == "incorrect" and not verdict.correct and verdict.faster is False
    assert verdict.reason.startswith("a: seed 0") and "1 more" in verdict.reason
    sus = [_timed("a", "decode", {"graph": 80.0})]
    sus[0].suspect.append("graph: speedup 80.0x exceeds the plausible 50x")
    assert decide(sus, ["graph"], 0.02).status == "suspect"


def test_suspect_flags():
    model = PerfModel(read_Bps=2.9e12, write_Bps=2.9e12, copy_Bps=2.8e12, launch_graph_us=0.84, launch_cold_us=3.0,
                      peak_dram_Bps=3.0e12, l2_bytes=50 << 20)
    nbytes = 300_000_000  # 100 us at the 3 TB/s peak (cold: every read crosses DRAM)
    floor = floors("cold", nbytes // 2, nbytes // 2, model)
    assert floor["physical_us"] == pytest.approx((nbytes - (50 << 20)) / 3.0e12 * 1e6)
    assert suspect(1.5, 120.0, floor, nbytes) is None
    assert "physical floor" in suspect(3.0, 50.0, floor, nbytes)
    tiny = floors("graph", 500, 500, model)
    assert "empty launch" in suspect(1.5, 0.5, tiny, 1000)
    assert suspect(1.5, 0.9, tiny, 1000) is None
    assert "plausible" in suspect(60.0, 2.0, tiny, 1000)


def test_verdict_json_round_trip():
    case = _timed("a", "decode", {"graph": 1.25})
    case.checks["y"] = {"ok": True, "max_abs": 0.0}
    case.timings["graph"].orig = Stats(5.0, 4.0, 6.0, 1, math.inf)
    verdict = decide([case], ["graph"], 0.02)
    verdict.env = {"gpu": "NVIDIA H100", "copy_bandwidth_Bps": 3.0e12}
    text = verdict.to_json()
    data = json.loads(text)
    assert data["cases"][0]["timings"]["graph"]["orig"]["rel_stderr"] is None
    back = Verdict.from_json(text)
    assert back.cases[0].timings["graph"].cand == case.timings["graph"].cand
    assert back.cases[0].timings["graph"].orig.rel_stderr == math.inf
    assert back.band_speedups == verdict.band_speedups and back.status == verdict.status
    data["worker"] = {"seconds": 1.0}
    data["unknown_key"] = 1
    assert Verdict.from_dict(data).worker == {"seconds": 1.0}
    with pytest.raises(ValueError):
        Verdict(status="great", reason="", correct=True)
    minimal = Verdict(status="timeout", reason="killed after 60 s", correct=False, faster=False).to_dict()
    assert Verdict.from_dict(minimal).status == "timeout"


def test_sets_needed_reaches_three_times_l2():
    l2 = 50 * 2**20
    assert sets_needed(24 * 1024, l2) * 24 * 1024 >= 3 * l2
    assert sets_needed(1 << 30, l2) == 1
    assert sets_needed(0, l2) == 1
    assert sets_needed(1, l2, cap=100) == 100


def test_build_requests_original_and_candidate(tmp_path: Path):
    job = _job(candidate_source="// new kernel\n")
    requests = build_requests(job)
    assert [(side, key) for side, key, _ in requests] == [("orig", "v"), ("cand", "v")]
    orig, cand = requests[0][2], requests[1][2]
    assert orig.overrides == {} and cand.overrides == {"toy.cuh": "// new kernel\n"}
    assert orig.cuda_wrappers == [("toy", "Toy<float>::run")] and orig.extra_cuda_cflags == ["-DX=1"]
    assert orig.name != cand.name
    assert [side for side, _, _ in build_requests(_job())] == ["orig"]  # self-check builds once
    job.options = Options(cache_dir=str(tmp_path))
    assert default_cache_dir(job) == tmp_path
    assert default_cache_dir(_job()).name == "builds"


def _inplace_case() -> Case:
    """out aliases x (an in-place call, as SGLang's rmsnorm does by default): x is compared as inout."""
    return Case(id="inplace", band="decode", label="toy", dtype="float32", dims={"tokens": 4, "hidden": 32},
                variant="v", bytes=1024,
                args=[ArgSpec("x", "tensor", "inout", [4, 32], "float32"),
                      ArgSpec("out", "tensor", "alias", [4, 32], "float32", alias="x")])


def test_aliased_output_is_the_same_tensor_and_inplace_hazards_are_caught():
    def scale(args):  # correct in place: reads everything before it writes
        x, out = args
        assert x is out
        out.copy_(x * 2)

    def hazard(args):  # correct out of place, wrong in place: clears its output (= its input) first
        x, out = args
        out.zero_()
        out.add_(x * 2)

    assert check_case(_inplace_case(), {"orig": scale, "cand": scale}, _job(), "cpu").correct
    result = check_case(_inplace_case(), {"orig": scale, "cand": hazard}, _job(), "cpu")
    assert not result.correct and "x" in result.reasons[0]


def test_clone_keeps_aliases_and_bytes_count_once():
    from harness.judge.inputs import clone_inputs, make_inputs, set_bytes

    inputs = make_inputs(_inplace_case(), 0, "cpu")
    assert inputs["x"] is inputs["out"]
    copy = clone_inputs(inputs)
    assert copy["x"] is copy["out"] and copy["x"] is not inputs["x"]
    assert set_bytes(inputs) == 4 * 32 * 4


# ---------------------------------------------------------------- time-only: the original against itself, unchecked


def test_a_candidate_is_never_timed_unchecked():
    from harness.judge.evaluate import evaluate

    job = _job(candidate_source="// a candidate", options=Options(outputs_checked=False))
    with pytest.raises(ValueError, match="never timed without its outputs checked"):
        evaluate(job, device="cpu")


def test_the_original_timed_unchecked_reads_timed_not_correct():
    from harness.judge.evaluate import UNCHECKED_NOTE, _timing_phase, _unchecked

    job = _job(options=Options(outputs_checked=False, modes=["graph"]))
    results = _unchecked(job)
    assert [r.notes for r in results] == [[UNCHECKED_NOTE]] and results[0].trials == 0 and not results[0].checks
    verdict = _timing_phase(job, torch.device("cpu"), ["v"], {}, None, results, {}, {}, {}, {})
    assert verdict.status == "timed" and verdict.faster is None and verdict.correct is False  # not established
    assert UNCHECKED_NOTE in verdict.reason
    assert verdict.reason.startswith("timed on 1 cases") and UNCHECKED_NOTE in verdict.notes
    assert Verdict(status="timed", reason="r", correct=True).status == "timed"  # a status a verdict may carry
    checked = _timing_phase(_job(options=Options(modes=["graph"])), torch.device("cpu"), ["v"], {}, None,
                            [CaseResult(**{k: getattr(results[0], k) for k in ("id", "band", "label", "dtype", "dims",
                                                                               "timed", "bytes")})], {}, {}, {}, {})
    assert checked.status == "correct"
