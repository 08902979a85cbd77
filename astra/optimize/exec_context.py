"""The folder an `exec:` agent works in, one per round: what the loop knows, as files a coding agent reads.

    <run dir>/agent/round-NNN/
        README.md        the task, the judge's rules, what each file holds (the agent reads this first)
        candidate.cuh    a copy of the best source: the one file the agent edits, in place
        original.cuh     the kernel as SGLang ships it (every candidate is judged against it)
        best.cuh         the best verified source so far (the original until one verifies)
        best.md          the best's verdict per shape: band, original us, best us, speedup, floors; band geomeans
        profile.md       the rest of that verdict: GPU, registers and spills, distance to the floors per band,
                         and whether an Nsight Compute profile exists (the loop does not run one)
        failures.json    the last candidates not accepted (astra.optimize.feedback), and failures.md: why,
                         with each one's diff against the source it edited
        history.md       every candidate of the run: idea, status, score, accepted
        budget.json      rounds_left, wall_left_s, tokens_left, cost_left_usd (null: not set), the time limit
        spec.yaml        the exports, arguments, dtypes, shapes and tolerance the judge uses
        sources/         the SGLang headers the kernel includes (copies; absent when the tree is not known)
        agent.log        the command's stdout and stderr (astra.optimize.exec_agent writes it)

The agent may also write IDEA.txt (one line: the change) and USAGE.json ({"tokens": N, "cost_usd": X}).
The README's fixed text lives here, not in astra/llm/prompts/: it is a document for a tool that
reads files, not a chat prompt, and it is mostly the spec's own data.
"""

from __future__ import annotations

import difflib
import json
import math
import shutil
from pathlib import Path

import yaml

from astra.errors import AstraError
from astra.optimize.loop import Context, source_id
from astra.optimize.rundir import RunDir
from harness import Verdict, policy_text

CANDIDATE = "candidate.cuh"
IDEA = "IDEA.txt"
USAGE = "USAGE.json"
LOG = "agent.log"
SPEC_KEYS = ("name", "description", "source", "build", "entry", "dims", "derived", "dtypes", "arguments", "shapes",
             "tolerance", "bytes")
MAX_ROWS = 80  # shapes per table
MAX_DIFF_LINES = 80


def round_folder(ctx: Context) -> Path:
    """A fresh folder for this round (a resumed round that already has one gets `round-NNN-2`)."""
    base = Path(ctx.run_dir) / "agent" / f"round-{ctx.round:03d}"
    folder, k = base, 1
    while folder.exists():
        k += 1
        folder = base.with_name(f"{base.name}-{k}")
    folder.mkdir(parents=True)
    return folder


def write_round(ctx: Context, spec, command: str, limit_s: float, headers: list[tuple[str, Path]] | None) -> Path:
    """Every file of the round's folder but agent.log; returns the folder."""
    folder = round_folder(ctx)
    run = RunDir(Path(ctx.run_dir))
    files = {
        CANDIDATE: ctx.base_source,
        "original.cuh": ctx.original_source,
        "best.cuh": ctx.base_source,
        "best.md": best_text(ctx),
        "profile.md": profile_text(ctx.base_verdict),
        "failures.json": json.dumps(ctx.failures, indent=1, default=str) + "\n",
        "failures.md": failures_text(ctx, run),
        "history.md": history_text(ctx, run),
        "budget.json": json.dumps(budget(ctx, limit_s), indent=1) + "\n",
        "spec.yaml": yaml.safe_dump({k: spec.raw[k] for k in SPEC_KEYS if k in spec.raw}, sort_keys=False,
                                    allow_unicode=True, width=110),
        "README.md": readme_text(ctx, spec, command, limit_s, bool(headers)),
    }
    for name, text in files.items():
        (folder / name).write_text(text, encoding="utf-8")
    for rel, path in headers or []:
        target = folder / "sources" / rel
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(path, target)
    return folder


def budget(ctx: Context, limit_s: float) -> dict:
    return {"round": ctx.round, "rounds_left": ctx.rounds_left, "wall_left_s": ctx.wall_left_s,
            "tokens_left": ctx.tokens_left, "cost_left_usd": ctx.cost_left_usd, "command_time_limit_s": limit_s}


