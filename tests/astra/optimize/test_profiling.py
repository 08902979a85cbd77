"""The profiling agent: symptoms per band from a verdict's timings, ptxas, the source and Nsight Compute's CSV
(written here in the shape `ncu --csv --print-units base` prints it; the live run is GPU-only). The numbers
are SYNTHETIC: no GPU ran."""

from __future__ import annotations

import json

import pytest

from astra.optimize import ncu_profile, planning
from astra.optimize.loop import source_id
from astra.optimize.profiling import ProfilingAgent, band_facts
from harness.judge.verdict import decide
from harness.timing.ncu_cross_check import split_by_markers
from tests.verdicts import timed_case

SERIAL = """
__global__ void topk(const float* in, float* out, int n) {
  __shared__ float best;
  // if (threadIdx.x == 0) { for (;;) } in a comment does not count
  if (threadIdx.x == 0) {
    best = in[0];
    for (int i = 1; i < n; ++i) best = fmaxf(best, in[i]);
  }
  __syncthreads();
  out[threadIdx.x] = best;
}
"""

VECTOR = """
__global__ void copy(const uint4* in, uint4* out, int n) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) out[i] = in[i];
}
"""


def verdict(decode_us=3.0, prefill_us=100.0, resources=None):
    """A self-check with one decode and one prefill shape: decode within 1.5x an empty launch, prefill at 2x
    its practical floor; the build reports `resources` (ptxas)."""
    cases = []
    for case_id, band, time, practical in (("decode0", "decode", decode_us, 2.5), ("prefill0", "prefill", prefill_us, 50.0)):
        case = timed_case(case_id, band, 1.0, orig_us=time)
        case.floors["graph"] = {"physical_us": practical * 0.8, "practical_us": practical, "launch_us": 2.0,
                                "cand_us": time, "orig_us": time}
        cases.append(case)
    result = decide(cases, ["graph"], 0.02)
    result.builds = [{"side": "orig", "variant": "bf16", "ok": True,
                      "resources": resources if resources is not None else []}]
    return result


def test_timing_and_ptxas_symptoms_without_ncu():
    resources = [{"name": "void topk(const float*, float*, int)", "registers": 255, "spill_stores": 64,
                  "spill_loads": 48, "smem": 4}]
    profile = ProfilingAgent().profile(SERIAL, verdict(resources=resources), "cand", "original", original=True)
    found = {(s.id, s.band): s for s in profile.symptoms}
    assert found[("launch_bound", "decode")].evidence == "decode0: 3.00 us against an empty launch of 2.00 us (x1.50)"
    assert found[("far_from_floor", "prefill")].facts["x_practical"] == 2.0
    assert "50.0 us above it" in found[("far_from_floor", "prefill")].evidence
    assert found[("spills", "all")].source == "ptxas" and "64 B stored / 48 B loaded at 255 registers" in \
        found[("spills", "all")].evidence
    assert "at most 8 of 64 warps per SM (12%)" in found[("low_occupancy", "all")].evidence
    assert found[("low_occupancy", "all")].facts["limiter"] == "registers"
    assert found[("serial_loop", "all")].evidence == "line 5: a loop only thread 0 runs"
    assert found[("scalar_memory", "prefill")].source == "source"  # no vector type, prefill far from its floor
    assert ("scalar_memory", "decode") not in found  # decode is launch-bound, not far from its floor
    assert profile.symptoms[0].band in ("prefill", "all")  # the band with the most time above its floor first
    assert profile.notes == ["no Nsight Compute profile (no GPU or no ncu here): timing, ptxas and source only"]
    assert profile.source_id == source_id(SERIAL)


def test_vector_source_and_no_spills_give_no_source_symptoms():
    profile = ProfilingAgent().profile(VECTOR, verdict(resources=[{"name": "copy", "registers": 32}]))
    ids = {s.id for s in profile.symptoms}
    assert ids == {"launch_bound", "far_from_floor"}


