"""Baseline reports from `astra bench` verdicts: a markdown table, the JSON, and an SVG plot of each
kernel's time against its two floors over tokens (written by hand: no plotting dependency on a GPU box).

Every number names its view (`graph`: back-to-back in a CUDA graph over rotating inputs; `cold`: one
launch between events after an L2 flush). The floors come from harness.timing.roofline: `physical` (bytes that
must cross DRAM at the device's peak, or an empty launch: nothing legitimate is faster) and `practical`
(bytes read and written at the measured read and write bandwidths); "x pract" is time / practical."""

from __future__ import annotations

import json
import math
from pathlib import Path

from harness import CaseResult, Verdict

_COLORS = ["#1f77b4", "#d62728", "#2ca02c", "#9467bd", "#ff7f0e", "#8c564b", "#e377c2", "#17becf"]
VIEWS = ("graph", "cold")


def _tokens(case: CaseResult) -> int:
    return int(case.dims.get("tokens", next(iter(case.dims.values()), 1)))


def _floor(case: CaseResult, view: str, key: str) -> float | None:
    value = (case.floors.get(view) or {}).get(key)
    return value if isinstance(value, (int, float)) else None


def _model_line(env: dict) -> str:
    model = env.get("perf_model") if isinstance(env.get("perf_model"), dict) else None
    if model is None:
        bw = env.get("copy_bandwidth_Bps")
        return f"Copy bandwidth measured in the same worker: {bw / 1e12:.2f} TB/s (a reference, not a floor)." if bw else ""
    tb = {k: (model.get(k) or 0) / 1e12 for k in ("peak_dram_Bps", "floor_Bps", "read_Bps", "write_Bps", "copy_Bps")}
    peak = f"peak DRAM bandwidth {tb['peak_dram_Bps']:.2f} TB/s ({model.get('peak_source')})" \
        if model.get("peak_dram_Bps") else "peak DRAM bandwidth unknown"
    return (f"Performance model: {peak}; physical floors at {tb['floor_Bps']:.2f} TB/s ({model.get('floor_source')}); "
            f"measured read {tb['read_Bps']:.2f}, write {tb['write_Bps']:.2f}, copy {tb['copy_Bps']:.2f} TB/s; "
            f"empty launch {model.get('launch_graph_us', 0):.2f} us (graph), {model.get('launch_cold_us', 0):.2f} us (cold).")


