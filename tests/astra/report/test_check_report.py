"""Formatting of verdicts (check/bench tables) and the baseline report, on verdicts built here."""

import json

from astra.report import baseline as report
from astra.report import text as check_cmd
from astra.verify.ncu import ncu_comparison
from harness.judge.verdict import CaseResult, ModeTiming, Verdict
from harness.timing.perf_model import PerfModel
from harness.timing.roofline import floor_entry, floors, roofline_entry
from harness.timing.stats import Stats

MODEL = PerfModel(read_Bps=4.4e12, write_Bps=4.3e12, copy_Bps=4.2e12, launch_graph_us=0.8, launch_cold_us=3.0,
                  peak_dram_Bps=4.8e12, peak_source="test", l2_bytes=50 << 20)


def _verdict(with_floors: bool = True) -> Verdict:
    cases = []
    for tokens, band, o, c in ((1, "decode", 2.0, 1.6), (1024, "middle", 10.0, 9.0), (16384, "prefill", 100.0, 101.0)):
        case = CaseResult(id=f"Llama-3.1-8B/tp1/bfloat16/tokens={tokens},hidden=4096", band=band,
                          label="Llama-3.1-8B/tp1", dtype="bfloat16", dims={"tokens": tokens, "hidden": 4096},
                          timed=True, bytes=tokens * 4096 * 6, bytes_read=tokens * 4096 * 4,
                          bytes_written=tokens * 4096 * 2)
        for mode in ("graph", "cold"):
            orig, cand = Stats(o, o * 0.9, o * 1.1, 50, 0.005), Stats(c, c * 0.9, c * 1.1, 50, 0.005)
            case.timings[mode] = ModeTiming(orig=orig, cand=cand, speedup=o / c)
            floor = floors(mode, case.bytes_read, case.bytes_written, MODEL, sets=2, in_place=False)
            case.roofline[mode] = roofline_entry(floor, case.bytes, orig, cand)
            if with_floors:
                case.floors[mode] = floor_entry(floor, o, c)
        case.reference = {"out": {"orig": 2e-3, "cand": 2.5e-3}}
        case.copy_us = o * 0.8
        cases.append(case)
    env = {"gpu": "Test GPU", "capability": "9.0", "driver": "1", "cuda_runtime": "13.0", "nvcc": "13.0",
           "torch": "2.11", "tvm_ffi": "0.1.11", "copy_bandwidth_Bps": 4.2e12}
    if with_floors:
        env["perf_model"] = {**MODEL.to_dict(), "cache": "hit"}
    v = Verdict(status="correct", reason="all 3 cases correct", correct=True, faster=True, name="rmsnorm",
                cases=cases, band_speedups={"graph": {"decode": 1.25, "middle": 1.11, "prefill": 0.99, "all": 1.11}},
                env=env, phases={"build_s": 1.0, "check_s": 2.0})
    return v


def test_check_table_names_modes_and_speedups():
    text = check_cmd.format_check(_verdict())
    assert "graph orig us" in text and "cold cand us" in text
    assert "graph floors us phys/pract" in text and "cold cand x pract" in text
    assert "speedup (graph, geomean): decode x1.250" in text
    assert "Test GPU" in text and "4.20 TB/s" in text
    assert "peak 4.80 TB/s" in text and "read 4.40 TB/s" in text and "0.80 us graph, 3.00 us cold" in text
    assert "verdict: correct" in text
    assert "judged in" not in text  # no judge_process_s or total_s: no time line


def test_check_report_says_where_the_judges_time_went():
    verdict = _verdict()
    verdict.phases = {"build_s": 12.8, "check_s": 11.68, "time_s": 18.24, "total_s": 45.99, "judge_process_s": 48.47,
                      "sanitizer_s": 13.66, "wait_sanitizer_s": 2.06}
    line = check_cmd.time_line(verdict)
    assert line == ("judged in 48.5 s (build 12.8, checks 11.7, paired timing 18.2); compute-sanitizer 13.7 s "
                    "beside the checks, waited for 2.1 s")
    assert line in check_cmd.format_check(verdict)
    verdict.phases = {"build_s": 0.1, "total_s": 5.4}  # --quick: no sanitizer, an in-process total
    assert check_cmd.time_line(verdict) == "judged in 5.4 s (build 0.1)"


