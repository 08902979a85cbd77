"""Spec drafting by a model (the testing agent of `extract`/`probe --agent llm`): a model proposes or repairs a
spec draft from the evidence; the probe decides.

    spec, note = propose_draft(tree, "rmsnorm", inferred, notes, client)    # after `astra extract`
    fixed = LlmRepairer(client).repair("rmsnorm", spec, probe_record, tree)  # (spec, note) or None

The model sees the kernel source trimmed to the entry and what it uses (`kernel_excerpt`), the Python
wrapper (`wrapper_excerpt`), the runtime's call sites and gates (`astra list --why`), the draft and its
TODO(review) notes and, to repair, what the probe saw (`probe_findings`). Prompts: astra/llm/prompts/
testing_*.md. A reply holds the whole spec in one fenced yaml block; it is refused when unreadable, when it
changes what was read from the tree (`PROTECTED`), adds `shapes.exclude` entries (the probe's), repeats the
draft it repairs, or fails validation. A refusal goes back once with its problems; a second gives up with
a note. LLM errors propagate. Nothing here decides that a draft is right: the probe does.
"""

from __future__ import annotations

import ast
import os
import re
import tempfile
from collections import Counter, deque
from itertools import takewhile
from pathlib import Path
from typing import TYPE_CHECKING

from astra.cxx import decls
from astra.cxx.entry import entry_parts
from astra.cxx.text import blank
from astra.errors import AstraError, SpecError
from astra.llm import templates
from astra.sglang import registry, srt_gates, wrapper_facts
from astra.sglang.srt_gates_text import format_reach
from astra.sglang.tree import SglangTree
from astra.spec import checks
from astra.spec import model as spec_mod
from astra.spec.expr import DTYPE_BYTES
from astra.spec.extract import DRAFT_HEADER, PROBED_MARK, dump_yaml
from astra.spec.resolve import draft_path
from astra.text import one_line

if TYPE_CHECKING:
    from astra.llm.client import Client

ROLE = "testing"  # the usage and transcript role of every call
PROTECTED = ("name", "module", "source", "build", "entry", "signature")  # read from the tree, never the model's
SOURCE_CHARS, WRAPPER_CHARS, SITES_CHARS, PROBE_CHARS = 24_000, 8_000, 6_000, 6_000
AGENT_MARK = "# Drafted by the testing agent"

_IDENT = re.compile(r"[A-Za-z_]\w*")
_FENCE = re.compile(r"```[ \t]*([\w+-]*)[^\n]*\n(.*?)```", re.S)
_CHANGES = re.compile(r"^[\s*_>]*CHANGES[*_]*:[*_]*\s*(.+)$", re.M | re.I)


def _cut(text: str, limit: int, comment: str = "#") -> str:
    return text if len(text) <= limit else text[:limit] + f"\n{comment} [... cut at {limit:,} characters ...]\n"


def kernel_excerpt(text: str, entry: str, limit: int = SOURCE_CHARS) -> str:
    """The kernel file trimmed to the entry's declaration and those it uses, transitively (breadth first,
    within `limit` characters), with the #include lines and namespaces; omitted lines are marked. The
    whole file, cut at `limit`, when the entry is not found."""
    cls, fn, _, _ = entry_parts(entry.strip().lstrip("&").strip())
    root = cls or fn
    layout = decls.layout(text)
    if layout is None or not _IDENT.fullmatch(root or ""):
        return _cut(text, limit, "//")
    blanked = blank(text)
    blocks = [(p.start if p.kind in (decls.NAMESPACE, decls.CLOSE) else p.lead, p.end,
               p.kind in (decls.NAMESPACE, decls.CLOSE)) for p in layout]
    codes = [blanked[s:e] for s, e, _ in blocks]
    names = [p.names for p in layout]
    queue = deque(i for i, found in enumerate(names) if root in found)
    seen, chosen, size = set(queue), set(), 0
    while queue:
        i = queue.popleft()
        s, e, _ = blocks[i]
        if chosen and size + e - s > limit:
            continue
        chosen.add(i)
        size += e - s
        used = set(_IDENT.findall(codes[i]))
        for j, found in enumerate(names):
            if j not in seen and found & used:
                seen.add(j)
                queue.append(j)
    if not chosen:
        return _cut(text, limit, "//")
    keep = sorted(chosen | {i for i, (_, _, ns) in enumerate(blocks) if ns}
                  | {i for i, code in enumerate(codes) if code.lstrip().startswith("#include")})
    pieces, last = [], 0
    for i in keep:
        s, e, _ = blocks[i]
        s = max(text.rfind("\n", 0, s) + 1, last)
        e = len(text) if text.find("\n", e) < 0 else text.find("\n", e) + 1
        pieces.append(_gap(text[last:s]) + text[s:e])
        last = max(last, e)
    pieces.append(_gap(text[last:]))
    return _cut("".join(pieces), limit + 2_000, "//")


