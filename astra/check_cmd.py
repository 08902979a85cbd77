"""`astra check` and `astra bench`: a spec resolved into a job, run in an isolated GPU worker, and the
verdict printed per shape. Every number printed comes from the worker's verdict JSON."""

from __future__ import annotations

import json
import math
from pathlib import Path

from astra import jobs, spec as spec_mod, table
from astra.errors import AstraError
from astra.sglang_tree import SglangTree

NO_GPU = 7


def require_gpu() -> None:
    try:
        import torch
    except ImportError:
        raise AstraError("torch is not installed; `astra check`/`bench` need torch with CUDA", exit_code=NO_GPU)
    if not torch.cuda.is_available():
        raise AstraError(
            "no CUDA GPU here: `astra check` and `astra bench` need one. Without a GPU you can still run "
            "`astra list`, `astra extract`, `astra build` (nvcc + ptxas report) and `astra spec-check`.",
            exit_code=NO_GPU)


def _options(args, *, sanitizer: bool):
    from harness.job import Options

    modes = [m.strip() for m in args.modes.split(",") if m.strip()]
    bad = [m for m in modes if m not in ("graph", "cold")]
    if bad:
        raise AstraError(f"--modes: unknown mode(s) {bad}; use graph, cold or graph,cold")
    opts = Options(modes=modes, sanitizer=sanitizer)
    if getattr(args, "quick", False):
        opts.seeds = [0]
        opts.budget_ms_per_case = 100.0
    return opts


def _quick_filter(job, quick: bool):
    if quick:  # the timed dtype's timed shapes plus edges of the first dtype
        first = job.cases[0].dtype
        job.cases = [c for c in job.cases if c.dtype == first]
    return job


def check(args, tree: SglangTree) -> int:
    spec = spec_mod.load(args.name)
    path = Path(args.candidate)
    if not path.is_file():
        raise AstraError(f"--candidate {path}: no such file (give your version of {spec.kernel_file})")
    require_gpu()
    from harness.worker import verify_job

    job = jobs.make_job(spec, tree, candidate_source=path.read_text(), label=path.name,
                        options=_options(args, sanitizer=not args.no_sanitizer))
    job = _quick_filter(job, args.quick)
    verdict = verify_job(job, timeout_s=timeout_for(job))
    _write_json(args.json, verdict)
    print(format_check(verdict))
    return 0 if verdict.get("correct") and verdict.get("status") == "correct" else 1


def bench(args, tree_for) -> int:
    """Time each named spec's original over its timed shapes (original against itself)."""
    specs = [spec_mod.load(name) for name in args.names]
    require_gpu()
    from harness.worker import run_job

    verdicts, ok = {}, True
    for spec in specs:
        opts = _options(args, sanitizer=False)
        if args.budget_ms:
            opts.budget_ms_per_case = args.budget_ms
        job = jobs.make_job(spec, tree_for(spec.name), options=opts)
        job.cases = [c for c in job.cases if c.timed]
        verdict = run_job(job, timeout_s=timeout_for(job))
        if getattr(args, "ncu", False):
            verdict["ncu"] = ncu_comparison(job, verdict)
        verdicts[spec.name] = verdict
        ok = ok and verdict.get("status") == "correct"
        print(f"== {spec.name}", flush=True)
        print(format_bench(verdict), flush=True)
        if verdict.get("ncu"):
            print(format_ncu(verdict["ncu"]), flush=True)
        _save(args, verdicts, final=False)  # a run cut short keeps what it measured
    _save(args, verdicts, final=True)
    return 0 if ok else 1


def _save(args, verdicts: dict, *, final: bool) -> None:
    if args.json:
        Path(args.json).write_text(json.dumps(verdicts, indent=1))
    if args.report:
        from astra import report

        for path in report.write(verdicts, Path(args.report)):
            if final:
                print(f"wrote {path}")


def ncu_comparison(job, verdict: dict) -> dict:
    """Cold medians against Nsight Compute's gpu__time_duration, per timed shape."""
    from harness.ncu import cross_check

    result = cross_check(job)
    cold_empty = (verdict.get("env") or {}).get("cold_launch_floor_us")
    overhead = cold_empty - result["empty_us"] if cold_empty and result.get("empty_us") else None
    rows = []
    for case in verdict.get("cases", []):
        ncu_us = result["cases"].get(case["id"])
        cold = ((case.get("timings", {}).get("cold") or {}).get("orig") or {}).get("median_us")
        if ncu_us and cold:
            row = {"id": case["id"], "cold_us": cold, "ncu_us": ncu_us, "ratio": cold / ncu_us}
            if overhead is not None:
                row["net_ratio"] = (cold - overhead) / ncu_us
            rows.append(row)
    return {"skipped": result["skipped"], "rows": rows, "launch_overhead_us": overhead,
            "cold_empty_us": cold_empty, "ncu_empty_us": result.get("empty_us")}


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


def timeout_for(job) -> float:
    """Generous: builds, every case's checks and timing, with slack for a cold build cache."""
    return 300.0 + 10.0 * len(job.cases)