def test_a_launch_after_another_launch_of_its_function_plans_pdl_chain():
    source = VECTOR + """
void run(const uint4* in, uint4* tmp, uint4* out, int n, cudaStream_t stream) {
  LaunchKernel(n / 256, 256, stream)(copy, in, tmp, n);
  // LaunchKernel(1, 32, stream)(copy, ...) in a comment does not count
  LaunchKernel(n / 256, 256, stream)(copy, tmp, out, n);
}
"""
    profile = ProfilingAgent().profile(source, verdict(resources=[{"name": "copy", "registers": 32}]))
    found = {(s.id, s.band): s for s in profile.symptoms}
    symptom = found[("serial_launches", "all")]
    assert symptom.evidence == ("line 10: a launch after another launch of its function (2 there), without "
                                "programmatic dependent launch") and symptom.facts == {"line": 10, "launches": 2}
    plans, _ = planning.make_plan(profile, planning.load_rules())
    assert plans[0].step == "pass:pdl_chain"
    chained = source.replace("stream)(copy, tmp", "stream).enable_pdl(true)(copy, tmp")
    profile = ProfilingAgent().profile(chained, verdict(resources=[{"name": "copy", "registers": 32}]))
    assert "serial_launches" not in {s.id for s in profile.symptoms}


def test_a_remainder_by_a_run_time_value_is_an_index_division_where_a_band_is_far():
    source = """
__global__ void rope(float* q, const float* table, int64_t n, int64_t pairs, int64_t heads) {
  const int kPairs = 64;  // a remainder by a constant (`i % kPairs`, `i % 8`) the compiler does itself
  for (int64_t i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += blockDim.x * gridDim.x) {
    const int64_t lane = i % kPairs + i % 8 + (i / 2) % 4;
    const int64_t pair = i % pairs;
    q[i] *= table[(i / (pairs * heads)) * pairs + pair + lane];
  }
}
"""
    profile = ProfilingAgent().profile(source, verdict(resources=[{"name": "rope", "registers": 32}]))
    found = {(s.id, s.band): s for s in profile.symptoms}
    assert found[("index_division", "prefill")].evidence == (
        "line 6: an integer remainder by a run-time value (`i % pairs`), x2.00 the practical floor")
    assert ("index_division", "decode") not in found  # decode is launch-bound, not far from its floor
    plans, _ = planning.make_plan(profile, planning.load_rules())
    assert plans[0].step == "pass:fastdiv" and plans[0].band == "prefill"
    constant = source.replace("i % pairs", "i % kPairs")
    profile = ProfilingAgent().profile(constant, verdict(resources=[{"name": "rope", "registers": 32}]))
    assert "index_division" not in {s.id for s in profile.symptoms}


def test_an_unrolled_loop_that_loads_then_stores_plans_batch_loads_where_a_band_is_far():
    source = """
struct Params { float* out; const float* x; };
__global__ void scale(const Params p) {
#pragma unroll
  for (int it = 0; it < 8; ++it) {
    const int i = blockIdx.x * 1024 + it * 128 + threadIdx.x;
    const float v = *reinterpret_cast<const float*>(p.x + i);
    p.out[i] = 2.f * v;
  }
}
"""
    profile = ProfilingAgent().profile(source, verdict(resources=[{"name": "scale", "registers": 32}]))
    found = {(s.id, s.band): s for s in profile.symptoms}
    assert found[("loads_behind_stores", "prefill")].evidence.startswith("line 5: an unrolled loop loads, then stores")
    assert found[("loads_behind_stores", "prefill")].facts["line"] == 5
    assert ("loads_behind_stores", "decode") not in found  # launch-bound, not far from its floor
    plans, _ = planning.make_plan(profile, planning.load_rules())
    assert plans[0].step == "pass:batch_loads" and plans[0].band == "prefill"
    stored_first = source.replace("    const float v = *reinterpret_cast<const float*>(p.x + i);\n    p.out[i] = 2.f * v;",
                                  "    p.out[i] = 2.f;")
    profile = ProfilingAgent().profile(stored_first, verdict(resources=[{"name": "scale", "registers": 32}]))
    assert "loads_behind_stores" not in {s.id for s in profile.symptoms}
    # a store into a thread's own array holds no load back; the loop after it, through a pointer, does
    local = source.replace("__global__ void scale", "__device__ float sums(const Params p) {\n  float acc[4];\n"
                           "#pragma unroll\n  for (int c = 0; c < 4; ++c) {\n"
                           "    const float v = *reinterpret_cast<const float*>(p.x + c);\n    acc[c] = v;\n  }\n"
                           "  return acc[0];\n}\n__global__ void scale", 1)
    profile = ProfilingAgent().profile(local, verdict(resources=[{"name": "scale", "registers": 32}]))
    found = {(s.id, s.band): s for s in profile.symptoms}
    assert found[("loads_behind_stores", "prefill")].facts["line"] == local[:local.index("for (int it")].count("\n") + 1


