"""The commit message of an Astra patch: subject, why, per-shape evidence, correctness, trailers.

Every number comes from the verdict the harness wrote on the named GPU; nothing here measures.
"""

from __future__ import annotations

import math

_MODE_TEXT = {
    "graph": "back-to-back launches in a CUDA graph, inputs rotated beyond L2",
    "cold": "one launch per CUDA-event pair, L2 flushed before each",
}


def modes_of(verdict: dict) -> list[str]:
    """Timing modes with data in the verdict, graph first."""
    found = {m for case in verdict.get("cases", []) for m in case.get("timings", {})}
    return [m for m in ("graph", "cold") if m in found] + sorted(found - {"graph", "cold"})


def gpu_name(verdict: dict) -> str:
    return str((verdict.get("env") or {}).get("gpu") or "unknown GPU")


def short_gpu(verdict: dict) -> str:
    return gpu_name(verdict).removeprefix("NVIDIA ").strip() or "unknown GPU"


def subject(spec_name: str, verdict: dict) -> str:
    """`[Perf] Speed up NAME JIT kernel (decode 1.12x, H200)`: the band with the best geomean."""
    modes = modes_of(verdict)
    bands = (verdict.get("band_speedups") or {}).get(modes[0], {}) if modes else {}
    named = {b: v for b, v in bands.items() if b != "all" and isinstance(v, (int, float)) and math.isfinite(v)}
    if named:
        band, value = max(named.items(), key=lambda kv: kv[1])
        gain = f"{band} {value:.2f}x"
    elif isinstance(bands.get("all"), (int, float)):
        gain = f"{bands['all']:.2f}x"
    else:
        gain = "speed not measured"
    return f"[Perf] Speed up {spec_name} JIT kernel ({gain}, {short_gpu(verdict)})"


def _num(value, digits: int = 2) -> str:
    return "-" if not isinstance(value, (int, float)) or not math.isfinite(value) else f"{value:.{digits}f}"


def _pct(value) -> str:
    if not isinstance(value, (int, float)) or not math.isfinite(value):
        return "-"
    return f"{100 * value:.1f}%" if value < 0.1 else f"{100 * value:.0f}%"


def timing_tables(verdict: dict) -> list[str]:
    """One markdown table per timing mode over the timed shapes."""
    out: list[str] = []
    for mode in modes_of(verdict):
        rows = [c for c in verdict.get("cases", []) if c.get("timed") and mode in c.get("timings", {})]
        if not rows:
            continue
        out += [f"Timing mode `{mode}` ({_MODE_TEXT.get(mode, 'as named by the harness')}), median:", "",
                "| shape | band | original us | patched us | speedup | % of roofline (orig -> patched) |",
                "|---|---|---:|---:|---:|---:|"]
        for case in rows:
            t = case["timings"][mode]
            roof = (case.get("roofline") or {}).get(mode, {})
            dims = ", ".join(f"{k}={v}" for k, v in (case.get("dims") or {}).items())
            orig_us, cand_us = (t.get("orig") or {}).get("median_us"), (t.get("cand") or {}).get("median_us")
            out.append(f"| {case.get('label', '')} {case.get('dtype', '')} {dims} | {case.get('band', '')} | "
                       f"{_num(orig_us)} | {_num(cand_us)} | {_num(t.get('speedup'), 3)}x | "
                       f"{_pct(roof.get('orig_fraction'))} -> {_pct(roof.get('cand_fraction'))} |")
        bands = (verdict.get("band_speedups") or {}).get(mode, {})
        if bands:
            out += ["", "Geomean speedup: " + ", ".join(f"{b} {_num(v, 3)}x" for b, v in bands.items())]
        out.append("")
    return out


