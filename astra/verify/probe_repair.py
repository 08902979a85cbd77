"""Repair the drafts the probe failed, from the kernel's own messages, and probe them again.

`probe_with_repair` runs `probe_modules`, then for up to `rounds` rounds: every DRAFT whose probe failed
because the kernel rejected every case (or its inputs could not be made) is offered to each `Repairer` in
turn; the first revised spec that validates and keeps the module's entry, build and variants is written
(the draft header kept, the old bytes in kernel.yaml.before-repair, a `TODO(review)` note and the
description saying "repaired by <repairer> from the kernel's message: ..."), and only the repaired
modules are probed again. The probe decides: a repair is a guess until its probe passes. Each probe
record of a repaired module lists its repairs under "repairs". Reviewed specs and drafts a person has
edited (no draft header) are never repaired.

The first repairer is rule-based (astra.verify.message_repair.MessageRepairer, the kernel's
TensorMatcher messages); another, an LLM's, plugs in through the same `Repairer` protocol. What any
repairer may use to read a message is here: `parse_message` (one TensorMatcher failure),
`source_statement` (the checked sizes and tensors at FILE:LINE) and `cxx_to_spec` (a C++ size in spec names).
"""

from __future__ import annotations

import copy
import os
import re
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Callable, Iterable, Protocol

import yaml

from astra.cxx.brackets import closing, split_top
from astra.errors import AstraError, NoGpu, SpecError, UnknownKernel
from astra.sglang.tree import SglangTree
from astra.spec import jobs
from astra.spec import model as spec_mod
from astra.spec.expr import CPP_DTYPES, DTYPE_BYTES, ExprError
from astra.spec.extract import DRAFT_HEADER, PROBED_MARK, dump_yaml
from astra.spec.resolve import read_record, spec_sha256
from astra.text import one_line
from astra.verify import probing
from astra.verify.probe_record import ModuleProbe, write_record

BEFORE = "kernel.yaml.before-repair"
Say = Callable[[str], None]


class Repairer(Protocol):
    """Proposes a revised draft for a module whose probe failed; None when it has nothing to offer.
    `spec` is the draft as a mapping (a copy: it may be changed and returned), `record` its probe.json,
    `tree` the SGLang tree it was drafted from. The note is one line: what changed and why."""

    name: str

    def repair(self, name: str, spec: dict, record: dict, tree: SglangTree) -> tuple[dict, str] | None: ...


# ---------------------------------------------------------------- the loop


def needs_repair(record: dict | None) -> bool:
    """A failed DRAFT whose kernel rejected every case, or some of whose inputs could not be made."""
    if not record or record.get("status") != "failed" or record.get("kind") != "draft":
        return False
    statuses = {case.get("status") for case in record.get("cases") or []}
    return "error" in statuses or ("rejected" in statuses and "kept" not in statuses)


def probe_with_repair(targets: list[probing.Target], tree_for: Callable[[spec_mod.KernelSpec], SglangTree],
                      opts: probing.ProbeOptions, repairers: Iterable[Repairer], rounds: int = 2,
                      say: Say = lambda line: None) -> list[ModuleProbe]:
    """`probe_modules`, then up to `rounds` rounds of repair and re-probe (see the module docstring)."""
    if isinstance(rounds, bool) or not isinstance(rounds, int) or rounds < 0:
        raise AstraError(f"--repair-rounds {rounds}: give a whole number of rounds, 0 (no repair) or more")
    repairers = list(repairers)
    results = dict(zip(targets, probing.probe_modules(targets, tree_for, opts, say=say)))
    if opts.report_only or not repairers or rounds == 0:
        return [results[t] for t in targets]
    history: dict[probing.Target, list[dict]] = {}
    for round_no in range(1, rounds + 1):
        proposals = []
        for target in targets:
            if target.reviewed or results[target].status == "probed":
                continue
            record = read_record(target.record_path)
            if not needs_repair(record) or record.get("spec_sha256") != spec_sha256(target.spec_file):
                continue
            proposal = propose(target, record, tree_for, repairers)
            if proposal is not None:
                proposals.append((target, record, *proposal))
        if not proposals:
            break
        try:
            probing.require_gpu(opts)  # a repair is a guess until probed: none is written without a GPU
        except NoGpu:
            say(f"{len(proposals)} repair(s) proposed but not written: no GPU to probe them on")
            break
        for target, record, new, entry in proposals:
            entry["round"] = round_no
            write_repair(target.spec_file, new, entry)
            history.setdefault(target, list(record.get("repairs") or [])).append(entry)
            say(f"{target.name}: repaired by {entry['repairer']} (round {round_no}): {entry['note']}")
        repaired = [target for target, *_ in proposals]
        for target, result in zip(repaired, probing.probe_modules(repaired, tree_for, opts, say=say)):
            results[target] = _with_repairs(target, result, history[target])
    return [results[t] for t in targets]