def test_band_facts_pick_the_shape_furthest_above_its_floor():
    result = verdict()
    extra = timed_case("prefill1", "prefill", 1.0, orig_us=400.0)
    extra.floors["graph"] = {"practical_us": 100.0, "launch_us": 2.0}
    result.cases.append(extra)
    facts = band_facts(result)
    assert facts["prefill"].case == "prefill1" and facts["prefill"].us_above == 350.0
    assert round(facts["prefill"].x_practical, 3) == round((2.0 * 4.0) ** 0.5, 3)
    assert facts["decode"].case == "decode0" and facts["decode"].launch_us == 2.0


HEADER = ('"ID","Process ID","Process Name","Host Name","Kernel Name","Context","Stream","Block Size","Grid Size",'
          '"Device","CC","Section Name","Metric Name","Metric Unit","Metric Value"')


def ncu_csv(metrics: dict[str, str], block: int = 64, grid: int = 4) -> str:
    """What `ncu --csv --print-units base` prints for: a marker, the kernel with `metrics`, a marker."""
    def rows(kernel_id, name, values, b, g):
        return [f'"{kernel_id}","77","python3","127.0.0.1","{name}","1","7","({b}, 1, 1)","({g}, 1, 1)","0","9.0",'
                f'"Command line profiler metrics","{metric}","","{value}"' for metric, value in values.items()]

    lines = ["==PROF== Connected to process 77 (/usr/bin/python3)", HEADER,
             *rows(0, "spin_kernel(long)", {"gpu__time_duration.sum": "2,000"}, 1, 1),
             *rows(1, "void rmsnorm_kernel<__nv_bfloat16>(...)", metrics, block, grid),
             *rows(2, "spin_kernel(long)", {"gpu__time_duration.sum": "2,000"}, 1, 1),
             "==PROF== Disconnected from process 77"]
    return "\n".join(lines)


STALL = "smsp__average_warps_issue_stalled_{}_per_issue_active.ratio".format
DECODE_KERNEL = {
    "gpu__time_duration.sum": "4,200", "dram__throughput.avg.pct_of_peak_sustained_elapsed": "3.5",
    "dram__bytes.sum.per_second": "110,000,000,000", "sm__warps_active.avg.pct_of_peak_sustained_active": "3.1",
    "launch__registers_per_thread": "96", "launch__grid_size": "4", "launch__block_size": "64",
    "smsp__sass_inst_executed_op_local_ld.sum": "0", "smsp__sass_inst_executed_op_local_st.sum": "0",
    "l1tex__t_sectors_pipe_lsu_mem_global_op_ld.sum": "8,192", "l1tex__t_requests_pipe_lsu_mem_global_op_ld.sum": "1,024",
    "l1tex__t_sectors_pipe_lsu_mem_global_op_st.sum": "512", "l1tex__t_requests_pipe_lsu_mem_global_op_st.sum": "256",
    "smsp__sass_average_data_bytes_per_sector_mem_global_op_ld.pct": "25",
    "smsp__sass_average_data_bytes_per_sector_mem_global_op_st.pct": "100",
    "sm__maximum_warps_per_active_cycle_pct": "31.25", "launch__occupancy_limit_registers": "10",
    "launch__occupancy_limit_shared_mem": "32", "launch__occupancy_limit_warps": "32",
    "launch__occupancy_limit_blocks": "32", "launch__waves_per_multiprocessor": "0.03",
    "device__attribute_multiprocessor_count": "132",
    "sm__inst_executed_pipe_lsu.sum": "3,000", "sm__inst_executed_pipe_alu.sum": "5,000",
    "sm__inst_executed_pipe_fma.sum": "1,000", "sm__inst_executed_pipe_xu.sum": "1,000",
    STALL("barrier"): "7.5", STALL("long_scoreboard"): "4.0", STALL("selected"): "1.0", STALL("wait"): "0.5",
}