def _write_json(path: str | None, verdict: dict) -> None:
    if path:
        Path(path).write_text(json.dumps(verdict, indent=1))


def _us(stats: dict | None) -> float | None:
    return None if not stats else stats.get("median_us")


def _pct(value: float | None) -> float | None:
    return None if value is None else round(100.0 * value, 1)


def _modes(verdict: dict) -> list[str]:
    """Timing modes present in the verdict, graph first."""
    found = {m for case in verdict.get("cases", []) for m in case.get("timings", {})}
    return [m for m in ("graph", "cold") if m in found] + sorted(found - {"graph", "cold"})


def format_check(verdict: dict) -> str:
    modes = _modes(verdict)
    headers = ["shape", "band"]
    for mode in modes:
        headers += [f"{mode} orig us", f"{mode} cand us", f"{mode} x"]
    headers += ["% roofline (cand)", "err vs ref cand/orig", "ok"]
    rows = []
    for case in verdict.get("cases", []):
        if not case.get("timed") and case.get("correct"):
            continue
        row = [case["id"], case["band"]]
        for mode in modes:
            t = case.get("timings", {}).get(mode, {})
            row += [_us(t.get("orig")), _us(t.get("cand")), t.get("speedup")]
        roof = case.get("roofline", {}).get(modes[0], {}) if modes else {}
        row.append(_pct(roof.get("cand_fraction")))
        errs = [(v.get("cand"), v.get("orig")) for v in case.get("reference", {}).values()]
        row.append(", ".join(f"{c:.2g}/{o:.2g}" for c, o in errs if c is not None and o is not None) or "-")
        row.append("yes" if case.get("correct") else "NO: " + "; ".join(case.get("reasons", []))[:60])
        rows.append(row)
    out = [table.render(headers, rows, max_width=60)] if rows else []
    out.append(_bands(verdict))
    out.append(_environment(verdict))
    faster = verdict.get("faster")
    speed = "faster" if faster else ("not faster" if faster is not None else "speed not measured")
    out.append(f"verdict: {verdict.get('status')} ({verdict.get('reason')}); {speed}")
    if verdict.get("slower_shapes"):
        out.append("slower shapes: " + ", ".join(f"{s['id']} ({s['mode']} x{s['speedup']:.3f})"
                                                 for s in verdict["slower_shapes"][:8]))
    return "\n".join(o for o in out if o)


def format_bench(verdict: dict) -> str:
    if verdict.get("status") != "correct" and not verdict.get("cases"):
        return f"bench failed: {verdict.get('status')}: {verdict.get('reason')}"
    modes = _modes(verdict)
    headers = ["shape", "band", "bytes"]
    for mode in modes:
        headers += [f"{mode} us", f"{mode} p10-p90", f"% roofline {mode}"]
    headers += ["copy us (graph)", "vs copy", "self-ratio"]
    rows = []
    for case in verdict.get("cases", []):
        row = [case["id"], case["band"], case["bytes"]]
        for mode in modes:
            t = case.get("timings", {}).get(mode, {})
            o = t.get("orig") or {}
            row += [o.get("median_us"), f"{o.get('p10_us', 0):.2f}-{o.get('p90_us', 0):.2f}" if o else "-",
                    _pct(case.get("roofline", {}).get(mode, {}).get("orig_fraction"))]
        graph = case.get("timings", {}).get("graph", {}).get("orig") or {}
        copy = case.get("copy_us")
        row += [copy, (graph.get("median_us") / copy) if copy and graph else None,
                case.get("timings", {}).get(modes[0], {}).get("speedup") if modes else None]
        rows.append(row)
    return "\n".join([table.render(headers, rows, max_width=60), _environment(verdict),
                      "self-ratio: the original timed against itself, interleaved (1.0 = no drift)"])


def _bands(verdict: dict) -> str:
    lines = []
    for mode, bands in verdict.get("band_speedups", {}).items():
        parts = [f"{band} x{value:.3f}" for band, value in bands.items() if value and math.isfinite(value)]
        lines.append(f"speedup ({mode}, geomean): " + ", ".join(parts))
    return "\n".join(lines)


def _environment(verdict: dict) -> str:
    env = verdict.get("env", {})
    if not env:
        return ""
    bw = env.get("copy_bandwidth_Bps") or env.get("copy_bandwidth")
    bw_text = f", copy {bw / 1e12:.2f} TB/s" if isinstance(bw, (int, float)) else ""
    phases = verdict.get("phases", {})
    phase_text = ", ".join(f"{k} {v:.1f}s" for k, v in phases.items() if isinstance(v, (int, float)))
    return (f"GPU: {env.get('gpu')} (sm {env.get('capability')}), driver {env.get('driver')}, "
            f"CUDA runtime {env.get('cuda_runtime')}, nvcc {env.get('nvcc')}, "
            f"torch {env.get('torch')}, tvm-ffi {env.get('tvm_ffi')}{bw_text}" + (f"; time: {phase_text}" if phase_text else ""))
