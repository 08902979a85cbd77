"""Inline SVG charts of a survey, written by hand (no plotting library, no script, no external asset):
the ranked bar chart of recoverable time, and one kernel's time against its floors across token counts."""

from __future__ import annotations

import html
import math

from astra.survey.rank import KernelRank
from astra.text import printable

_REACH_COLORS = {"warm": "#1f77b4", "gated": "#ff7f0e", "cold": "#9a9a9a", "unknown": "#8c564b"}
_SERIES = (("time_us", "time (original)", "#1f77b4", ""),
           ("practical_us", "practical floor", "#d62728", "6 3"),
           ("physical_us", "physical floor", "#2ca02c", "2 3"))


def _esc(text) -> str:
    return html.escape(printable(text))


def _fmt(us: float) -> str:
    return f"{us:.3g}" if us < 1000 else f"{us:,.0f}"


def bar_chart(rows: list[KernelRank], width: int = 900) -> str:
    """Ranked kernels as horizontal bars: pale = recoverable us per weighted step, solid = the score
    (recoverable x reach factor) the order follows; colour = reach (warm, gated, cold, unknown)."""
    rows = [r for r in rows if r.status == "ranked"]
    left, right, top, bar, gap = 190, 120, 34, 16, 6
    height = top + max(1, len(rows)) * (bar + gap) + 40
    plot = width - left - right
    peak = max([r.recoverable_us or 0.0 for r in rows] + [1e-9])
    parts = [f'<svg xmlns="http://www.w3.org/2000/svg" class="chart ranking-chart" width="{width}" '
             f'height="{height}" font-family="sans-serif" font-size="12" role="img">',
             '<title>Recoverable time per weighted step, ranked</title>',
             f'<text x="{left}" y="18" font-size="14">recoverable us per weighted step (pale) and reach-weighted '
             'score (solid), ranked</text>']
    if not rows:
        parts.append(f'<text x="{left}" y="{top + 14}">no ranked kernel</text>')
    for i, row in enumerate(rows):
        y = top + i * (bar + gap)
        color = _REACH_COLORS.get(row.reach.get("status"), _REACH_COLORS["unknown"])
        raw = plot * (row.recoverable_us or 0.0) / peak
        score = plot * (row.score or 0.0) / peak
        parts += [f'<text x="{left - 8}" y="{y + bar - 4}" text-anchor="end">{i + 1}. {_esc(row.name)}</text>',
                  f'<rect x="{left}" y="{y}" width="{max(raw, 1):.1f}" height="{bar}" fill="{color}" '
                  'fill-opacity="0.3"/>',
                  f'<rect x="{left}" y="{y}" width="{max(score, 1):.1f}" height="{bar}" fill="{color}"/>',
                  f'<text x="{left + max(raw, score, 1) + 6:.1f}" y="{y + bar - 4}">'
                  f'{_fmt(row.recoverable_us or 0.0)} us ({_esc(row.reach.get("status"))})</text>']
    ly = height - 16
    for j, (status, color) in enumerate(_REACH_COLORS.items()):
        x = left + j * 110
        parts += [f'<rect x="{x}" y="{ly - 10}" width="12" height="12" fill="{color}"/>',
                  f'<text x="{x + 16}" y="{ly}">{status}</text>']
    parts.append("</svg>")
    return "\n".join(parts)


def floor_chart(row: KernelRank, view: str, width: int = 430, height: int = 260) -> str:
    """One kernel: mean time, practical and physical floor (us, log scale) against token count (log2)."""
    left, right, top, bottom = 56, 14, 30, 58
    pw, ph = width - left - right, height - top - bottom
    curve = row.curve
    values = [c[key] for c in curve for key, *_ in _SERIES if c.get(key)]
    tokens = [c["tokens"] for c in curve] or [1]
    tmin, tmax = math.log2(min(tokens)), math.log2(max(tokens))
    tmax = tmax if tmax > tmin else tmin + 1
    vmin = math.floor(math.log10(min(values))) if values else 0
    vmax = max(vmin + 1, math.ceil(math.log10(max(values)))) if values else 1

    def x(t: float) -> float:
        return left + pw * (math.log2(t) - tmin) / (tmax - tmin)

    def y(us: float) -> float:
        return top + ph * (1 - (math.log10(us) - vmin) / (vmax - vmin))

    parts = [f'<svg xmlns="http://www.w3.org/2000/svg" class="chart floor-chart" width="{width}" height="{height}" '
             'font-family="sans-serif" font-size="11" role="img">',
             f'<title>{_esc(row.name)}: time against floors ({view})</title>',
             f'<text x="{left}" y="16" font-size="13">{_esc(row.name)} ({view}, mean over families)</text>',
             f'<rect x="{left}" y="{top}" width="{pw}" height="{ph}" fill="none" stroke="#444"/>']
    for decade in range(vmin, vmax + 1):
        yy = y(10.0 ** decade)
        parts += [f'<line x1="{left}" x2="{left + pw}" y1="{yy:.1f}" y2="{yy:.1f}" stroke="#e3e3e3"/>',
                  f'<text x="{left - 6}" y="{yy + 4:.1f}" text-anchor="end">{_fmt(10.0 ** decade)}</text>']
    for t in tokens:
        parts.append(f'<text x="{x(t):.1f}" y="{top + ph + 14}" text-anchor="middle">{t}</text>')
    parts.append(f'<text x="{left + pw / 2}" y="{top + ph + 28}" text-anchor="middle">tokens (log scale); '
                 'us (log scale)</text>')
    for key, name, color, dash in _SERIES:
        pts = [(c["tokens"], c[key]) for c in curve if c.get(key)]
        if not pts:
            continue
        path = " ".join(f"{x(t):.1f},{y(v):.1f}" for t, v in pts)
        dashed = f' stroke-dasharray="{dash}"' if dash else ""
        parts.append(f'<polyline fill="none" stroke="{color}" stroke-width="2"{dashed} points="{path}"/>')
        if key == "time_us":  # the dot's area grows with the mix's weight at that token count
            parts += [f'<circle cx="{x(c["tokens"]):.1f}" cy="{y(c[key]):.1f}" '
                      f'r="{2 + 5 * math.sqrt(max(0.0, min(1.0, c["weight"]))):.1f}" fill="{color}" fill-opacity="0.6"/>'
                      for c in curve if c.get(key)]
    for j, (_, name, color, dash) in enumerate(_SERIES):
        lx = left + j * 125
        ly = height - 10
        dashed = f' stroke-dasharray="{dash}"' if dash else ""
        parts += [f'<line x1="{lx}" x2="{lx + 18}" y1="{ly - 4}" y2="{ly - 4}" stroke="{color}" stroke-width="2"{dashed}/>',
                  f'<text x="{lx + 22}" y="{ly}">{name}</text>']
    parts.append("</svg>")
    return "\n".join(parts)
