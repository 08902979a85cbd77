"""The survey as one static, self-contained HTML page: no script, no external asset, no network.

Sections: what was measured (GPU, SGLang, view, mix, formula), the ranked bar chart of recoverable time,
the ranking table (rows `tr.rank-row`), kernels not ranked and why, and per kernel a chart of its time
against its physical and practical floors across token counts (astra.survey.svg).
"""

from __future__ import annotations

import html
from pathlib import Path

from astra.survey import svg
from astra.survey.rank import Ranking
from astra.survey.summary import header_lines, limit_rows, meta, worst_text
from astra.text import printable

_STYLE = """
body { font-family: system-ui, sans-serif; margin: 2em; color: #222; }
table { border-collapse: collapse; margin: 1em 0; font-size: 13px; }
th, td { border: 1px solid #ccc; padding: 3px 8px; text-align: right; vertical-align: top; }
th { background: #f2f2f2; } td.l, th.l { text-align: left; }
tr.cold td { color: #777; } .charts { display: flex; flex-wrap: wrap; gap: 12px; }
.charts figure { margin: 0; border: 1px solid #eee; padding: 4px; }
figcaption { font-size: 12px; color: #555; max-width: 430px; }
"""


def _e(value) -> str:
    return html.escape(printable(value))


def _num(value) -> str:
    if value is None:
        return "-"
    return f"{value:.3g}" if abs(value) < 1000 else f"{value:,.0f}"


def _ranking_table(rows) -> str:
    head = ("<tr><th>#</th><th class='l'>kernel</th><th class='l'>spec</th><th>recoverable us/step</th>"
            "<th>score</th><th>geomean x practical</th><th class='l'>worst case</th><th class='l'>gates</th></tr>")
    body = []
    for i, r in enumerate(x for x in rows if x.status == "ranked"):
        status = _e(r.reach.get("status", "unknown"))
        body.append(f"<tr class='rank-row {status}'><td>{i + 1}</td><td class='l'><a href='#k-{_e(r.name)}'>"
                    f"{_e(r.name)}</a></td><td class='l'>{_e(r.kind)}</td><td>{_num(r.recoverable_us)}</td>"
                    f"<td>{_num(r.score)}</td><td>{_num(r.geomean_x)}</td><td class='l'>{_e(worst_text(r))}</td>"
                    f"<td class='l'>{_e(r.gates)}</td></tr>")
    return f"<table class='ranking'><thead>{head}</thead><tbody>{''.join(body)}</tbody></table>"


def _rest_table(rows) -> str:
    rest = [r for r in rows if r.status != "ranked"]
    if not rest:
        return ""
    body = "".join(f"<tr class='unranked-row'><td class='l'>{_e(r.name)}</td><td class='l'>{_e(r.status)}</td>"
                   f"<td class='l'>{_e('; '.join(r.notes) or '-')}</td><td class='l'>{_e(r.gates)}</td></tr>"
                   for r in rest)
    return ("<h2>Not ranked</h2><table><thead><tr><th class='l'>kernel</th><th class='l'>status</th>"
            f"<th class='l'>why</th><th class='l'>gates</th></tr></thead><tbody>{body}</tbody></table>")


def _charts(ranking: Ranking, rows) -> str:
    figures = []
    for r in (x for x in rows if x.status == "ranked"):
        caption = (f"recoverable {_num(r.recoverable_us)} us/step, geomean x{_num(r.geomean_x)} above the practical "
                   f"floor; {_e(r.gates)}" + (f"; {_e('; '.join(r.notes))}" if r.notes else ""))
        figures.append(f"<figure id='k-{_e(r.name)}'>{svg.floor_chart(r, ranking.view)}"
                       f"<figcaption>{caption}</figcaption></figure>")
    return f"<div class='charts'>{''.join(figures)}</div>" if figures else "<p>No kernel has floors to plot.</p>"


def page(ranking: Ranking, store: Path | str | None = None, top: int | None = None) -> str:
    info = meta(ranking, store)
    rows = limit_rows(ranking.kernels, top)
    title = f"Astra survey: {', '.join(info['gpus']) or 'unknown GPU'}, SGLang {', '.join(info['sglang_versions']) or '?'}"
    header = "".join(f"<li>{_e(line)}</li>" for line in header_lines(ranking, info))
    problems = "".join(f"<li>{_e(p)}</li>" for p in ranking.problems)
    return (f"<!doctype html><html lang='en'><head><meta charset='utf-8'><title>{_e(title)}</title>"
            f"<style>{_STYLE}</style></head><body><h1>{_e(title)}</h1><ul>{header}</ul>"
            "<p>Recoverable time: per kernel, the time above its practical floor, averaged over the model shapes "
            "and dtypes of its suite and weighted over token counts by the serving mix; the score multiplies it by "
            "the reach factor (a kernel with no call site in sglang/srt, or only gated ones, sinks).</p>"
            f"<h2>Ranking</h2>{svg.bar_chart(rows)}{_ranking_table(rows)}{_rest_table(rows)}"
            f"<h2>Time against floors</h2>{_charts(ranking, rows)}"
            + (f"<h2>Store problems</h2><ul>{problems}</ul>" if problems else "") + "</body></html>\n")