def _gap(text: str) -> str:
    hidden = sum(1 for line in text.splitlines() if line.strip())
    return f"// [... {hidden} line(s) not shown ...]\n" if hidden else text


def wrapper_excerpt(tree: SglangTree, module: registry.JitModule, limit: int = WRAPPER_CHARS) -> str:
    """The loader and every wrapper function that calls an export, from their Python files."""
    site = module.call_sites[0]
    wanted: dict[str, set[str]] = {site.file: {site.loader}}
    for fn in wrapper_facts.facts(tree, site).functions:
        wanted.setdefault(fn.file, set()).add(fn.name.split(".")[0])
    parts = []
    for rel, names in wanted.items():
        text = (tree.root / rel).read_text(errors="replace")
        lines = text.splitlines()
        spans = sorted((min([node.lineno] + [d.lineno for d in node.decorator_list]), node.end_lineno)
                       for node in ast.parse(text).body
                       if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)) and node.name in names)
        if spans:
            parts.append(f"# {rel}\n" + "\n\n".join("\n".join(lines[a - 1:b]) for a, b in spans))
    return _cut("\n\n".join(parts), limit) if parts else "(no wrapper function found)"


def evidence(tree: SglangTree, spec: dict) -> dict[str, str]:
    """The prompt values shared by a proposal and a repair, each bounded; what cannot be read says why."""
    build = spec.get("build") if isinstance(spec.get("build"), dict) else {}
    export = str(spec.get("entry") or "")
    entry = next((str(w.get("entry")) for w in build.get("wrappers") or []
                  if isinstance(w, dict) and w.get("export") == export), export)
    source = spec.get("source") if isinstance(spec.get("source"), dict) else {}
    kernel_file = str(source.get("kernel_file") or "")
    values = {"kernel": str(spec.get("module")), "sglang_version": tree.version, "export": export, "entry": entry,
              "kernel_file": kernel_file}
    path = registry.resolve_source(tree, kernel_file) if kernel_file else None
    values["source"] = (kernel_excerpt(path.read_text(errors="replace"), entry) if path
                        else f"(not available: no {kernel_file!r} in {tree.describe()})")
    for key, read in (("wrapper", lambda: wrapper_excerpt(tree, registry.find(tree, values["kernel"]))),
                      ("call_sites", lambda: _cut(format_reach(srt_gates.why(tree, values["kernel"])), SITES_CHARS))):
        try:
            values[key] = read()
        except (AstraError, OSError, SyntaxError, ValueError, IndexError) as err:
            values[key] = f"(not available: {type(err).__name__}: {one_line(err, 200)})"
    return values