def summarized(metrics: dict[str, str], **launch) -> dict:
    groups = split_by_markers(ncu_profile.parse_csv(ncu_csv(metrics, **launch)))
    return ncu_profile.summarize(groups[-1])


def test_diagnosis_metrics_are_parsed_from_ncu_csv():
    n = summarized(DECODE_KERNEL)
    assert n["ld_sectors"] == 8192 and n["ld_requests"] == 1024 and n["st_sectors"] == 512
    assert n["ld_efficiency_pct"] == 25 and n["st_efficiency_pct"] == 100
    assert n["limit_registers"] == 10 and n["sm_count"] == 132 and n["waves"] == 0.03
    assert n["theoretical_occupancy_pct"] == 31.25 and n["grid"] == [4] and n["block"] == [64]
    assert n["inst_mix_pct"] == {"alu": 50.0, "lsu": 30.0, "fma": 10.0, "xu": 10.0}
    assert n["top_stalls"] == [["barrier", 7.5], ["long_scoreboard", 4.0], ["wait", 0.5]]


def test_only_the_planner_asks_ncu_for_the_diagnosis_metrics():
    plain, diagnosing = ncu_profile.Profiler(None, None), ncu_profile.Profiler(None, None, diagnose=True)
    assert "launch__occupancy_limit_registers" not in plain.metrics and ncu_profile.PIPES not in plain.metrics
    assert {"launch__occupancy_limit_registers", "l1tex__t_requests_pipe_lsu_mem_global_op_ld.sum",
            "device__attribute_multiprocessor_count", ncu_profile.PIPES} <= set(diagnosing.metrics)
    assert ncu_profile.STALLS in diagnosing.metrics and "dram__throughput.avg.pct_of_peak_sustained_elapsed" in diagnosing.metrics


class FakeNcu:
    """Stands in for the ncu run (a GPU tool): answers the parsed CSV of one shape per band. `calls`: every
    (source, shape) profiled; `runs`: every profiled process, (source, its shapes)."""

    def __init__(self, per_case: dict[str, dict]):
        self.per_case, self.calls, self.runs = per_case, [], []

    def many(self, source, cases, extra_shapes):
        self.runs.append((source, tuple(cases)))
        self.calls += [(source, case) for case in cases]
        return {case: {**self.per_case[case], "case": case} for case in cases}


def test_ncu_symptoms_per_band_and_the_cache(tmp_path):
    prefill = summarized({**DECODE_KERNEL, "launch__grid_size": "8192", "launch__block_size": "256",
                          "sm__warps_active.avg.pct_of_peak_sustained_active": "85",
                          "smsp__sass_average_data_bytes_per_sector_mem_global_op_ld.pct": "100",
                          "l1tex__t_sectors_pipe_lsu_mem_global_op_ld.sum": "4,096",
                          "smsp__sass_inst_executed_op_local_st.sum": "12",
                          "sm__inst_executed_pipe_xu.sum": "0", STALL("barrier"): "0.1"}, block=256, grid=8192)
    ncu = FakeNcu({"decode0": summarized(DECODE_KERNEL), "prefill0": prefill})
    agent = ProfilingAgent(ncu, cache_dir=tmp_path / "profiles")
    profile = agent.profile(SERIAL, verdict(), "cand", "best #2")
    found = {(s.id, s.band): s for s in profile.symptoms}
    assert found[("few_ctas", "decode")].evidence == "decode0: grid of 4 CTA(s) x 64 threads on 132 SMs (0.03 waves)"
    assert found[("small_ctas", "decode")].facts == {"block": 64, "ctas": 4}
    assert found[("uncoalesced_loads", "decode")].evidence == \
        "decode0: global loads use 25% of each 32-byte sector (8.0 sectors per request)"
    low = found[("low_occupancy", "decode")]
    assert low.facts["limiter"] == "registers" and "limited by registers (10 CTA(s) per SM)" in low.evidence
    assert "theoretical 31%" in low.evidence
    assert found[("barrier_stalls", "decode")].facts["top_stalls"][0] == "barrier"
    assert found[("transcendental_heavy", "decode")].facts["xu_pct"] == 10.0
    assert ("block_reduce_small_row", "decode") not in found  # SERIAL has no block-wide reduction
    assert found[("scalar_memory", "prefill")].source == "ncu"  # ncu's finding wins over the source's
    assert found[("scalar_memory", "prefill")].facts["sectors_per_request"] == 4.0
    assert found[("spills", "prefill")].evidence == "prefill0: 0 local-memory load and 12 store instructions at 96 registers"
    assert ("few_ctas", "prefill") not in found and ("uncoalesced_loads", "prefill") not in found
    assert ncu.calls == [(SERIAL, "decode0"), (SERIAL, "prefill0")]
    assert profile.notes == []

    agent.profile(SERIAL, verdict(), "cand", "best #2")  # the same source and shapes: no second ncu run
    assert len(ncu.calls) == 2
    files = sorted((tmp_path / "profiles").glob("*.json"))
    assert [f.name.split("-", 1)[1] for f in files] == ["decode0.json", "prefill0.json"]
    assert json.loads(files[0].read_text())["ld_efficiency_pct"] == 25

    again = FakeNcu({})  # a resumed run reads the cache instead of profiling again
    resumed = ProfilingAgent(again, cache_dir=tmp_path / "profiles").profile(SERIAL, verdict(), "cand", "best #2")
    assert again.calls == [] and {(s.id, s.band) for s in resumed.symptoms} == set(found)


