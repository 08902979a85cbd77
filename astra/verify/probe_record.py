"""What a probe leaves behind: probe.json (the evidence), the draft rewritten from observation, the summary.

A passing probe of a DRAFT rewrites it (a YAML round trip that keeps the header comment lines):
each tensor argument's role becomes the observed one (aliases and their targets are left alone: the
in-place contract is the spec's; a `bytes` the extractor wrote is written again for the new roles), an
output whose rows came out in another order on an identical run gets `unordered: true`, and every case
the kernel rejected, that crashed or hung the original, or where it wrote nothing, goes to
`shapes.exclude` as {case, reason}. probe.json is then written beside it with the
sha256 of the draft's bytes AFTER the rewrite (astra.spec.resolve checks it). A failed probe leaves the
draft untouched. A REVIEWED spec is never rewritten: its record goes to $ASTRA_HOME/probes/<name>.json
and says which roles and exclusions observation would change.
"""

from __future__ import annotations

import copy
import json
import os
import re
from dataclasses import asdict, dataclass, field
from datetime import datetime, timezone
from pathlib import Path

import yaml

from astra.spec.draft_traffic import bytes_expr
from astra.spec.extract import PROBED_MARK
from astra.spec.resolve import spec_sha256
from astra.text import one_line

EXCLUDED_STATUSES = ("rejected", "crashed", "hung", "noop")
CASE_KEYS = ("id", "status", "message", "written", "roles", "deterministic", "finite", "constant_outputs", "notes",
             "seconds", "stderr_tail", "unordered")


@dataclass
class ModuleProbe:
    """One module's outcome, as the table, the report and --json show it."""

    name: str
    kind: str  # "draft" | "reviewed"
    status: str  # "probed" | "failed"
    reason: str
    kept: int = 0
    total: int = 0
    written: list[str] = field(default_factory=list)  # "name (role)"
    up_to_date: bool = False  # skipped: its record matches the spec's current bytes
    record: str | None = None  # where probe.json went

    def to_dict(self) -> dict:
        return asdict(self)


def exclusions(cases: list[dict]) -> list[dict]:
    """{case, reason} for every case the original rejected, crashed on, hung on or wrote nothing on."""
    out = []
    for case in cases:
        if case["status"] not in EXCLUDED_STATUSES:
            continue
        prefix = "" if case["status"] in ("rejected", "noop") else f"the original {case['status']}: "
        out.append({"case": case["id"], "reason": one_line(prefix + (case.get("message") or ""), 300)})
    return out


def apply_roles(data: dict, roles: dict[str, str]) -> dict[str, list[str]]:
    """Set each tensor argument's role in a spec mapping to the observed one; {name: [old, new]} changed."""
    args = [a for a in data.get("arguments") or [] if isinstance(a, dict)]
    targets = {a.get("alias") for a in args if a.get("alias")}
    changes: dict[str, list[str]] = {}
    for arg in args:
        name = arg.get("name")
        new = roles.get(name)
        if arg.get("kind") != "tensor" or arg.get("alias") or name in targets or new in (None, "alias"):
            continue
        old = arg.get("role", "in")
        if old != new:
            changes[name] = [old, new]
            arg["role"] = new
    return changes


def add_exclusions(data: dict, excluded: list[dict]) -> list[dict]:
    """Append to `shapes.exclude` the cases not already there; returns those added."""
    shapes = data.setdefault("shapes", {})
    current = shapes.get("exclude") or []
    known = {entry.get("case") for entry in current if isinstance(entry, dict)}
    added = [entry for entry in excluded if entry["case"] not in known]
    if added:
        shapes["exclude"] = [*current, *added]
    return added


def _header(text: str) -> list[str]:
    """The leading comment lines of a draft (astra extract writes its notes there), old probe line dropped."""
    lines = []
    for line in text.splitlines(keepends=True):
        if not line.startswith("#"):
            break
        if not line.startswith(PROBED_MARK):
            lines.append(line if line.endswith("\n") else line + "\n")
    return lines


