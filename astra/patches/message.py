"""The commit message of an Astra patch: subject, why, per-shape evidence, correctness, trailers.

Every number comes from the verdict the harness wrote on the named GPU; nothing here measures.
Free text (`why`) is indented line by line and every other line is flattened to one line without control
characters (astra.patches.scope), so no part of the message can parse as a patch or a trailer.
"""

from __future__ import annotations

import math

from astra.patches import scope
from astra.spec.checks import EXACT_DTYPES
from harness import Verdict

_MODE_TEXT = {
    "graph": "back-to-back launches in a CUDA graph, inputs rotated beyond L2",
    "cold": "one launch per CUDA-event pair, L2 flushed before each",
}


def gpu_name(verdict: Verdict) -> str:
    return verdict.gpu


def short_gpu(verdict: Verdict) -> str:
    return gpu_name(verdict).removeprefix("NVIDIA ").strip() or "unknown GPU"


def subject(spec_name: str, verdict: Verdict) -> str:
    """`[Perf] Speed up NAME JIT kernel (decode 1.12x, H200)`: the band with the best geomean."""
    modes = verdict.modes()
    bands = verdict.band_speedups.get(modes[0], {}) if modes else {}
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


OVER_FLOOR = "n/a*"
OVER_FLOOR_NOTE = ("*: faster than the practical floor the spec's byte count gives, so that count is more than "
                   "these shapes move (a table read at a few rows counted whole, say); no roofline share is claimed.")


def _pct(value) -> str:
    if not isinstance(value, (int, float)) or not math.isfinite(value):
        return "-"
    if value > 1.0:  # a time under the practical floor: the floor is not one for this shape
        return OVER_FLOOR
    return f"{100 * value:.1f}%" if value < 0.1 else f"{100 * value:.0f}%"


def timing_tables(verdict: Verdict) -> list[str]:
    """One markdown table per timing mode over the timed shapes."""
    out: list[str] = []
    for mode in verdict.modes():
        rows = [c for c in verdict.cases if c.timed and mode in c.timings]
        if not rows:
            continue
        out += [f"Timing mode `{mode}` ({_MODE_TEXT.get(mode, 'as named by the harness')}), median:", "",
                "| shape | band | original us | patched us | speedup | % of roofline (orig -> patched) |",
                "|---|---|---:|---:|---:|---:|"]
        for case in rows:
            timing = case.timings[mode]
            roof = case.roofline.get(mode, {})
            dims = ", ".join(f"{k}={v}" for k, v in case.dims.items())
            out.append(f"| {case.label} {case.dtype} {dims} | {case.band} | "
                       f"{_num(timing.orig.median_us)} | {_num(timing.cand.median_us)} | {_num(timing.speedup, 3)}x | "
                       f"{_pct(roof.get('orig_fraction'))} -> {_pct(roof.get('cand_fraction'))} |")
        if any(OVER_FLOOR in line for line in out[-len(rows):]):
            out += ["", OVER_FLOOR_NOTE]
        bands = verdict.band_speedups.get(mode, {})
        if bands:
            out += ["", "Geomean speedup: " + ", ".join(f"{b} {_num(v, 3)}x" for b, v in bands.items())]
        out.append("")
    return out


def environment_line(verdict: Verdict, sglang_version: str) -> str:
    env = verdict.env
    bw = env.get("copy_bandwidth_Bps")
    bw_text = f", copy bandwidth {bw / 1e12:.2f} TB/s" if isinstance(bw, (int, float)) else ""
    return (f"Measured on {gpu_name(verdict)} (sm {env.get('capability', '?')}), driver {env.get('driver', '?')}, "
            f"CUDA runtime {env.get('cuda_runtime', '?')}, nvcc {env.get('nvcc', '?')}, torch {env.get('torch', '?')}, "
            f"tvm-ffi {env.get('tvm_ffi', '?')}{bw_text}; SGLang {sglang_version}.")