def test_every_band_is_profiled_in_one_run(tmp_path):
    ncu = FakeNcu({"decode0": summarized(DECODE_KERNEL), "prefill0": summarized(DECODE_KERNEL)})
    agent = ProfilingAgent(ncu, cache_dir=tmp_path / "profiles")
    profile = agent.profile(SERIAL, verdict(), "cand", "best #2")
    assert ncu.runs == [(SERIAL, ("decode0", "prefill0"))]  # one profiled process for both bands
    assert {band: facts.ncu["case"] for band, facts in profile.bands.items()} == {"decode": "decode0",
                                                                                  "prefill": "prefill0"}
    (tmp_path / "profiles" / next(p.name for p in (tmp_path / "profiles").iterdir() if "prefill0" in p.name)).unlink()
    fresh = FakeNcu({"prefill0": summarized(DECODE_KERNEL)})
    ProfilingAgent(fresh, cache_dir=tmp_path / "profiles").profile(SERIAL, verdict(), "cand", "best #2")
    assert fresh.runs == [(SERIAL, ("prefill0",))]  # only the shape the cache lacks


def test_the_original_is_profiled_as_the_original_build_and_failures_are_notes():
    ncu = FakeNcu({"decode0": {"available": False, "why": "ncu (Nsight Compute) not found on PATH"},
                   "prefill0": {"available": False, "why": "ncu (Nsight Compute) not found on PATH"}})
    profile = ProfilingAgent(ncu).profile(VECTOR, verdict(), "orig", "original", original=True)
    assert ncu.calls == [(None, "decode0"), (None, "prefill0")]  # None: the original kernel, not a candidate
    assert profile.notes == ["ncu: ncu (Nsight Compute) not found on PATH"]
    assert {s.source for s in profile.symptoms} == {"timing"}


def test_a_block_reduction_with_small_ctas_is_a_small_row_reduction():
    source = VECTOR + """
__device__ float row_sum(float v) { return blockReduceSum(v); }  // __syncthreads inside
__global__ void norm(float* x) { __syncthreads(); x[0] = row_sum(x[threadIdx.x]); }
"""
    ncu = FakeNcu({"decode0": summarized(DECODE_KERNEL),
                   "prefill0": summarized({**DECODE_KERNEL, STALL("barrier"): "0.1", "launch__block_size": "512"}, block=512)})
    found = {(s.id, s.band): s for s in ProfilingAgent(ncu).profile(source, verdict()).symptoms}
    assert found[("block_reduce_small_row", "decode")].evidence == \
        "line 7: a block-wide reduction (64 threads per CTA, decode0)"
    assert ("block_reduce_small_row", "prefill") not in found