def _num(value, digits: int = 4) -> str:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        return "-"
    return f"{value:.{digits}g}"


def _best_name(ctx: Context) -> str:
    return "the original (no candidate has verified yet)" if ctx.best_n is None else f"candidate #{ctx.best_n:03d}"


def best_text(ctx: Context) -> str:
    """The best's verdict per shape and timing view, with both floors, and the band geomeans."""
    verdict = ctx.base_verdict
    lines = [f"# The best so far: {_best_name(ctx)}", ""]
    if verdict is None:
        return "\n".join(lines + ["No verdict yet.", ""])
    lines += [f"Verdict: **{verdict.status}**: {verdict.reason}", ""]
    if ctx.best_n is None:
        lines += ["This is the original timed against itself: `original us` and `best us` are the same kernel "
                  "(the spread between them is the measurement noise).", ""]
    timed = verdict.timed_cases()
    if not timed:
        return "\n".join(lines + ["No timed shapes: this verdict is a build only (a dry run, or the build failed); "
                                  "nothing ran on a GPU.", ""])
    lines += ["Times are medians in microseconds. `physical us` is the floor no kernel can beat (DRAM bytes at peak "
              "bandwidth, or an empty launch); `practical us` is what a copy of the same bytes achieves on this GPU. "
              "`x practical` = time / practical floor (1.0 = at the practical floor).", ""]
    for view in verdict.modes() or ["graph"]:
        bands = verdict.band_speedups.get(view) or {}
        lines += [f"## {view} view", "",
                  "band geomean speedup vs the original: " + (", ".join(f"{b} x{_num(v)}" for b, v in bands.items())
                                                              or "-"), "",
                  "| shape | band | dtype | original us | best us | speedup | physical us | practical us | "
                  "original x practical | best x practical |", "|" + "---|" * 10]
        for case in timed[:MAX_ROWS]:
            floor = case.floors.get(view) or {}
            lines.append(f"| {case.id} | {case.band} | {case.dtype} | {_num(case.median_us(view, 'orig'))} | "
                         f"{_num(case.median_us(view, 'cand'))} | {_num(case.speedup(view))} | "
                         f"{_num(floor.get('physical_us'))} | {_num(floor.get('practical_us'))} | "
                         f"{_num(floor.get('orig_x_practical'), 3)} | {_num(floor.get('cand_x_practical'), 3)} |")
        if len(timed) > MAX_ROWS:
            lines.append(f"| ... {len(timed) - MAX_ROWS} more shapes | | | | | | | | | |")
        lines.append("")
    untimed = len(verdict.cases) - len(timed)
    if untimed:
        lines += [f"{untimed} more case(s) are " + ("not timed (the original's baseline checks no outputs; a candidate "
                                                    "is checked on them)." if ctx.best_n is None
                                                    else "checked for correctness only (not timed)."), ""]
    if verdict.slower_shapes:
        lines += ["Slower than the original: " + ", ".join(f"{s.get('id')} ({s.get('mode')}) x{_num(s.get('speedup'))}"
                                                          for s in verdict.slower_shapes[:10]), ""]
    return "\n".join(lines)


