"""Terminal text of verdicts: `check`'s per-shape table, `bench`'s baseline table, the ncu cross-check.
Every number printed comes from a harness Verdict."""

from __future__ import annotations

import math

from astra.report import table
from harness import Verdict


def _pct(value: float | None) -> float | None:
    return None if value is None else round(100.0 * value, 1)


def _floor(case, mode: str, key: str) -> float | None:
    """One number of `case.floors[mode]` (None where the verdict has none: not timed, or older)."""
    value = (case.floors.get(mode) or {}).get(key)
    return value if isinstance(value, (int, float)) else None


def format_check(verdict: Verdict) -> str:
    modes = verdict.modes()
    headers = ["shape", "band"]
    for mode in modes:
        headers += [f"{mode} orig us", f"{mode} cand us", f"{mode} x", f"{mode} floors us phys/pract",
                    f"{mode} cand x pract"]
    headers += ["err vs ref cand/orig", "ok"]
    rows = []
    for case in verdict.cases:
        if not case.timed and case.correct:
            continue
        row = [case.id, case.band]
        for mode in modes:
            row += [case.median_us(mode, "orig"), case.median_us(mode, "cand"), case.speedup(mode),
                    _pair(_floor(case, mode, "physical_us"), _floor(case, mode, "practical_us")),
                    _floor(case, mode, "cand_x_practical")]
        errs = [(v.get("cand"), v.get("orig")) for v in case.reference.values()]
        row.append(", ".join(f"{c:.2g}/{o:.2g}" for c, o in errs if c is not None and o is not None) or "-")
        row.append("yes" if case.correct else "NO: " + "; ".join(case.reasons)[:60])
        rows.append(row)
    out = [table.render(headers, rows, max_width=60)] if rows else []
    out.append(FLOORS_NOTE if rows and modes else "")
    out.append(bands_text(verdict))
    out.append(environment(verdict))
    out.append(time_line(verdict))
    speed = {True: "faster", False: "not faster", None: "speed not measured"}[verdict.faster]
    out.append(f"verdict: {verdict.status} ({verdict.reason}); {speed}")
    if verdict.slower_shapes:
        out.append("slower shapes: " + ", ".join(f"{s['id']} ({s['mode']} x{s['speedup']:.3f})"
                                                 for s in verdict.slower_shapes[:8]))
    return "\n".join(o for o in out if o)


# The judge's phases a check's time line names, in order (verdict.phases, seconds).
_TIME_PARTS = (("build_s", "build"), ("check_s", "checks"), ("time_s", "paired timing"))


def time_line(verdict: Verdict) -> str:
    """Where the judge's time went, from the verdict's phases ("" for a verdict without them): the judge's
    process, its build, checks and paired timing, and compute-sanitizer beside the checks."""
    phases = verdict.phases or {}
    whole = phases.get("judge_process_s", phases.get("total_s"))
    if whole is None:
        return ""
    parts = [f"{name} {phases[key]:.1f}" for key, name in _TIME_PARTS if key in phases]
    line = f"judged in {whole:.1f} s" + (f" ({', '.join(parts)})" if parts else "")
    if "sanitizer_s" in phases:
        line += f"; compute-sanitizer {phases['sanitizer_s']:.1f} s beside the checks"
        if phases.get("wait_sanitizer_s"):
            line += f", waited for {phases['wait_sanitizer_s']:.1f} s"
    return line


FLOORS_NOTE = ("floors per view (graph: back-to-back in a CUDA graph over rotating inputs; cold: one launch "
               "after an L2 flush): physical = bytes that must cross DRAM at peak bandwidth, or an empty launch "
               "(nothing legitimate is faster); practical = bytes read / read bandwidth + bytes written / write "
               "bandwidth, measured; x pract = time / practical floor (1.0 = done)")


def _pair(a: float | None, b: float | None) -> str:
    def num(x: float | None) -> str:
        return "-" if x is None else f"{x:.3g}" if x < 1000 else f"{x:.0f}"

    return "-" if a is None and b is None else f"{num(a)}/{num(b)}"