def test_a_damaged_cache_file_is_profiled_again(tmp_path):
    ncu = FakeNcu({"decode0": summarized(DECODE_KERNEL), "prefill0": {"available": False, "why": "timed out"}})
    ProfilingAgent(ncu, cache_dir=tmp_path).profile(VECTOR, verdict())
    assert [f.name.split("-", 1)[1] for f in tmp_path.glob("*.json")] == ["decode0.json"]  # a failure is not kept
    next(tmp_path.glob("*.json")).write_text('{"available": tr')
    again = FakeNcu(ncu.per_case)
    profile = ProfilingAgent(again, cache_dir=tmp_path).profile(VECTOR, verdict())
    assert again.calls == [(VECTOR, "decode0"), (VECTOR, "prefill0")]
    assert profile.notes == ["ncu: timed out"] and profile.bands["decode"].ncu["ld_efficiency_pct"] == 25


def fused_timed_cases(tree):
    """fused_add_rmsnorm's spec and timed cases, where ncu is at hand (else the test is skipped)."""
    from astra.spec import jobs
    from astra.spec import model as spec_mod
    from harness.timing.ncu_cross_check import ncu_path

    if ncu_path() is None:
        pytest.skip("needs ncu (Nsight Compute)")
    spec = spec_mod.load("fused_add_rmsnorm")
    return spec, [c for c in jobs.make_job(spec, tree).cases if c.timed]


@pytest.mark.gpu
@pytest.mark.network
def test_ncu_profiles_a_real_shape(sglang_0523):
    spec, timed = fused_timed_cases(sglang_0523)
    result = ncu_profile.Profiler(spec, sglang_0523, timeout_s=400)(None, timed[0].id, [])
    assert result["available"], result
    assert result["kernels"] >= 1 and result["duration_us"] > 0 and result["registers"] > 0
    assert result["dram_pct"] is not None and len(result["top_stalls"]) == 3


@pytest.mark.gpu
@pytest.mark.network
def test_ncu_profiles_several_shapes_in_one_process(sglang_0523):
    spec, timed = fused_timed_cases(sglang_0523)
    small, large = timed[0], max(timed, key=lambda c: c.bytes)
    found = ncu_profile.Profiler(spec, sglang_0523, timeout_s=400, diagnose=True).many(
        None, [small.id, large.id, "no/such/shape"], [])
    assert found[small.id]["available"] and found[large.id]["available"], found
    assert found[small.id]["case"] == small.id and found[large.id]["case"] == large.id
    assert found[large.id]["duration_us"] > found[small.id]["duration_us"]  # each shape's own launch
    assert found[large.id]["grid"] != found[small.id]["grid"]
    # only the marked launches were profiled, and the one kernel before the seal, not the inputs' kernels
    assert found[small.id]["unmarked_kernels"] == 1
    assert not found["no/such/shape"]["available"] and "not in the suite" in found["no/such/shape"]["why"]


def test_a_profiled_process_that_faults_is_told_by_its_fault_not_its_stack(monkeypatch, tmp_path):
    """ncu's child killed by a fault: the profile says the fault's line (faulthandler's header), not the
    last line of the stack it printed."""
    import harness.timing.ncu_cross_check as cross_check
    from harness.job import BuildBase, Case, Job

    fake_ncu = tmp_path / "ncu"
    fake_ncu.write_text("#!/bin/sh\n"
                        "printf 'Fatal Python error: Segmentation fault\\n\\nCurrent thread 0x1 (most recent call first):\\n"
                        "  File \"<unknown>\", line 0, in 0xffffffffffffffff\\n' >&2\nexit 11\n")
    fake_ncu.chmod(0o755)
    monkeypatch.setattr(cross_check, "ncu_path", lambda: str(fake_ncu))
    job = Job(name="k", entry="f", kernel_file="k.cuh", build=BuildBase(source_root="/nonexistent", include_dirs=[],
              cuda_files=[]), variants={}, cases=[Case(id="m/tp1/bfloat16/n=1", band="decode", label="m/tp1",
              dtype="bfloat16", dims={"n": 1}, variant="v", bytes=4, args=[])], tolerance={})
    found = ncu_profile.Profiler(None, None, timeout_s=30)._run(job)
    why = found["m/tp1/bfloat16/n=1"]["why"]
    assert not found["m/tp1/bfloat16/n=1"]["available"]
    assert why == "the profiled launch did not finish (exit 11): Fatal Python error: Segmentation fault"