def markdown(verdicts: dict[str, Verdict]) -> str:
    env = next((v.env for v in verdicts.values() if v.env), {})
    lines = [
        "# Baseline: SGLang JIT kernels, original vs its floors",
        "",
        f"Produced by `astra bench` on {env.get('gpu')} (driver {env.get('driver')}, CUDA runtime "
        f"{env.get('cuda_runtime')}, nvcc {env.get('nvcc')}, torch {env.get('torch')}, tvm-ffi {env.get('tvm_ffi')}). "
        + _model_line(env),
        "",
        "`graph`: launches captured in a CUDA graph, rotating over input copies larger than 3x L2. "
        "`cold`: CUDA events around each launch, L2 flushed before each. Medians. `physical` floor: the bytes "
        "that must cross DRAM in that view at peak bandwidth, or an empty launch of that view (nothing "
        "legitimate is faster); `practical` floor: bytes read / read bandwidth + bytes written / write bandwidth "
        "(measured); `x pract` = time / practical floor. `copy` = an elementwise copy kernel over the same bytes "
        "(graph): a reference, not a floor.",
        "",
        "| kernel | shape | bytes read / written | graph us | graph physical us | graph practical us | graph x pract "
        "| cold us | cold physical us | cold practical us | cold x pract | graph / copy |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for name, verdict in verdicts.items():
        for case in verdict.cases:
            shape = ", ".join(f"{k}={v}" for k, v in case.dims.items())
            split = f"{case.bytes_read} / {case.bytes_written}" if case.bytes_read is not None else f"{case.bytes}"
            cells = [name, f"{case.label} {shape}", split]
            for view in VIEWS:
                cells += [_f(case.median_us(view, "orig")), _f(_floor(case, view, "physical_us")),
                          _f(_floor(case, view, "practical_us")), _x(_floor(case, view, "orig_x_practical"))]
            g, copy = case.median_us("graph", "orig"), case.copy_us
            cells.append(_f(g / copy) if g and copy else "-")
            lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def _f(x) -> str:
    return "-" if x is None else (f"{x:.3g}" if x < 100 else f"{x:.0f}")


def _x(x) -> str:
    return "-" if x is None else f"{x:.2f}"


def roofline_points(verdict: Verdict, side: str = "orig", mode: str = "graph") -> list[tuple[int, float]]:
    """(tokens, % of the practical floor reached: 100 x practical / time) of `side` over the timed shapes
    of the verdict's first model label."""
    points = []
    for case in verdict.cases:
        frac = (case.roofline.get(mode) or {}).get(f"{side}_fraction")
        if frac is not None and case.timed:
            points.append((_tokens(case), 100.0 * frac, case.label))
    if not points:
        return []
    first_label = points[0][2]
    return sorted((t, f) for t, f, label in points if label == first_label)


def floor_points(verdict: Verdict, view: str = "graph", side: str = "orig") -> dict[str, list[tuple[int, float]]]:
    """{"time", "practical", "physical"}: (tokens, us) over the timed shapes of the first model label."""
    out: dict[str, list[tuple[int, float]]] = {"time": [], "practical": [], "physical": []}
    first = next((c.label for c in verdict.cases if c.timed and view in c.floors), None)
    for case in verdict.cases:
        if not case.timed or case.label != first or view not in case.floors:
            continue
        for series, key in (("time", f"{side}_us"), ("practical", "practical_us"), ("physical", "physical_us")):
            value = _floor(case, view, key)
            if value and value > 0:
                out[series].append((_tokens(case), value))
    return {k: sorted(v) for k, v in out.items()}


def _axes(width: int, height: int, xs: list[float], ys: list[float], ylog: bool):
    left, right, top, bottom = 60, 190, 30, 50
    pw, ph = width - left - right, height - top - bottom
    tmin, tmax = math.log2(max(1, min(xs or [1]))), math.log2(max(xs or [16384]))
    tmax = tmax if tmax > tmin else tmin + 1
    if ylog:
        ymin, ymax = math.floor(math.log10(min(ys or [1]))), math.ceil(math.log10(max(ys or [10])))
        ymax = max(ymax, ymin + 1)
    else:
        ymin, ymax = 0.0, 110.0

    def x(t):
        return left + pw * (math.log2(max(t, 1)) - tmin) / (tmax - tmin)

    def y(v):
        v = math.log10(max(v, 1e-9)) if ylog else min(v, ymax)
        return top + ph * (1 - (v - ymin) / (ymax - ymin))

    return (left, top, pw, ph, tmin, tmax, ymin, ymax), x, y


def _frame(title: str, geometry, x, y, ylog: bool, width: int, height: int, ylabel: str) -> list[str]:
    left, top, pw, ph, tmin, tmax, ymin, ymax = geometry
    parts = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" font-family="sans-serif" font-size="12">',
             f'<text x="{left}" y="18" font-size="14">{title}</text>',
             f'<rect x="{left}" y="{top}" width="{pw}" height="{ph}" fill="none" stroke="#444"/>']
    ticks = [10 ** e for e in range(int(ymin), int(ymax) + 1)] if ylog else [0, 25, 50, 75, 100]
    for v in ticks:
        parts.append(f'<line x1="{left}" x2="{left + pw}" y1="{y(v):.1f}" y2="{y(v):.1f}" stroke="#ddd"/>')
        parts.append(f'<text x="{left - 8}" y="{y(v) + 4:.1f}" text-anchor="end">{v:g}</text>')
    t = 2 ** int(tmin)
    while t <= 2 ** tmax:
        parts.append(f'<text x="{x(t):.1f}" y="{top + ph + 18}" text-anchor="middle">{t}</text>')
        t *= 4
    parts.append(f'<text x="{left + pw / 2}" y="{height - 10}" text-anchor="middle">tokens (log scale); y: {ylabel}</text>')
    return parts


