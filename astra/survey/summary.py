"""A survey's ranking as a terminal table, markdown and JSON (the HTML page: astra.survey.html; the
files: astra.survey.report)."""

from __future__ import annotations

import json
from pathlib import Path

from astra.report import table
from astra.survey import reach as reach_mod
from astra.survey.rank import FORMULA, KernelRank, Ranking
from astra.text import one_line


def meta(ranking: Ranking, store: Path | str | None = None) -> dict:
    """Where the numbers come from: the store, the GPUs and SGLang versions of the records, counts."""
    return {"store": None if store is None else str(store),
            "gpus": sorted({k.gpu for k in ranking.kernels if k.gpu}),
            "sglang_versions": sorted({k.sglang_version for k in ranking.kernels if k.sglang_version}),
            "kernels": len(ranking.kernels), "ranked": len(ranking.ranked()), "view": ranking.view,
            "mix": ranking.mix.name}


def worst_text(row: KernelRank) -> str:
    w = row.worst
    return "-" if not w else f"{w['id']} x{w['x']:.2f} (+{w['excess_us']:.3g} us)"


def limit_rows(rows: list[KernelRank], top: int | None) -> list[KernelRank]:
    ranked = [r for r in rows if r.status == "ranked"]
    rest = [r for r in rows if r.status != "ranked"]
    return (ranked[:top] if top else ranked) + rest


def header_lines(ranking: Ranking, info: dict) -> list[str]:
    mix = ranking.mix
    return [f"view: {ranking.view}; mix: {mix.name}" + (f" ({mix.description})" if mix.description else ""),
            f"GPU: {', '.join(info['gpus']) or 'unknown'}; SGLang: {', '.join(info['sglang_versions']) or 'unknown'}; "
            f"{info['ranked']} of {info['kernels']} kernel(s) ranked" + (f"; store: {info['store']}" if info['store'] else ""),
            f"{FORMULA}; reach factors: " + ", ".join(f"{k} {v:g}" for k, v in reach_mod.REACH_FACTORS.items())]


def text(ranking: Ranking, store: Path | str | None = None, top: int | None = None) -> str:
    """The terminal table: ranked kernels (the first `top`), then unranked and failed ones with why."""
    info = meta(ranking, store)
    rows = limit_rows(ranking.kernels, top)
    ranked = [[i + 1, r.name, r.kind, r.recoverable_us, r.score, r.geomean_x, worst_text(r), r.gates]
              for i, r in enumerate(rows) if r.status == "ranked"]
    out = header_lines(ranking, info)
    if ranked:
        out += ["", table.render(["#", "kernel", "spec", "recoverable us/step", "score", "geomean x practical",
                                  "worst case", "gates"], ranked, align="rllrrrll", max_width=70)]
    rest = [[r.name, r.status, "; ".join(r.notes) or "-", r.gates] for r in rows if r.status != "ranked"]
    if rest:
        out += ["", "not ranked:", table.render(["kernel", "status", "why", "gates"], rest, max_width=90)]
    out += [f"store problem: {p}" for p in ranking.problems]
    return "\n".join(out)


def _md(value) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        return f"{value:.3g}" if abs(value) < 1000 else f"{value:,.0f}"
    return one_line(value, 400).replace("|", "\\|")


def markdown(ranking: Ranking, store: Path | str | None = None, top: int | None = None) -> str:
    info = meta(ranking, store)
    rows = limit_rows(ranking.kernels, top)
    lines = ["# Survey: time above the practical floor, ranked", "",
             *[f"- {line}" for line in header_lines(ranking, info)],
             "- Each (model shape, dtype) family of a kernel's suite counts once (arithmetic mean of us at each "
             "token count); the mix weights token counts (moved to the nearest count of the suite).",
             "- A draft is timed on what `astra extract` guessed (its `TODO(review)` markers: dims, template "
             "arguments, scalars); review a draft near the top before trusting its rank (`astra spec-check NAME` "
             "lists the guesses).", "",
             "| # | kernel | spec | recoverable us/step | score | geomean x practical | worst case | gates |",
             "|---:|---|---|---:|---:|---:|---|---|"]
    for i, r in enumerate(x for x in rows if x.status == "ranked"):
        lines.append(f"| {i + 1} | {_md(r.name)} | {r.kind} | {_md(r.recoverable_us)} | {_md(r.score)} | "
                     f"{_md(r.geomean_x)} | {_md(worst_text(r))} | {_md(r.gates)} |")
    rest = [r for r in rows if r.status != "ranked"]
    if rest:
        lines += ["", "## Not ranked", "", "| kernel | status | why | gates |", "|---|---|---|---|"]
        lines += [f"| {_md(r.name)} | {r.status} | {_md('; '.join(r.notes) or '-')} | {_md(r.gates)} |" for r in rest]
    noted = [r for r in rows if r.status == "ranked" and r.notes]
    if noted:
        lines += ["", "## Notes", ""] + [f"- {_md(r.name)}: {_md('; '.join(r.notes))}" for r in noted]
    if ranking.problems:
        lines += ["", "## Store problems", ""] + [f"- {_md(p)}" for p in ranking.problems]
    return "\n".join(lines) + "\n"


def to_json(ranking: Ranking, store: Path | str | None = None) -> str:
    return json.dumps({**ranking.to_dict(), "meta": meta(ranking, store)}, indent=1, allow_nan=False)