def correctness_lines(verdict: Verdict, tolerance: dict, sanitizer_required: bool = True) -> list[str]:
    cases = verdict.cases
    shapes = {tuple(sorted(c.dims.items())) for c in cases}
    dtypes = sorted({c.dtype for c in cases if c.dtype})
    trials = [c.trials for c in cases]
    low, high = min(trials, default=0), max(trials, default=0)
    out = [f"- {len(cases)} cases ({len(shapes)} shapes x dtypes {', '.join(dtypes) or '-'}), all correct; "
           f"{low if low == high else f'{low}-{high}'} input trials per case (fresh seeded inputs, plus a "
           "large-magnitude trial where the spec allows), compared with the original kernel built from the "
           "same SGLang sources with the same flags."]
    for dtype in dtypes:
        tol = tolerance.get(dtype) or {}
        if dtype in EXACT_DTYPES and not tol:
            out.append(f"- {dtype} outputs: compared exactly (no tolerance)")
            continue
        out.append(f"- tolerance {dtype}: atol {tol.get('atol', '?')}, rtol {tol.get('rtol', '?')}, "
                   f"floor {tol.get('floor', '?')}")
    worst = [(name, ref.get("cand"), ref.get("orig")) for c in cases for name, ref in c.reference.items()
             if isinstance(ref.get("cand"), (int, float)) and isinstance(ref.get("orig"), (int, float))]
    if worst:
        name, cand, orig = max(worst, key=lambda w: w[1])
        out.append(f"- float64 reference: worst patched error {cand:.3g} ({name}; original {orig:.3g} on that case)")
    out.append("- " + sanitizer_text(verdict, sanitizer_required))
    out.append("- " + sandbox_text(verdict))
    return out


def sandbox_text(verdict: Verdict) -> str:
    """Whether the candidate ran inside the OS sandbox (harness.sandbox), as its verdict records."""
    if verdict.sandbox == "enforced":
        return "OS sandbox (Landlock + seccomp): enforced on every process that ran the candidate"
    return f"OS sandbox: {verdict.sandbox}" if verdict.sandbox else "OS sandbox: not recorded by the verdict"


def sanitizer_clean(verdict: Verdict) -> bool:
    """compute-sanitizer ran (at least one tool), found nothing, and skipped nothing."""
    report = verdict.sanitizer or {}
    return bool(report.get("runs")) and not report.get("findings") and not report.get("skipped")


def sanitizer_text(verdict: Verdict, required: bool = True) -> str:
    report = verdict.sanitizer
    if not required and not sanitizer_clean(verdict) and not (report or {}).get("findings"):
        partial = ""
        if report and report.get("runs"):
            tools = ", ".join(str(r.get("tool", "?")) for r in report["runs"])
            partial = f"; partial: {tools} ran, {report.get('skipped') or 'nothing'} skipped"
        elif report and report.get("skipped"):
            partial = f"; {report['skipped']}"
        return f"compute-sanitizer: not run (--no-sanitizer){partial}"
    if not report:
        return "compute-sanitizer: not run"
    if report.get("findings"):
        return f"compute-sanitizer: {len(report['findings'])} finding(s)"
    if not report.get("runs"):
        return f"compute-sanitizer: not run ({report.get('skipped') or 'no tools ran'})"
    tools = ", ".join(str(r.get("tool", "?")) for r in report["runs"])
    text = f"compute-sanitizer ({tools}): no findings"
    if report.get("skipped"):
        text += f" (inconclusive: {report['skipped']})"
    return text


def message(*, spec_name: str, verdict: Verdict, why: str, repo_path: str, package_path: str, base_sha: str,
            patched_sha: str, sglang_version: str, tolerance: dict, sanitizer_required: bool = True) -> str:
    """The full commit message (subject, blank line, body, blank line, trailers). `why` is free text:
    indented; every other line is flattened (scope.one_line), and a last guard indents any line that
    would still start a patch."""
    why_lines = scope.free_text(why) or [scope.INDENT + "(no description)"]
    head = [scope.one_line(subject(spec_name, verdict))]
    body = ["", environment_line(verdict, sglang_version), ""]
    body += timing_tables(verdict)
    body += ["Correctness:", *correctness_lines(verdict, tolerance, sanitizer_required), "",
             "Measured and checked with Astra. The trailers let `astra apply` check the file this patch "
             "expects and `astra recheck` re-verify it after an SGLang upgrade.", "",
             f"Astra-Spec: {spec_name}",
             f"Astra-Kernel-File: {repo_path}",
             f"Astra-Package-File: {package_path}",
             f"Astra-Base-SHA256: {base_sha}",
             f"Astra-Patched-SHA256: {patched_sha}",
             f"Astra-SGLang-Version: {sglang_version}",
             f"Astra-GPU: {gpu_name(verdict)}"]
    if not sanitizer_clean(verdict):
        body.append("Astra-Sanitizer: skipped")
    lines = head + [""] + why_lines + [scope.one_line(line) for line in body]
    return "\n".join(scope.guard(lines)) + "\n"