def _with_repairs(target: probing.Target, result: ModuleProbe, repairs: list[dict]) -> ModuleProbe:
    """Add the repairs to the module's new probe record and to its one-line reason."""
    record = read_record(target.record_path)
    if record is not None:
        record["repairs"] = repairs
        write_record(target.record_path, record)
    last = repairs[-1]
    result.reason = one_line(f"{result.reason} [after {len(repairs)} repair(s); last by {last['repairer']}: "
                             f"{last['note']}]", 600)
    return result


def propose(target: probing.Target, record: dict, tree_for: Callable[[spec_mod.KernelSpec], SglangTree],
            repairers: Iterable[Repairer]) -> tuple[dict, dict] | None:
    """(revised spec, repair entry) from the first repairer whose revision passes `check_repair`."""
    if target.reviewed:
        return None
    text = target.spec_file.read_text(errors="replace")
    if not text.startswith(DRAFT_HEADER):
        return None  # a person edited it: never rewritten by a rule
    try:
        spec = spec_mod.load(target.spec_file)
    except (SpecError, UnknownKernel):
        return None
    tree = tree_for(spec)
    for repairer in repairers:
        out = repairer.repair(target.name, copy.deepcopy(spec.raw), record, tree)
        if out is None:
            continue
        new, note = out
        if check_repair(spec.raw, new, target.spec_file) is None:
            return new, {"repairer": repairer.name, "note": one_line(note, 400), "changes": spec_changes(spec.raw, new),
                         "message": _first_message(record),
                         "date": datetime.now(timezone.utc).isoformat(timespec="seconds")}
    return None


def check_repair(old: dict, new: dict, path: Path) -> str | None:
    """Why a revised spec may not replace `old` at `path` (None: it may): it must validate, keep the
    module, source, build and entry, and need no build variant the old suite did not."""
    if not isinstance(new, dict) or new == old:
        return "no change"
    for key in ("name", "module", "source", "build", "entry"):
        if new.get(key) != old.get(key):
            return f"changes `{key}`"
    new = yaml.safe_load(dump_yaml(new))  # what will be on disk
    problems = spec_mod.validate(new, path)
    if problems:
        return "does not validate: " + "; ".join(problems[:3])
    try:
        before = set(jobs.cases(spec_mod.KernelSpec(path, old))[1])
        after = set(jobs.cases(spec_mod.KernelSpec(path, new))[1])
    except (ExprError, ValueError, KeyError) as err:
        return f"its suite cannot be made: {one_line(err, 200)}"
    return None if after <= before else f"needs new build variants: {sorted(after - before)[:2]}"


def write_repair(path: Path, new: dict, entry: dict) -> None:
    """Write the repaired draft: header kept (probe lines dropped) plus a TODO(review) note, the
    description extended, the previous bytes kept beside it in kernel.yaml.before-repair."""
    text = path.read_text()
    header = []
    for line in text.splitlines(keepends=True):
        if not line.startswith("#"):
            break
        if not line.startswith(PROBED_MARK):
            header.append(line if line.endswith("\n") else line + "\n")
    said = f"repaired by {entry['repairer']} from the kernel's message: {entry['note']}"
    header.append(f"# TODO(review): {one_line(said, 600)} (round {entry.get('round', 1)}; previous draft in "
                  f"{BEFORE})\n")
    new = copy.deepcopy(new)
    new["description"] = one_line(f"{new.get('description') or ''} {said[0].upper()}{said[1:]}.", 2000).strip()
    (path.parent / BEFORE).write_text(text)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text("".join(header) + dump_yaml(new))
    os.replace(tmp, path)