def observed_unordered(cases: list[dict]) -> list[str]:
    """The outputs some kept case found unordered (their order along the last dim changed between runs)."""
    out: list[str] = []
    for case in cases:
        if case.get("status") == "kept":
            out += [n for n in case.get("unordered") or [] if n not in out]
    return out


def mark_unordered(data: dict, names: list[str]) -> list[str]:
    """Set `unordered: true` on those tensor arguments; the names newly marked."""
    marked = []
    for arg in data.get("arguments") or []:
        if isinstance(arg, dict) and arg.get("name") in names and not arg.get("unordered"):
            arg["unordered"] = True
            marked.append(arg["name"])
    return marked


def rewrite_draft(path: Path, roles: dict[str, str], excluded: list[dict], note: str,
                  unordered: list[str] | None = None) -> dict:
    """Rewrite the draft at `path` from observation (see the module docstring); {role_changes, excluded}."""
    text = path.read_text()
    data = yaml.safe_load(text)
    drafted = _same_expr(data.get("bytes"), bytes_expr(data.get("arguments") or []))
    changes = apply_roles(data, roles)
    mark_unordered(data, unordered or [])
    if changes and drafted:  # bytes the extractor wrote follow the observed roles (an inout is read and written)
        data["bytes"] = bytes_expr(data["arguments"])
    added = add_exclusions(data, excluded)
    body = yaml.safe_dump(data, sort_keys=False, width=110)
    new = "".join(_header(text)) + f"{PROBED_MARK} {note}\n" + body
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(new)
    os.replace(tmp, path)
    return {"role_changes": changes, "excluded_added": added}


def _same_expr(a, b) -> bool:
    return " ".join(str(a).split()) == " ".join(str(b).split())


def proposed_changes(path: Path, roles: dict[str, str], excluded: list[dict]) -> dict:
    """What `rewrite_draft` would change in the spec at `path`, without writing (reviewed specs)."""
    data = copy.deepcopy(yaml.safe_load(path.read_text()))
    return {"role_changes": apply_roles(data, roles), "excluded_added": add_exclusions(data, excluded)}


def observed_roles(cases: list[dict]) -> dict[str, str]:
    """Each tensor's role merged over the kept cases (harness.probe.observation.merge_roles)."""
    from harness.probe.observation import merge_roles

    return merge_roles([case for case in cases if case["status"] == "kept"])[0]


def env_fields(env: dict) -> dict:
    """The versions a record names: GPU, driver, CUDA (torch's and the driver's), torch, tvm-ffi, nvcc."""
    return {"gpu": env.get("gpu"), "driver": env.get("driver"), "cuda": env.get("torch_cuda"),
            "driver_cuda": env.get("driver_cuda"), "torch": env.get("torch"), "tvm_ffi": env.get("tvm_ffi"),
            "nvcc": env.get("nvcc")}


def finish(name: str, kind: str, spec_file: Path, record_path: Path, result: dict, sglang_version: str) -> ModuleProbe:
    """Apply a probe result: rewrite a passing draft, write the record, return the summary."""
    cases = [{k: case[k] for k in CASE_KEYS if k in case} for case in result.get("cases", [])]
    roles = observed_roles(cases)
    excluded = exclusions(cases)
    status, reason = result.get("status", "failed"), result.get("reason") or "no reason recorded"
    changes: dict = {"role_changes": {}, "excluded_added": []}
    env = result.get("env") or {}
    if status == "probed" and kind == "draft":
        note = f"on {env.get('gpu') or 'an unnamed device'}: roles and shapes.exclude from observation (probe.json)"
        changes = rewrite_draft(spec_file, roles, excluded, note, observed_unordered(cases))
    elif status == "probed":
        changes = proposed_changes(spec_file, roles, excluded)
        if changes["role_changes"]:
            diff = ", ".join(f"{n}: {old} -> {new}" for n, (old, new) in changes["role_changes"].items())
            reason += f"; observed roles differ from the reviewed spec: {diff}"
        unmarked = mark_unordered(yaml.safe_load(spec_file.read_text()), observed_unordered(cases))
        if unmarked:  # `check` would compare their rows by position and fail correct candidates
            reason += f"; rows came out in another order on an identical run, give them `unordered: true`: " \
                      f"{', '.join(unmarked)}"
    record = {"status": status, "reason": reason, "name": name, "kind": kind, "spec": str(spec_file),
              "spec_sha256": spec_sha256(spec_file), **env_fields(env),
              "date": datetime.now(timezone.utc).isoformat(timespec="seconds"), "sglang_version": sglang_version,
              "roles": roles, **changes, "excluded": excluded, "cases": cases, "sanitizer": result.get("sanitizer"),
              "builds": [{k: b.get(k) for k in ("variant", "ok", "seconds", "cache_hit", "error")}
                         for b in result.get("builds") or []],
              "env": env, "wall_s": result.get("wall_s")}
    write_record(record_path, record)
    return summary(name, kind, record, record_path)


