"""A static HTML report of one optimize run: no server, no external assets, one file.

Sections: the trajectory (round, change, verdict, speedup, kept), per round the profile's symptoms, the
plan and the passes applied (where the agent plans), the original against the best per
shape (both timing modes, x above the practical floor), a chart (inline SVG from astra.report), and
each agent role's input and output (the LLM roles from transcript.jsonl, an exec agent's rounds from
their folders). Every number comes from the run directory's verdicts.
"""

from __future__ import annotations

import html
import json
from pathlib import Path

from astra.optimize.baseline_store import origin_text
from astra.optimize.loop import band_wins_line
from astra.optimize.rundir import RunDir
from astra.report import baseline
from astra.report.run_text import round_plans, step_line
from astra.text import printable
from harness import Verdict

_STYLE = """
body { font-family: system-ui, sans-serif; margin: 2em; color: #222; }
table { border-collapse: collapse; margin: 1em 0; font-size: 13px; }
th, td { border: 1px solid #ccc; padding: 3px 8px; text-align: right; }
th { background: #f2f2f2; } td.l, th.l { text-align: left; }
tr.kept td { background: #eaf7ea; } .bad { color: #b00; }
"""


def _cell(value, left: bool = False) -> str:
    if isinstance(value, float):
        value = f"{value:.3f}" if abs(value) < 100 else f"{value:.0f}"
    text = html.escape(printable("-" if value is None else value))
    return f'<td class="l">{text}</td>' if left else f"<td>{text}</td>"


def _table(headers: list[str], rows: list[list], left: int = 1, row_class=None) -> str:
    head = "".join(f'<th class="l">{html.escape(h)}</th>' if i < left else f"<th>{html.escape(h)}</th>"
                   for i, h in enumerate(headers))
    body = []
    for i, row in enumerate(rows):
        cls = f' class="{row_class(i)}"' if row_class and row_class(i) else ""
        body.append(f"<tr{cls}>" + "".join(_cell(v, j < left or isinstance(v, str)) for j, v in enumerate(row))
                    + "</tr>")
    return f"<table><thead><tr>{head}</tr></thead><tbody>{''.join(body)}</tbody></table>"


def trajectory(run: RunDir) -> str:
    state = run.state()
    rows = [[h.round, h.name, h.status, h.score or None, "kept" if h.accepted else "", h.why]
            for h in state.history]
    return _table(["round", "change", "verdict", "x (graph, all)", "kept", "why"], rows, left=0,
                  row_class=lambda i: "kept" if state.history[i].accepted else "")


def plans(run: RunDir) -> str:
    """Per round: the symptoms (band, symptom, evidence, source), the plan in order, the passes applied."""
    parts = []
    for record, entries in round_plans(run.state()):
        head = f"Round {record.round}: {record.agent}, profiled {record.base}"
        rows = [[s.get("band"), s.get("id"), s.get("evidence"), s.get("source")] for s in record.symptoms]
        rows += [[s.get("band"), f"{s.get('id')} (original)", s.get("evidence"), s.get("source")]
                 for s in record.original_symptoms]
        symptoms = _table(["band", "symptom", "evidence", "from"], rows, left=4) if rows else "<p>No symptom found.</p>"
        steps = "".join(f"<li>{html.escape(printable(step_line(p)))}</li>" for p in record.plans)
        notes = "".join(f"<li>{html.escape(printable(n))}</li>" for n in record.notes)
        applied = _table(["#", "pass", "verdict", "x (graph, all)", "kept"],
                         [[f"{h.n:03d}", h.name, h.status, h.score or None, "kept" if h.accepted else ""]
                          for h in entries], left=3) if entries else "<p>No pass applied this round.</p>"
        parts.append(f"<h3>{html.escape(printable(head))}</h3>{symptoms}<p>Plan, in the order tried:</p>"
                     f"<ol>{steps or '<li>no step</li>'}</ol>" + (f"<p>Notes:</p><ul>{notes}</ul>" if notes else "")
                     + applied)
    return "<h2>Profile and plan per round</h2>" + "".join(parts) if parts else ""


def per_shape(verdict: Verdict | None) -> str:
    if not verdict:
        return "<p>No candidate was verified faster than the original; nothing to compare.</p>"
    rows = []
    for case in verdict.timed_cases():
        row = [case.id, case.band]
        for mode in ("graph", "cold"):
            row += [case.median_us(mode, "orig"), case.median_us(mode, "cand"), case.speedup(mode)]
        row.append((case.floors.get("graph") or {}).get("cand_x_practical"))
        rows.append(row)
    return _table(["shape", "band", "graph orig us", "graph best us", "graph x", "cold orig us", "cold best us",
                   "cold x", "best x above practical floor (graph)"], rows, left=2)