def dry_run(targets: list[probing.Target], tree_for: Callable[[spec_mod.KernelSpec], SglangTree],
            repairers: Iterable[Repairer]) -> list[dict]:
    """What the repairers would change in every failed draft whose record matches it, writing nothing:
    {module, repairer, note, changes, message} per draft (repairer None: nothing to offer)."""
    repairers = list(repairers)
    rows = []
    for target in targets:
        record = read_record(target.record_path)
        if target.reviewed or not needs_repair(record) or record.get("spec_sha256") != spec_sha256(target.spec_file):
            continue
        proposal = propose(target, record, tree_for, repairers)
        found = parse_message(_first_message(record))
        why = "" if proposal else f"no rule for TensorMatcher {found.kind} ({found.cause})" if found else \
            "not a TensorMatcher message"
        entry = proposal[1] if proposal else {"repairer": None, "note": why, "changes": [],
                                              "message": _first_message(record)}
        rows.append({"module": target.name, **{k: entry[k] for k in ("repairer", "note", "changes", "message")}})
    return rows


def _first_message(record: dict) -> str:
    case = next((c for c in record.get("cases") or [] if c.get("status") in ("rejected", "error")), None)
    return one_line(case.get("message") if case else record.get("reason") or "", 300)


def spec_changes(old: dict, new: dict) -> list[str]:
    """`path: old -> new` for each value that differs (arguments by name; shapes and description in short)."""
    out: list[str] = []

    def walk(path: str, a, b) -> None:
        if a == b:
            return
        if path in ("shapes", "description", "bytes"):
            out.append(f"{path} updated")
        elif isinstance(a, dict) and isinstance(b, dict):
            for key in dict.fromkeys([*a, *b]):
                walk(f"{path}.{key}" if path else str(key), a.get(key, "(none)"), b.get(key, "(none)"))
        elif path == "arguments" and isinstance(a, list) and isinstance(b, list):
            named = lambda items: {x.get("name"): x for x in items if isinstance(x, dict)}  # noqa: E731
            old_args, new_args = named(a), named(b)
            for name in dict.fromkeys([*old_args, *new_args]):
                walk(f"arguments[{name}]", old_args.get(name, "(none)"), new_args.get(name, "(none)"))
        else:
            out.append(f"{path}: {one_line(a, 60)} -> {one_line(b, 60)}")

    walk("", old, new)
    return out


# ---------------------------------------------------------------- the kernel's messages

_MATCH = re.compile(r"Tensor match failed for Tensor<(?P<shape>[^>]*)>(?:\[strides=<[^>]*>, dtype=(?P<dtype>\w+)[^\]]*\])?"
                    r" at (?P<file>[^\s:]+):(?P<line>\d+)\s*(?:\(|- )Root cause: (?P<cause>.*)", re.S)
_SIZE = re.compile(r"Size mismatch for (shape|stride)#(\d+)(?:\('([^']*)'\))?: expected (-?\d+) but got (-?\d+)")
_OPTIONS = re.compile(r"Dtype value \[(\w+)\] not in the allowed options: \[([^\]]*)\]")
_DTYPE_MISMATCH = re.compile(r"DType mismatch: expected (\w+) but got (\w+)")
_RANK = re.compile(r"Tensor dimension mismatch: expected (\d+) but got (\d+)")
_VERIFY = re.compile(r"\.verify\(\s*(?:std::move\(\s*)?\*?\s*(\w+)")
_FROM_CPP = {cpp: dtype for dtype, cpp in CPP_DTYPES.items()}


@dataclass(frozen=True)
class Mismatch:
    """One TensorMatcher failure: which tensor (as passed), where, and the root cause."""

    file: str
    line: int
    shape: tuple[int, ...]
    dtype: str | None
    kind: str  # "shape" | "stride" (size mismatches) | "options" | "dtype" | "rank"
    cause: str
    index: int | None = None
    label: str | None = None
    expected: int | str | None = None
    got: int | str | None = None
    options: tuple[str, ...] = ()