def write_record(path: Path, record: dict) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(json.dumps(record, indent=1, default=str) + "\n")
    os.replace(tmp, path)


def summary(name: str, kind: str, record: dict, record_path: Path | None, up_to_date: bool = False) -> ModuleProbe:
    """A ModuleProbe from a record (just written, or found up to date)."""
    cases = record.get("cases") or []
    roles = record.get("roles") or {}
    written = [f"{n} ({r})" for n, r in roles.items() if r != "in"]
    return ModuleProbe(name=name, kind=kind, status=record.get("status", "failed"),
                       reason=one_line(record.get("reason") or "", 400),
                       kept=sum(c.get("status") == "kept" for c in cases), total=len(cases), written=written,
                       up_to_date=up_to_date, record=str(record_path) if record_path else None)


def table_rows(results: list[ModuleProbe]) -> list[list]:
    """name, status, kept/total, written tensors, reason: one row per module."""
    return [[r.name + (" (reviewed)" if r.kind == "reviewed" else ""),
             r.status + (" (up to date)" if r.up_to_date else ""),
             f"{r.kept}/{r.total}", ", ".join(r.written) or "-", r.reason] for r in results]


def markdown(results: list[ModuleProbe]) -> str:
    """The summary table in markdown, then one line per module that is not probed."""
    def cell(text: str) -> str:
        return str(text).replace("|", "\\|")

    probed = sum(r.status == "probed" for r in results)
    lines = ["# astra probe", "", f"{probed} of {len(results)} module(s) probed.", "",
             "| module | status | kept/total | writes | reason |", "|---|---|---|---|---|"]
    lines += ["| " + " | ".join(cell(c) for c in row) + " |" for row in table_rows(results)]
    failed = [r for r in results if r.status != "probed"]
    if failed:
        lines += ["", "## Not probed", ""]
        lines += [f"- **{cell(r.name)}**: {cell(r.reason)}" for r in failed]
    return "\n".join(lines) + "\n"


def coverage(tree, results: list[ModuleProbe]) -> list[str]:
    """Markdown lines for every module of `tree` that has no spec in `results`, one reason each:
    needs several GPUs, not built for sm_90a (why), or no draft could be written."""
    from astra.sglang import registry

    have = {r.name for r in results}
    lines = []
    for m in registry.modules(tree):
        safe = re.sub(r"[^A-Za-z0-9_.-]", "_", m.name)
        if safe in have or m.name in have:
            continue
        if m.category == "communication":
            why = "multi-GPU communication module: needs several GPUs (not probed on one)"
        elif m.sm90a not in ("yes", "built"):
            why = f"not buildable for sm_90a: {m.sm90a_reason}"
        else:
            why = "no draft: `astra extract` could not describe its entry (run it for the reason)"
        lines.append(f"- **{m.name.replace('|', '/')}**: {why}")
    if not lines:
        return []
    return ["", f"## Modules without a spec ({len(lines)})", ""] + lines