def profile_text(verdict: Verdict | None) -> str:
    """What the verdict holds beyond the per-shape times."""
    lines = ["# Profile of the best source", ""]
    if verdict is None:
        return "\n".join(lines + ["No verdict yet: nothing was measured.", ""])
    env = {k: v for k, v in verdict.env.items() if isinstance(v, (str, int, float)) and not isinstance(v, bool)}
    lines += ["## Machine", ""] + ([f"- {k}: {v}" for k, v in env.items()] or
                                   ["- not recorded (nothing ran on a GPU: a dry run or a failed build)"]) + [""]
    lines += ["## Registers, spills and shared memory (ptxas, per kernel instantiation)", ""]
    rows = [(b.get("side"), r) for b in verdict.builds for r in (b.get("resources") or []) if isinstance(r, dict)]
    if rows:
        lines += ["| side | kernel | registers | spill stores B | spill loads B | stack B | static smem B |",
                  "|" + "---|" * 7]
        lines += [f"| {side} | {str(r.get('name', '?')).split('(')[0][:90]} | {r.get('registers', '-')} | "
                  f"{r.get('spill_stores', '-')} | {r.get('spill_loads', '-')} | {r.get('stack_frame', '-')} | "
                  f"{r.get('smem', '-')} |" for side, r in rows[:40]]
    else:
        lines.append("Not recorded.")
    lines += ["", "## Distance to the floors per band (graph view, mean over shapes)", ""]
    by_band: dict[str, list[float]] = {}
    for case in verdict.timed_cases():
        x = (case.floors.get("graph") or {}).get("cand_x_practical")
        if isinstance(x, (int, float)) and math.isfinite(x):
            by_band.setdefault(case.band, []).append(x)
    lines += [f"- {band}: {_num(sum(v) / len(v), 3)} x the practical floor over {len(v)} shape(s)"
              for band, v in by_band.items()] or ["No timed shapes."]
    lines += ["", "## Nsight Compute", ""]
    if verdict.ncu:
        lines += ["```json", json.dumps(verdict.ncu, indent=1, default=str)[:6000], "```"]
    else:
        lines.append("No Nsight Compute profile is available: the optimize loop does not run Nsight Compute, so there "
                     "are no per-kernel counters (achieved occupancy, DRAM throughput, stall reasons) here. What this "
                     "folder has is the timing, the floors and ptxas's resource counts above.")
    return "\n".join(lines + [""])


def _sources(ctx: Context, run: RunDir) -> dict[str, str]:
    """source_id -> source of every base a candidate of this run could have edited."""
    found = {source_id(ctx.original_source): ctx.original_source}
    for entry in ctx.history:
        if entry.accepted:
            try:
                found[source_id(run.candidate(entry.n)[0])] = run.candidate(entry.n)[0]
            except AstraError:
                continue  # an unreadable candidate only costs the diffs made from it
    return found


def failures_text(ctx: Context, run: RunDir) -> str:
    """ctx.failures in words, each with its diff against the source it edited."""
    lines = ["# Candidates not accepted (the most recent last)", ""]
    if not ctx.failures:
        return "\n".join(lines + ["None yet.", ""])
    bases, base_of = _sources(ctx, run), {h.n: h.base for h in ctx.history}
    for item in ctx.failures:
        lines += [f"## #{item.get('n', 0):03d} (round {item.get('round')}): {item.get('idea')}", "",
                  f"- status: {item.get('status')}", f"- why: {item.get('why')}"]
        if item.get("reason"):
            lines.append(f"- verdict: {item['reason']}")
        if item.get("bands"):
            lines.append("- band geomean speedups (graph): " + ", ".join(f"{b} x{_num(v)}"
                                                                        for b, v in item["bands"].items()))
        lines += [f"  - {d}" for d in item.get("details") or [] if d not in str(item.get("reason", ""))]
        diff = _diff(run, item.get("n"), bases.get(base_of.get(item.get("n"), "")))
        if diff:
            lines += ["", "```diff", *diff, "```"]
        lines.append("")
    return "\n".join(lines)


def _diff(run: RunDir, n, base: str | None) -> list[str]:
    if not isinstance(n, int) or base is None:
        return []
    try:
        source = run.candidate(n)[0]
    except AstraError:
        return []
    out = [line.rstrip("\n") for line in difflib.unified_diff(base.splitlines(True), source.splitlines(True),
                                                              "base", f"candidate #{n:03d}", n=2)]
    if len(out) > MAX_DIFF_LINES:
        out = out[:MAX_DIFF_LINES] + [f"... {len(out) - MAX_DIFF_LINES} more diff lines"]
    return out


def history_text(ctx: Context, run: RunDir) -> str:
    lines = ["# Every candidate of this run", ""]
    if not ctx.history:
        return "\n".join(lines + ["Nothing tried yet.", ""])
    lines += ["Score: geomean speedup over every timed shape, graph view (0: not verified correct).", "",
              "| # | round | idea | status | score | accepted | why |", "|" + "---|" * 7]
    for h in ctx.history:
        try:
            idea = run.candidate(h.n)[1].get("description") or h.name
        except AstraError:
            idea = h.name
        lines.append(f"| {h.n:03d} | {h.round} | {_cell(idea)} | {h.status} | {_num(h.score)} | "
                     f"{'yes' if h.accepted else 'no'} | {_cell(h.why)} |")
    return "\n".join(lines + [""])