def environment_line(verdict: dict, sglang_version: str) -> str:
    env = verdict.get("env") or {}
    bw = env.get("copy_bandwidth_Bps")
    bw_text = f", copy bandwidth {bw / 1e12:.2f} TB/s" if isinstance(bw, (int, float)) else ""
    return (f"Measured on {gpu_name(verdict)} (sm {env.get('capability', '?')}), driver {env.get('driver', '?')}, "
            f"CUDA runtime {env.get('cuda_runtime', '?')}, nvcc {env.get('nvcc', '?')}, torch {env.get('torch', '?')}, "
            f"tvm-ffi {env.get('tvm_ffi', '?')}{bw_text}; SGLang {sglang_version}.")


def correctness_lines(verdict: dict, tolerance: dict) -> list[str]:
    cases = verdict.get("cases", [])
    shapes = {tuple(sorted((c.get("dims") or {}).items())) for c in cases}
    dtypes = sorted({c.get("dtype") for c in cases if c.get("dtype")})
    trials = [c.get("trials") or 0 for c in cases]
    low, high = min(trials, default=0), max(trials, default=0)
    seeds = (verdict.get("options") or {}).get("seeds")  # recorded by newer harness versions
    seed_text = f"seeds {', '.join(map(str, seeds))}" if seeds else "the seeds"
    out = [f"- {len(cases)} cases ({len(shapes)} shapes x dtypes {', '.join(dtypes) or '-'}), all correct; "
           f"{low if low == high else f'{low}-{high}'} input trials per case ({seed_text}, plus a "
           "large-magnitude trial where the spec allows), compared with the original kernel built from the "
           "same SGLang sources with the same flags."]
    for dtype in dtypes:
        tol = tolerance.get(dtype) or {}
        out.append(f"- tolerance {dtype}: atol {tol.get('atol', '?')}, rtol {tol.get('rtol', '?')}, "
                   f"floor {tol.get('floor', '?')}")
    worst = [(name, ref.get("cand"), ref.get("orig")) for c in cases for name, ref in (c.get("reference") or {}).items()
             if isinstance(ref.get("cand"), (int, float)) and isinstance(ref.get("orig"), (int, float))]
    if worst:
        name, cand, orig = max(worst, key=lambda w: w[1])
        out.append(f"- float64 reference: worst patched error {cand:.3g} ({name}; original {orig:.3g} on that case)")
    out.append("- " + sanitizer_text(verdict))
    return out


def sanitizer_text(verdict: dict) -> str:
    report = verdict.get("sanitizer")
    if not report:
        return "compute-sanitizer: not run"
    if report.get("findings"):
        return f"compute-sanitizer: {len(report['findings'])} finding(s)"
    if not report.get("runs"):
        return f"compute-sanitizer: not run ({report.get('skipped') or 'no tools ran'})"
    tools = ", ".join(r.get("tool", "?") for r in report["runs"])
    text = f"compute-sanitizer ({tools}): no findings"
    if report.get("skipped"):
        text += f" (inconclusive: {report['skipped']})"
    return text


def message(*, spec_name: str, verdict: dict, why: str, repo_path: str, package_path: str, base_sha: str,
            patched_sha: str, sglang_version: str, tolerance: dict) -> str:
    """The full commit message (subject, blank line, body, blank line, trailers)."""
    body = [subject(spec_name, verdict), "", why.strip(), "",
            environment_line(verdict, sglang_version), ""]
    body += timing_tables(verdict)
    body += ["Correctness:", *correctness_lines(verdict, tolerance), "",
             "Measured and checked with Astra. The trailers let `astra apply` check the file this patch "
             "expects and `astra recheck` re-verify it after an SGLang upgrade.", "",
             f"Astra-Spec: {spec_name}",
             f"Astra-Kernel-File: {repo_path}",
             f"Astra-Package-File: {package_path}",
             f"Astra-Base-SHA256: {base_sha}",
             f"Astra-Patched-SHA256: {patched_sha}",
             f"Astra-SGLang-Version: {sglang_version}",
             f"Astra-GPU: {gpu_name(verdict)}"]
    return "\n".join(body) + "\n"
