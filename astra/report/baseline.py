"""Baseline reports from `astra bench` verdicts: a markdown table, the JSON, and an SVG plot of
% of roofline against tokens (written by hand: no plotting dependency on a GPU box)."""

from __future__ import annotations

import json
import math
from pathlib import Path

from harness import CaseResult, Verdict

_COLORS = ["#1f77b4", "#d62728", "#2ca02c", "#9467bd", "#ff7f0e", "#8c564b", "#e377c2", "#17becf"]


def _tokens(case: CaseResult) -> int:
    return int(case.dims.get("tokens", next(iter(case.dims.values()), 1)))


def markdown(verdicts: dict[str, Verdict]) -> str:
    env = next((v.env for v in verdicts.values() if v.env), {})
    bw = env.get("copy_bandwidth_Bps")
    lines = [
        "# Baseline: SGLang JIT kernels, original vs roofline",
        "",
        f"Produced by `astra bench` on {env.get('gpu')} (driver {env.get('driver')}, CUDA runtime "
        f"{env.get('cuda_runtime')}, nvcc {env.get('nvcc')}, torch {env.get('torch')}, tvm-ffi {env.get('tvm_ffi')}); "
        f"copy bandwidth measured in the same worker: {bw / 1e12:.2f} TB/s (read + write)." if bw else "",
        "",
        "`graph`: launches captured in a CUDA graph, rotating over input copies larger than 3x L2. "
        "`cold`: CUDA events around each launch, L2 flushed before each. Medians; roofline = bytes the "
        "kernel must move / measured copy bandwidth; `copy` = an elementwise copy kernel over the same bytes "
        "(graph).",
        "",
        "| kernel | shape | bytes | graph us | cold us | roofline us | % roofline (graph) | % roofline (cold) | graph / copy |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for name, verdict in verdicts.items():
        for case in verdict.cases:
            g, c = case.median_us("graph", "orig"), case.median_us("cold", "orig")
            roof = case.roofline
            floor = (roof.get("graph") or roof.get("cold") or {}).get("floor_us")
            pg = (roof.get("graph") or {}).get("orig_fraction")
            pc = (roof.get("cold") or {}).get("orig_fraction")
            copy = case.copy_us
            shape = ", ".join(f"{k}={v}" for k, v in case.dims.items())
            lines.append(f"| {name} | {case.label} {shape} | {case.bytes} | {_f(g)} | {_f(c)} | "
                         f"{_f(floor)} | {_p(pg)} | {_p(pc)} | {_f(g / copy) if g and copy else '-'} |")
    return "\n".join(lines) + "\n"


def _f(x) -> str:
    return "-" if x is None else (f"{x:.3g}" if x < 100 else f"{x:.0f}")


def _p(x) -> str:
    return "-" if x is None else f"{100 * x:.0f}"


def roofline_points(verdict: Verdict, side: str = "orig", mode: str = "graph") -> list[tuple[int, float]]:
    """(tokens, % of roofline) of `side` over the timed shapes of the verdict's first model label."""
    points = []
    for case in verdict.cases:
        frac = (case.roofline.get(mode) or {}).get(f"{side}_fraction")
        if frac is not None and case.timed:
            points.append((_tokens(case), 100.0 * frac, case.label))
    if not points:
        return []
    first_label = points[0][2]
    return sorted((t, f) for t, f, label in points if label == first_label)


def svg(series: dict[str, list[tuple[int, float]]], mode: str = "graph", width: int = 760, height: int = 420) -> str:
    """% of roofline (y) against tokens (x, log2), one polyline per named series."""
    left, right, top, bottom = 60, 170, 30, 50
    pw, ph = width - left - right, height - top - bottom
    series = {name: pts for name, pts in series.items() if pts}
    all_t = [t for pts in series.values() for t, _ in pts] or [1, 16384]
    tmin, tmax = math.log2(max(1, min(all_t))), math.log2(max(all_t))
    tmax = tmax if tmax > tmin else tmin + 1

    def x(t):
        return left + pw * (math.log2(max(t, 1)) - tmin) / (tmax - tmin)

    def y(p):
        return top + ph * (1 - min(p, 110) / 110)

    parts = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" font-family="sans-serif" font-size="12">',
             f'<text x="{left}" y="18" font-size="14">% of roofline ({mode} mode) against tokens</text>',
             f'<rect x="{left}" y="{top}" width="{pw}" height="{ph}" fill="none" stroke="#444"/>']
    for p in (0, 25, 50, 75, 100):
        parts.append(f'<line x1="{left}" x2="{left + pw}" y1="{y(p):.1f}" y2="{y(p):.1f}" stroke="#ddd"/>')
        parts.append(f'<text x="{left - 8}" y="{y(p) + 4:.1f}" text-anchor="end">{p}</text>')
    t = 2 ** int(tmin)
    while t <= 2 ** tmax:
        parts.append(f'<text x="{x(t):.1f}" y="{top + ph + 18}" text-anchor="middle">{t}</text>')
        t *= 4
    parts.append(f'<text x="{left + pw / 2}" y="{height - 10}" text-anchor="middle">tokens (log scale)</text>')
    for i, (name, pts) in enumerate(series.items()):
        color = _COLORS[i % len(_COLORS)]
        path = " ".join(f"{x(tk):.1f},{y(p):.1f}" for tk, p in pts)
        parts.append(f'<polyline fill="none" stroke="{color}" stroke-width="2" points="{path}"/>')
        parts += [f'<circle cx="{x(tk):.1f}" cy="{y(p):.1f}" r="3" fill="{color}"/>' for tk, p in pts]
        ly = top + 16 * i + 10
        parts.append(f'<line x1="{left + pw + 12}" x2="{left + pw + 30}" y1="{ly}" y2="{ly}" stroke="{color}" stroke-width="2"/>')
        parts.append(f'<text x="{left + pw + 34}" y="{ly + 4}">{name}</text>')
    parts.append("</svg>")
    return "\n".join(parts) + "\n"


def write(verdicts: dict[str, Verdict], out_dir: Path) -> list[Path]:
    out_dir.mkdir(parents=True, exist_ok=True)
    files = [out_dir / "baseline.md", out_dir / "baseline.json", out_dir / "roofline.svg"]
    files[0].write_text(markdown(verdicts))
    files[1].write_text(json.dumps({name: v.to_dict() for name, v in verdicts.items()}, indent=1))
    files[2].write_text(svg({name: roofline_points(v) for name, v in verdicts.items()}))
    return files