def test_bench_table_reports_both_floors_per_view_and_the_copy_ratio():
    text = check_cmd.format_bench(_verdict())
    for view in ("graph", "cold"):
        assert f"{view} physical us" in text and f"{view} practical us" in text and f"{view} x pract" in text
    assert "copy us (graph)" in text and "a reference, not a floor" in text
    assert "1.25" in text  # graph us / copy us = 1 / 0.8
    assert "roofline" not in text
    big = next(line for line in text.splitlines() if "tokens=16384" in line)
    practical = (16384 * 4096 * 4 / 4.4e12 + 16384 * 4096 * 2 / 4.3e12) * 1e6
    assert f"{practical:.3g}" in big and f"{100.0 / practical:.3g}" in big  # the floor and x above it


def test_old_verdicts_still_print():
    old = _verdict(with_floors=False)
    assert "graph physical us" in check_cmd.format_bench(old) and "floors from" not in check_cmd.format_check(old)
    data = old.to_dict()
    for case in data["cases"]:
        for key in ("floors", "bytes_read", "bytes_written", "bytes_split"):
            case.pop(key)
    back = Verdict.from_dict(data)
    assert back.cases[0].floors == {} and back.cases[0].bytes_read is None


def test_report_files(tmp_path):
    files = report.write({"rmsnorm": _verdict()}, tmp_path)
    md, js, svg = (f.read_text() for f in files)
    assert "| rmsnorm | Llama-3.1-8B/tp1 tokens=1, hidden=4096 | 16384 / 8192 |" in md
    assert "Test GPU" in md and "peak DRAM bandwidth 4.80 TB/s" in md and "graph practical us" in md
    assert "copy bandwidth" not in md.lower() or "not a floor" in md
    assert '"rmsnorm"' in js and json.loads(js)["rmsnorm"]["cases"][0]["floors"]["graph"]["practical_us"] > 0
    assert svg.startswith("<svg") and "polyline" in svg and "rmsnorm practical" in svg and "rmsnorm physical" in svg
    old = report.write({"rmsnorm": _verdict(with_floors=False)}, tmp_path / "old")[2].read_text()
    assert "polyline" in old and "practical floor" in old


def test_ncu_table_counts_agreement_over_10us():
    result = {"skipped": None, "rows": [
        {"id": "a", "cold_us": 4.4, "ncu_us": 1.9, "ratio": 4.4 / 1.9},
        {"id": "b", "cold_us": 21.0, "ncu_us": 20.5, "ratio": 21.0 / 20.5},
        {"id": "c", "cold_us": 265.0, "ncu_us": 240.0, "ratio": 265.0 / 240.0}]}
    text = check_cmd.format_ncu(result)
    assert "cold / ncu" in text and "shapes of 10 us and more: 1/2 within 5% of Nsight Compute" in text
    assert "net of the launch overhead" not in text  # no empty-launch figures: no net column claims


def test_ncu_net_ratio_takes_out_the_measured_launch_overhead(monkeypatch):
    import harness.timing.ncu_cross_check

    # the profiled worker is GPU-only; what is tested here is the arithmetic on its figures
    monkeypatch.setattr(harness.timing.ncu_cross_check, "cross_check",
                        lambda job: {"skipped": None, "cases": {"a": 20.0, "b": 200.0}, "empty_us": 1.0})
    cases = []
    for case_id, us in (("a", 22.0), ("b", 206.0)):
        case = CaseResult(id=case_id, band="decode", label="t", dtype="bfloat16", dims={}, timed=True, bytes=1)
        case.timings["cold"] = ModeTiming(orig=Stats(us, us, us, 10, 0.01), cand=Stats(us, us, us, 10, 0.01),
                                          speedup=1.0)
        cases.append(case)
    verdict = Verdict(status="correct", reason="", correct=True, cases=cases, env={"cold_launch_floor_us": 3.0})
    result = ncu_comparison(None, verdict)
    assert result["launch_overhead_us"] == 2.0
    assert [round(r["net_ratio"], 3) for r in result["rows"]] == [1.0, 1.02]
    text = check_cmd.format_ncu(result)
    assert "shapes of 10 us and more: 1/2 within 5% of Nsight Compute (raw cold)" in text
    assert "(2.00 us = cold empty launch 3.00 - ncu empty launch 1.00): 2/2 within 5%" in text
    assert check_cmd.format_ncu({"skipped": "ncu missing", "rows": []}) == "ncu cross-check not run: ncu missing"
