"""What an agent needs to hear about a candidate that was not accepted: why, in a few lines.

`failure(entry, meta, verdict)` turns one history entry and its verdict into a dict for the agents'
context: the status and reason, and per status the detail that lets the next attempt fix it (the build
error trimmed to its first compiler lines, the first incorrect cases with the outputs and positions that
differ, the sanitizer's findings, the suspect flags, the shapes it slowed). Text is bounded: agents get
this every round.
"""

from __future__ import annotations

from typing import Any

from astra.errors import AstraError
from astra.text import one_line
from harness import Verdict

MAX_DETAIL_LINES = 12


def build_error(verdict: Verdict, limit: int = MAX_DETAIL_LINES) -> list[str]:
    """The candidate's failed builds: nvcc's first error lines (paths cut to their file name)."""
    lines: list[str] = []
    for build in verdict.builds:
        if build.get("side") != "cand" or build.get("ok"):
            continue
        for line in str(build.get("error") or "").splitlines():
            line = line.strip()
            if not line or line.startswith(("In file included", "from ", "detected during", "Remark")):
                continue
            head, sep, tail = line.partition(": ")
            lines.append((head.rsplit("/", 1)[-1] + sep + tail) if sep else line)
            if len(lines) >= limit:
                return lines
    return lines


def incorrect_cases(verdict: Verdict, limit: int = 3) -> list[str]:
    """The first incorrect cases: their reasons (which output, how far off, the first differing positions)."""
    out = []
    for case in verdict.cases:
        if not case.correct:
            out.append(f"{case.id}: " + " | ".join(one_line(r, 300) for r in case.reasons[:2]))
            if len(out) >= limit:
                break
    return out


def sanitizer_findings(verdict: Verdict, limit: int = 4) -> list[str]:
    """compute-sanitizer's findings: tool, kind, its header line (kernel, access, address)."""
    findings = verdict.sanitizer.get("findings") if isinstance(verdict.sanitizer, dict) else None
    return [f"{f.get('tool')}: {f.get('kind')}: {one_line(str(f.get('message') or ''), 240)}"
            for f in (findings or [])[:limit] if isinstance(f, dict)]


def suspect_flags(verdict: Verdict, limit: int = 3) -> list[str]:
    return [f"{case.id}: {one_line(case.suspect[0], 240)}" for case in verdict.cases if case.suspect][:limit]


def slower(verdict: Verdict, limit: int = 5) -> list[str]:
    return [f"{s.get('id')} ({s.get('mode')}): x{s.get('speedup', 0):.3f}" for s in verdict.slower_shapes[:limit]]


def failure(entry: Any, meta: dict, verdict: Verdict | None) -> dict:
    """One not-accepted candidate for an agent's context."""
    item = {"n": entry.n, "round": entry.round, "idea": meta.get("description") or entry.name,
            "status": entry.status, "why": one_line(entry.why, 300)}
    if verdict is None:
        return item
    item["reason"] = one_line(verdict.reason, 400)
    details = {"build_failed": build_error, "incorrect": incorrect_cases, "sanitizer": sanitizer_findings,
               "suspect": suspect_flags}.get(verdict.status)
    lines = details(verdict) if details else []
    if verdict.status == "correct":
        lines = slower(verdict)
        item["bands"] = entry.bands
    if lines:
        item["details"] = lines
    return item


def recent_failures(run, history: list, limit: int = 4) -> list[dict]:
    """The last `limit` candidates that were not accepted, newest last, with their details."""
    out = []
    for entry in [h for h in history if not h.accepted][-limit:]:
        try:
            _, meta, verdict = run.candidate(entry.n)
        except AstraError:  # a candidate directory that cannot be read still counts, without detail
            meta, verdict = {}, None
        out.append(failure(entry, meta or {}, verdict))
    return out