def _pre(text: str, limit: int = 20000) -> str:
    text = printable(text if len(text) <= limit else text[:limit] + f"\n... ({len(text) - limit} more characters)")
    return f"<pre>{html.escape(text)}</pre>"


def exchanges(run: RunDir, limit: int = 200) -> str:
    """Each role's input and output: one entry per LLM exchange, and per exec-agent round its idea and log."""
    parts = []
    path = run.transcript
    lines = path.read_text(encoding="utf-8", errors="replace").splitlines() if path.is_file() else []
    for number, line in enumerate(lines[:limit], 1):
        try:
            record = json.loads(line)
        except ValueError:
            continue
        prompt = "\n\n".join(f"[{m.get('role')}]\n{m.get('content', '')}" for m in record.get("messages") or []
                             if isinstance(m, dict))
        head = (f"#{number} {record.get('role')} ({record.get('model')}): {record.get('prompt_tokens', 0)} + "
                f"{record.get('completion_tokens', 0)} tokens, {record.get('seconds', 0)} s"
                + (f", error: {record.get('error')}" if record.get("error") else ""))
        parts.append(f"<details><summary>{html.escape(printable(head))}</summary><h4>input</h4>{_pre(prompt)}"
                     f"<h4>output</h4>{_pre(str(record.get('reply') or ''))}</details>")
    for folder in sorted((run.root / "agent").glob("round-*")) if (run.root / "agent").is_dir() else []:
        idea = folder / "IDEA.txt"
        log = folder / "agent.log"
        head = f"{folder.name}: " + (idea.read_text(errors="replace").strip()[:200] if idea.is_file() else "no IDEA.txt")
        parts.append(f"<details><summary>{html.escape(printable(head))}</summary><h4>input</h4>"
                     f"<p>the folder {html.escape(printable(str(folder)))} (README.md, best.md, failures.md, ...)</p>"
                     f"<h4>output</h4>{_pre(log.read_text(errors='replace')[-8000:] if log.is_file() else 'no agent.log')}"
                     "</details>")
    return "".join(parts) or "<p>No agent exchange recorded (the offline search has no prompts).</p>"


def search(run: RunDir, limit: int = 400) -> str:
    """The offline parameter search's screenings (search.log), when the run had one."""
    path = run.search_log
    if not path.is_file():
        return ""
    lines = path.read_text(encoding="utf-8", errors="replace").splitlines()
    more = (f"<p>... {len(lines) - limit} more line(s) in {html.escape(printable(str(path)))}</p>"
            if len(lines) > limit else "")
    return f"<h2>Parameter search: every screened point</h2>{_pre(chr(10).join(lines[:limit]), limit=200_000)}{more}"


def render(run: RunDir) -> str:
    state = run.state()
    best = run.candidate(state.best)[2] if state.best else None
    chart_source = {"best": baseline.roofline_points(best, "cand")} if best else {}
    original = run.baseline()
    if original is not None:
        chart_source = {"original": baseline.roofline_points(original, "orig"), **chart_source}
    title = f"Astra run {state.run_id}"
    summary = (f"Kernel <b>{html.escape(printable(state.kernel))}</b> from SGLang "
               f"{html.escape(printable(state.sglang_version))}, agent "
               f"{html.escape(printable(state.agent))}, {len(state.history)} candidate(s), best: "
               + (f"#{state.best:03d} (x{state.best_score:.3f} overall, graph)" if state.best else "the original")
               + f". Stopped: {html.escape(printable(state.stopped))}.")
    chart = baseline.svg(chart_source) if any(chart_source.values()) else "<p>No timings yet.</p>"
    origin = origin_text(state.baseline_origin)  # where the original's baseline came from (reused or timed)
    origin = f"<p>{html.escape(printable(origin))}</p>" if origin else ""
    return (f"<!doctype html><html><head><meta charset='utf-8'><title>{html.escape(title)}</title>"
            f"<style>{_STYLE}</style></head><body><h1>{html.escape(title)}</h1><p>{summary}</p>"
            f"<p>{html.escape(printable(band_wins_line(run)))}</p>{origin}"
            f"<h2>Trajectory</h2>{trajectory(run)}{plans(run)}<h2>Original against best, per shape</h2>{per_shape(best)}"
            f"<h2>Times against floors</h2>{chart}{search(run)}<h2>Agent roles: input and output</h2>{exchanges(run)}"
            "</body></html>\n")


def write(run: RunDir) -> Path:
    path = run.root / "report.html"
    path.write_text(render(run))
    return path