def _cell(text: object) -> str:
    return " ".join(str(text).split()).replace("|", "/")[:200]


def readme_text(ctx: Context, spec, command: str, limit_s: float, has_sources: bool) -> str:
    kernel_file = spec.kernel_file
    wrappers = spec.raw.get("build", {}).get("wrappers", [])
    exports = [f"\n  - `{w.get('export')}`, calling `{w.get('entry')}`" for w in wrappers]
    read_only = [a["name"] for a in spec.raw.get("arguments", []) if a.get("role") == "in"]
    tolerance = ", ".join(f"{dtype}: atol {t.get('atol')}, rtol {t.get('rtol')}"
                          for dtype, t in (spec.raw.get("tolerance") or {}).items() if isinstance(t, dict))
    sources = ("`sources/`: copies of the SGLang headers the kernel includes, under their include paths "
               "(read them; editing them changes nothing)" if has_sources else
               "`sources/`: not written for this run (the SGLang tree was not known); `spec.yaml` names the version")
    return f"""# Make `{kernel_file}` faster ({spec.name}, {ctx.budget_text()})

You are one round of `astra optimize`. Edit `candidate.cuh` in place so that the kernel runs faster on the GPU
named in `profile.md` while computing the same results. When you exit, Astra builds your file with SGLang's exact
nvcc flags in place of `{kernel_file}` and a judge checks it against the original on a real GPU.

## What to do

1. Read `best.md` (where the time goes, per shape, against the floors), `profile.md`, `failures.md` (what was
   already rejected and why: do not repeat it) and `history.md`.
2. Edit `candidate.cuh` in place; keep it a complete file (it replaces `{kernel_file}` as a whole).
3. Optionally write `IDEA.txt`: one line saying what you changed (it names the candidate in the run's report).
4. Exit 0. To say there is nothing left worth trying, exit 0 without changing `candidate.cuh`: the run stops.

A non-zero exit, or running longer than {limit_s:.0f} s, stops the run (what already verified is kept).
`$ASTRA_CONTEXT_DIR` is this folder and `$ASTRA_CANDIDATE` the file to edit. The command that runs you:
`{command}`.

## The rules the judge enforces

- Only `candidate.cuh` is used: no new files. A header you write here is never built; its `#include` lines
  resolve as in SGLang (`<sgl_kernel/...>` from SGLang's include directory, relative ones from the directory
  of `{kernel_file}`).
- The same exports with the same typed signatures, and the C++ entries the loader instantiates (template
  arguments per shape as written, `{{...}}` filled in from each shape): {"".join(exports) or "see spec.yaml"}
- The same results as the original within tolerance ({tolerance or "see spec.yaml"}) on every shape of the suite,
  with fresh random inputs, every dtype ({", ".join(spec.raw.get("dtypes", []))}); read-only inputs
  ({", ".join(read_only) or "none"}) must stay unchanged.
- Clean under compute-sanitizer: no out-of-bounds access, no race, no uninitialized read.
- A time under the physical floor marks the candidate suspect: it is rejected, not celebrated.
- Acceptance: {policy_text()}

## The files here

- `candidate.cuh`: the best source so far; the file you edit.
- `best.cuh`: the same source, kept unedited for reference; `original.cuh`: the kernel as SGLang ships it.
- `best.md`: the best's verdict per shape (band, original us, best us, speedup, physical and practical floors).
- `profile.md`: the GPU, registers, spills and shared memory per kernel, distance to the floors per band.
- `failures.md` / `failures.json`: the last candidates not accepted, why, and their diffs.
- `history.md`: every candidate of the run with its status and score.
- `budget.json`: rounds, wall time, tokens and cost left (null: not limited), and your time limit.
- `spec.yaml`: the exports, arguments, dtypes, shapes and tolerance the judge uses.
- {sources}.
- `agent.log`: your stdout and stderr.
- Optional outputs: `IDEA.txt` (one line), `USAGE.json` (`{{"tokens": N, "cost_usd": X}}`: what you spent, so
  the run's token and cost budgets count it).
"""