def format_bench(verdict: Verdict) -> str:
    if verdict.status != "correct" and not verdict.cases:
        return f"bench failed: {verdict.status}: {verdict.reason}"
    modes = verdict.modes()
    headers = ["shape", "band", "bytes r/w"]
    for mode in modes:
        headers += [f"{mode} us", f"{mode} p10-p90", f"{mode} physical us", f"{mode} practical us",
                    f"{mode} x pract"]
    headers += ["copy us (graph)", "vs copy", "self-ratio"]
    rows = []
    for case in verdict.cases:
        split = (f"{case.bytes_read}/{case.bytes_written}" if case.bytes_read is not None
                 and case.bytes_written is not None else str(case.bytes))
        row = [case.id, case.band, split]
        for mode in modes:
            timing = case.timings.get(mode)
            orig = timing.orig if timing else None
            row += [orig.median_us if orig else None, f"{orig.p10_us:.2f}-{orig.p90_us:.2f}" if orig else "-",
                    _floor(case, mode, "physical_us"), _floor(case, mode, "practical_us"),
                    _floor(case, mode, "orig_x_practical")]
        graph = case.median_us("graph", "orig")
        copy = case.copy_us
        row += [copy, (graph / copy) if copy and graph else None, case.speedup(modes[0]) if modes else None]
        rows.append(row)
    return "\n".join([table.render(headers, rows, max_width=60), FLOORS_NOTE, environment(verdict),
                      "copy us: an elementwise copy of the same bytes (graph), a reference, not a floor; "
                      "self-ratio: the original timed against itself, interleaved (1.0 = no drift)"])


def format_ncu(result: dict) -> str:
    if result.get("skipped"):
        return f"ncu cross-check not run: {result['skipped']}"
    rows = [[r["id"], r["cold_us"], r["ncu_us"], r["ratio"], r.get("net_ratio", "-")] for r in result["rows"]]
    big = [r for r in result["rows"] if r["ncu_us"] >= 10]
    within = sum(abs(r["ratio"] - 1) <= 0.05 for r in big)
    lines = [table.render(["shape", "cold us (events)", "ncu us (gpu__time_duration)", "cold / ncu", "net / ncu"], rows),
             f"shapes of 10 us and more: {within}/{len(big)} within 5% of Nsight Compute (raw cold)"]
    overhead = result.get("launch_overhead_us")
    if overhead is not None:
        net = sum(abs(r["net_ratio"] - 1) <= 0.05 for r in big)
        lines.append(f"net of the launch overhead events add ({overhead:.2f} us = cold empty launch "
                     f"{result['cold_empty_us']:.2f} - ncu empty launch {result['ncu_empty_us']:.2f}): "
                     f"{net}/{len(big)} within 5%")
    return "\n".join(lines)


def bands_text(verdict: Verdict) -> str:
    lines = []
    for mode, bands in verdict.band_speedups.items():
        parts = [f"{band} x{value:.3f}" for band, value in bands.items() if value and math.isfinite(value)]
        lines.append(f"speedup ({mode}, geomean): " + ", ".join(parts))
    return "\n".join(lines)


def environment(verdict: Verdict) -> str:
    env = verdict.env
    if not env:
        return ""
    bw = env.get("copy_bandwidth_Bps")
    bw_text = f", copy {bw / 1e12:.2f} TB/s" if isinstance(bw, (int, float)) else ""
    phase_text = ", ".join((f"{k} {v:.1f}s" if k.endswith("_s") else f"{k} {v:g}")
                           for k, v in verdict.phases.items() if isinstance(v, (int, float)))
    return (f"GPU: {env.get('gpu')} (sm {env.get('capability')}), driver {env.get('driver')}, "
            f"CUDA runtime {env.get('cuda_runtime')}, nvcc {env.get('nvcc')}, "
            f"torch {env.get('torch')}, tvm-ffi {env.get('tvm_ffi')}{bw_text}"
            + (f"; time: {phase_text}" if phase_text else "") + perf_model_text(env))


def perf_model_text(env: dict) -> str:
    """The performance model the floors came from, on its own line ("" for an older verdict)."""
    model = env.get("perf_model")
    if not isinstance(model, dict):
        return ""

    def tbs(key: str) -> str:
        value = model.get(key)
        return f"{value / 1e12:.2f} TB/s" if isinstance(value, (int, float)) else "?"

    def us(key: str) -> str:
        value = model.get(key)
        return f"{value:.2f} us" if isinstance(value, (int, float)) else "?"

    peak = f"peak {tbs('peak_dram_Bps')} (from {model.get('peak_source')})" if model.get("peak_dram_Bps") else \
        "peak unknown"
    return (f"\nfloors from: {peak}; physical floor at {tbs('floor_Bps')} ({model.get('floor_source')}); measured "
            f"read {tbs('read_Bps')}, write {tbs('write_Bps')}, copy {tbs('copy_Bps')}; empty launch "
            f"{us('launch_graph_us')} graph, {us('launch_cold_us')} cold (model {model.get('cache') or 'measured'})")