def _polyline(pts, x, y, color: str, dash: str = "", dots: bool = True) -> list[str]:
    path = " ".join(f"{x(t):.1f},{y(v):.1f}" for t, v in pts)
    style = f' stroke-dasharray="{dash}"' if dash else ""
    out = [f'<polyline fill="none" stroke="{color}" stroke-width="2"{style} points="{path}"/>']
    return out + ([f'<circle cx="{x(t):.1f}" cy="{y(v):.1f}" r="3" fill="{color}"/>' for t, v in pts] if dots else [])


def _legend(i: int, geometry, name: str, color: str, dash: str = "") -> list[str]:
    left, top, pw = geometry[0], geometry[1], geometry[2]
    ly = top + 16 * i + 10
    style = f' stroke-dasharray="{dash}"' if dash else ""
    return [f'<line x1="{left + pw + 12}" x2="{left + pw + 30}" y1="{ly}" y2="{ly}" stroke="{color}" stroke-width="2"{style}/>',
            f'<text x="{left + pw + 34}" y="{ly + 4}">{name}</text>']


def svg(series: dict[str, list[tuple[int, float]]], mode: str = "graph", width: int = 760, height: int = 420) -> str:
    """% of the practical floor reached (y) against tokens (x, log2), one polyline per named series."""
    series = {name: pts for name, pts in series.items() if pts}
    geometry, x, y = _axes(width, height, [t for pts in series.values() for t, _ in pts], [], ylog=False)
    parts = _frame(f"% of the practical floor reached ({mode} view) against tokens", geometry, x, y, False, width,
                   height, "100 x practical floor / time")
    for i, (name, pts) in enumerate(series.items()):
        color = _COLORS[i % len(_COLORS)]
        parts += _polyline(pts, x, y, color) + _legend(i, geometry, name, color)
    return "\n".join(parts + ["</svg>"]) + "\n"


def floors_svg(verdicts: dict[str, Verdict], view: str = "graph", width: int = 760, height: int = 420) -> str:
    """Each kernel's time (solid), practical floor (dashed) and physical floor (dotted) in us (log) against
    tokens (log2), over the timed shapes of its first model label, in one view."""
    data = {name: floor_points(v, view) for name, v in verdicts.items()}
    data = {name: d for name, d in data.items() if d["time"]}
    points = [p for d in data.values() for pts in d.values() for p in pts]
    geometry, x, y = _axes(width, height, [t for t, _ in points], [v for _, v in points], ylog=True)
    parts = _frame(f"original time against its floors ({view} view)", geometry, x, y, True, width, height, "us")
    row = 0
    for i, (name, d) in enumerate(data.items()):
        color = _COLORS[i % len(_COLORS)]
        for series, dash in (("time", ""), ("practical", "6 3"), ("physical", "2 3")):
            if d[series]:
                parts += _polyline(d[series], x, y, color, dash, dots=series == "time")
                parts += _legend(row, geometry, f"{name} {series}", color, dash)
                row += 1
    return "\n".join(parts + ["</svg>"]) + "\n"


def write(verdicts: dict[str, Verdict], out_dir: Path) -> list[Path]:
    """baseline.md, baseline.json and roofline.svg (time against both floors, graph view; for verdicts
    from before the floors, the older % chart) in `out_dir`."""
    out_dir.mkdir(parents=True, exist_ok=True)
    files = [out_dir / "baseline.md", out_dir / "baseline.json", out_dir / "roofline.svg"]
    files[0].write_text(markdown(verdicts))
    files[1].write_text(json.dumps({name: v.to_dict() for name, v in verdicts.items()}, indent=1))
    with_floors = any(case.floors for v in verdicts.values() for case in v.cases)
    files[2].write_text(floors_svg(verdicts) if with_floors  # else verdicts from before the floors
                        else svg({name: roofline_points(v) for name, v in verdicts.items()}))
    return files