def probe_findings(record: dict, limit: int = PROBE_CHARS) -> str:
    """What a probe record says, for the model: the verdict, each distinct failure with the kernel's own
    message and the cases it hit, the kept cases' roles and notes, memcheck findings, build errors."""
    cases = [c for c in record.get("cases") or [] if isinstance(c, dict)]
    lines = [f"status: {record.get('status') or 'failed'}",
             f"reason: {one_line(record.get('reason') or 'none recorded', 800)}"]
    if cases:
        counts = Counter(str(c.get("status")) for c in cases)
        lines.append(f"cases: {len(cases)}: " + ", ".join(f"{n} {status}" for status, n in counts.items()))
    groups: dict[tuple[str, str], list[str]] = {}
    for case in cases:
        if case.get("status") != "kept":
            key = (str(case.get("status")), one_line(case.get("message") or "no message", 400))
            groups.setdefault(key, []).append(str(case.get("id")))
    for (status, message), ids in groups.items():
        more = f" and {len(ids) - 3} more" if len(ids) > 3 else ""
        lines.append(f"- {status} ({', '.join(ids[:3])}{more}): {message}")
    kept = [c for c in cases if c.get("status") == "kept"]
    if kept:
        lines.append(f"kept ({len(kept)}), e.g. {kept[0].get('id')}; roles observed: "
                     f"{record.get('roles') or kept[0].get('roles')}")
        lines += [f"- note: {one_line(n, 300)}" for n in list(dict.fromkeys(
            str(n) for c in kept for n in c.get("notes") or []))[:5]]
    sanitizer = record.get("sanitizer") if isinstance(record.get("sanitizer"), dict) else {}
    lines += [f"- {f.get('tool')}: {one_line(f.get('message'), 300)}" for f in (sanitizer.get("findings") or [])[:3]
              if isinstance(f, dict)]
    lines += [f"- build {b.get('variant')}: {one_line(b.get('error'), 400)}" for b in record.get("builds") or []
              if isinstance(b, dict) and b.get("error")]
    return _cut("\n".join(lines), limit)


def review_notes(path: Path) -> list[str]:
    """The `# TODO(review): ...` lines of a draft's header (what `astra extract` guessed)."""
    header = _header(path.read_text(errors="replace") if path.is_file() else "")
    return [line.split(":", 1)[1].strip() for line in header if line.startswith(f"# {checks.REVIEW_MARKER}:")]


def _header(text: str) -> list[str]:
    return [line.rstrip("\n") + "\n" for line in takewhile(lambda line: line.startswith("#"), text.splitlines())]


def _bullets(notes: list[str]) -> str:
    return "\n".join(f"- {n}" for n in notes) or "(none)"


def read_reply(text: str, base: dict, path: Path, *, repairing: bool = False) -> tuple[dict | None, list[str]]:
    """(the spec in a reply, []) or (None, what is wrong with it): one fenced yaml block, `PROTECTED` fields
    as in `base`, no new exclusions, not `base` itself when `repairing`, valid as a spec at `path`."""
    fenced = _FENCE.findall(text)
    blocks = [body for lang, body in fenced if lang.lower() in ("yaml", "yml")] or [b for lang, b in fenced if not lang]
    if len(blocks) != 1:
        return None, [f"the reply holds {len(blocks)} fenced yaml blocks; give exactly one, holding the whole spec"]
    path.parent.mkdir(parents=True, exist_ok=True)
    handle, name = tempfile.mkstemp(prefix=".reply-", suffix=".yaml", dir=path.parent)
    temp = Path(name)
    try:
        with os.fdopen(handle, "w", encoding="utf-8") as out:
            out.write(blocks[0])
        raw, why = checks.read_yaml(temp)
        if why or not isinstance(raw, dict):
            return None, [f"the yaml block is {why or 'not a mapping of spec fields'}"]
        problems = [f"`{key}` differs from the draft's; copy it unchanged (it is read from the SGLang tree)"
                    for key in PROTECTED if raw.get(key) != base.get(key)]
        added = sorted(_excluded(raw) - _excluded(base))
        if added:
            problems.append(f"shapes.exclude: {added[0]!r} is new; only the probe adds exclusions (the cases the "
                            "kernel refuses), leave them out")
        if repairing and raw == base:
            problems.append("the spec is the draft the probe rejected, unchanged; fix what the probe's findings point at")
        try:
            spec_mod.load(temp)
        except SpecError as err:
            problems += err.problems
        return (raw, []) if not problems else (None, problems)
    finally:
        temp.unlink(missing_ok=True)