def parse_message(message: str) -> Mismatch | None:
    """The TensorMatcher failure in a case's message, whether one-lined ("(Root cause: ...)") or raw."""
    m = _MATCH.search(message or "")
    if m is None:
        return None
    cause = m.group("cause").strip()
    if message[m.start("cause") - len("(Root cause: ")] == "(" and cause.endswith(")"):
        cause = cause[:-1]  # the one-line form: "... (Root cause: CAUSE)"
    shape = tuple(int(x) for x in m.group("shape").replace(" ", "").split(",") if x)
    base = {"file": m.group("file"), "line": int(m.group("line")), "shape": shape, "dtype": m.group("dtype"),
            "cause": one_line(cause, 200)}
    if size := _SIZE.match(cause):
        kind, index, label, expected, got = size.groups()
        return Mismatch(kind=kind, index=int(index), label=label, expected=int(expected), got=int(got), **base)
    if options := _OPTIONS.match(cause):
        allowed = tuple(o.strip() for o in options.group(2).split(",") if o.strip())
        return Mismatch(kind="options", got=options.group(1), options=allowed, **base)
    if mismatch := _DTYPE_MISMATCH.match(cause):
        return Mismatch(kind="dtype", expected=mismatch.group(1), got=mismatch.group(2), **base)
    if rank := _RANK.match(cause):
        return Mismatch(kind="rank", expected=int(rank.group(1)), got=int(rank.group(2)), **base)
    return Mismatch(kind="other", **base)


def spec_dtype(name: str) -> str | None:
    """A dtype as tvm-ffi prints it (or its C++ spelling) as a spec dtype; None if specs cannot hold it."""
    return name if name in DTYPE_BYTES else _FROM_CPP.get(name)


def source_statement(tree: SglangTree, file: str, line: int) -> tuple[list[str], list[str]] | None:
    """(TensorMatcher dims as written, `.verify(x)` targets) of the statement that spans FILE:LINE."""
    path = next((root / file for root in (tree.csrc_dir, tree.include_dir) if (root / file).is_file()), None)
    if path is None:
        return None
    lines = path.read_text(errors="replace").splitlines()
    if not 0 < line <= len(lines):
        return None
    start = line - 1
    while start > 0 and "TensorMatcher" not in lines[start] and not lines[start - 1].rstrip().endswith((";", "{", "}")):
        start -= 1
    end = line - 1
    while end < len(lines) - 1 and ";" not in lines[end]:
        end += 1
    text = " ".join(lines[start:end + 1])
    dims: list[str] = []
    head = text.find("TensorMatcher")
    if head >= 0 and (brace := text.find("{", head)) >= 0 and (close := closing(text, brace)) is not None:
        dims = split_top(text[brace + 1:close])
    return dims, _VERIFY.findall(text)


def cxx_to_spec(expr: str, table: dict[str, str]) -> str | int | None:
    """A C++ size expression (names, integers, + - * / % and grouping parentheses) in the spec names
    `table` gives; None when it uses anything else (a call, a member, an unknown name). Unlike
    `infer.translate`, whose check refuses every parenthesis, `(num_q_heads + 1) * D` translates."""
    text = re.sub(r"static_cast<[\w:]+>", "", expr).strip()
    if not text or re.search(r"\.|->|\[|\?|::|\w\s*\(", text):
        return None
    out = []
    for token in re.findall(r"[A-Za-z_]\w*|\d+|\S", text):
        if token[0].isalpha() or token[0] == "_":
            if token not in table:
                return None
            out.append(table[token] if re.fullmatch(r"\w+", table[token]) else f"({table[token]})")
        elif token.isdigit() or token in "+-*%()":
            out.append(token)
        elif token == "/":
            out.append("//")
        else:
            return None
    spec = " ".join(out).replace("( ", "(").replace(" )", ")")
    while re.search(r"\((\w+)\)", spec):
        spec = re.sub(r"\((\w+)\)", r"\1", spec)  # `static_cast<int64_t>(k)` leaves `(k)`
    return int(spec) if re.fullmatch(r"\d+", spec) else spec