def _excluded(spec: dict) -> set:
    shapes = spec.get("shapes") if isinstance(spec.get("shapes"), dict) else {}
    entries = shapes.get("exclude") if isinstance(shapes.get("exclude"), list) else []
    return {str(e.get("case")) for e in entries if isinstance(e, dict)}


def _system() -> str:
    models = "\n".join(f"- {name}: " + ", ".join(f"{k}={v}" for k, v in fields.items())
                       for name, fields in spec_mod.load_models().items())
    return templates.render("testing_spec", dtypes=", ".join(DTYPE_BYTES), models=models)


def _ask(client: "Client", user: str, base: dict, path: Path, *, repairing: bool) -> tuple[dict | None, str]:
    """One request and at most one retry with the problems; (spec, note) or (None, why it gave up)."""
    who = f"llm:{client.cfg.model}"
    messages = [{"role": "system", "content": _system()}, {"role": "user", "content": user}]
    problems: list[str] = []
    for attempt in (1, 2):
        text = client.redact(client.chat(messages, role=ROLE).text)  # no key reaches a draft on disk
        spec, problems = read_reply(text, base, path, repairing=repairing)
        if spec is not None:
            changes = _CHANGES.search(text)
            what = changes.group(1) if changes else "no CHANGES line"
            note = f"{who}: {what}" + (" (second reply; the first was refused)" if attempt == 2 else "")
            return spec, one_line(note, 300)
        messages += [{"role": "assistant", "content": text},
                     {"role": "user", "content": templates.render("testing_refused", problems=_bullets(problems))}]
    why = "; ".join(problems[:3]) + (f" (and {len(problems) - 3} more)" if len(problems) > 3 else "")
    return None, one_line(f"{who}: both replies refused; the second: {why}", 400)


def propose_draft(tree: SglangTree, module_name: str, inferred_spec: dict, notes: list[str], client: "Client",
                  *, path: Path | None = None) -> tuple[dict, str]:
    """(the model's draft, a one-line note); `inferred_spec` itself when both replies were refused (the
    note says why). `path`: where the draft lives (default $ASTRA_HOME/drafts/NAME/kernel.yaml)."""
    if inferred_spec.get("module") != module_name:
        raise AstraError(f"the inferred draft is of module {inferred_spec.get('module')!r}, not {module_name!r}")
    path = path or draft_path(str(inferred_spec.get("name")))
    user = templates.render("testing_draft", **evidence(tree, inferred_spec), draft=dump_yaml(inferred_spec),
                            notes=_bullets(notes))
    spec, note = _ask(client, user, inferred_spec, path, repairing=False)
    return (inferred_spec, note) if spec is None else (spec, note)


class LlmRepairer:
    """The model behind astra.verify.probe_repair's Repairer: a draft the probe rejected, repaired from the
    probe's findings. `notes` keeps one line per attempt (why it gave up, when it returned None)."""

    def __init__(self, client: "Client"):
        self.client = client
        self.name = f"llm:{client.cfg.model}"
        self.notes: list[str] = []

    def repair(self, name: str, spec: dict, record: dict, tree: SglangTree) -> tuple[dict, str] | None:
        path = draft_path(name)
        user = templates.render("testing_repair", **evidence(tree, spec), draft=dump_yaml(spec),
                                notes=_bullets(review_notes(path)), probe=probe_findings(record))
        fixed, note = _ask(self.client, user, spec, path, repairing=True)
        self.notes.append(note)
        return None if fixed is None else (fixed, note)


def write_draft(path: Path, spec: dict, note: str) -> None:
    """Write `spec` as the draft at `path`: its header comments (the extract notes) kept, earlier agent and
    probe lines dropped, one line naming the agent and its note. Atomic."""
    old = path.read_text(errors="replace") if path.is_file() else DRAFT_HEADER + "\n"
    header = [line for line in _header(old) if not line.startswith((PROBED_MARK, AGENT_MARK))]
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text("".join(header) + f"{AGENT_MARK}: {one_line(note, 300)}\n" + dump_yaml(spec))
    os.replace(tmp, path)
