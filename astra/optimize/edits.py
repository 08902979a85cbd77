"""Edits from a model's reply (aider-style): SEARCH/REPLACE blocks or a whole file.

    <<<<<<< SEARCH
    exact lines
    =======
    replacement lines
    >>>>>>> REPLACE

    FILE: elementwise/rmsnorm.cuh
    ```cuda
    ...the complete file...
    ```

`parse_edits` reads them (raising `EditFormatError` with a message for the model when the reply is
malformed); `apply_edits` applies them in order: an exact line match first, then a match that ignores
whitespace (re-indenting the replacement by the same offset). A block that matches nowhere or in more
than one place fails; the others still apply. Every failure carries a message written for the model:
which block, the nearest real lines of the file, and which blocks already applied. `apply_reply` does
both steps and turns a malformed reply into a failure, so the loop can always send `feedback()` back.
"""

from __future__ import annotations

import difflib
import re
from dataclasses import dataclass, field
from pathlib import PurePosixPath

SEARCH_RE = re.compile(r"^\s*<{5,9} ?SEARCH\b.*$")
DIVIDER_RE = re.compile(r"^\s*={5,9}\s*$")
REPLACE_RE = re.compile(r"^\s*>{5,9} ?REPLACE\b.*$")
FILE_RE = re.compile(r"^\s*(?:\*\*)?FILE:\s*`?([^`*\s]+)`?(?:\*\*)?\s*$")
FENCE_RE = re.compile(r"^\s*```")
CONTEXT = 2  # extra file lines shown around the nearest match
FORMAT_HELP = ("Give each edit as\n<<<<<<< SEARCH\nexact lines from the file\n=======\nreplacement lines\n"
               ">>>>>>> REPLACE\nor the whole file as a line `FILE: <name>` followed by one ```cuda block.")


class EditFormatError(ValueError):
    """The reply holds no usable edit; `str()` is a message for the model."""


@dataclass
class Edit:
    index: int  # 1-based, in reply order
    search: list[str]  # lines; empty for a whole file
    replace: list[str]
    file: str | None = None
    whole: bool = False

    @property
    def first_line(self) -> str:
        lines = [line for line in (self.replace if self.whole else self.search) if line.strip()]
        return lines[0].strip() if lines else ""


@dataclass
class EditFailure:
    index: int  # 0: the reply as a whole (malformed)
    first_line: str
    reason: str  # "no_match" | "ambiguous" | "empty_search" | "wrong_file" | "format"
    detail: str  # the block-specific message for the model
    applied: list[int] = field(default_factory=list)

    @property
    def message(self) -> str:
        """`detail` plus which blocks already applied: complete on its own."""
        return f"{self.detail}\n{_applied_line(self.applied)}"


@dataclass
class EditResult:
    new_text: str
    applied: list[int]
    failed: list[EditFailure]

    @property
    def ok(self) -> bool:
        return not self.failed

    def feedback(self) -> str:
        """One message for the model covering every failure ("" when all applied)."""
        if not self.failed:
            return ""
        parts = [f.detail for f in self.failed]
        if self.failed[0].reason != "format":
            parts.append(_applied_line(self.applied) + " Send corrected blocks for the failed ones only; "
                         "their SEARCH lines must match the file as it is now, after the applied blocks.")
        return "\n\n".join(parts)


def _applied_line(applied: list[int]) -> str:
    if not applied:
        return "No block applied; the file is unchanged."
    return f"Already applied (do not send again): block{'s' if len(applied) > 1 else ''} " \
           f"{', '.join(map(str, applied))}."


def parse_edits(reply: str) -> list[Edit]:
    """The edits in `reply`, in order. Raises EditFormatError when there are none or one is cut off."""
    lines, edits, i, pending_file = reply.splitlines(), [], 0, None
    while i < len(lines):
        line = lines[i]
        file_match = FILE_RE.match(line)
        if file_match:
            pending_file = file_match.group(1)
            j = i + 1
            while j < len(lines) and not lines[j].strip():
                j += 1
            end = next((k for k in range(j + 1, len(lines)) if lines[k].strip() == "```"), None)
            blocks_inside = any(SEARCH_RE.match(x) for x in lines[j + 1:end or len(lines)])
            if j < len(lines) and FENCE_RE.match(lines[j]) and not blocks_inside:
                if end is None:
                    raise EditFormatError(f"the whole file after `FILE: {pending_file}` has no closing ``` "
                                          "fence; the reply was probably cut off. Send the complete file, "
                                          "or smaller SEARCH/REPLACE blocks.")
                edits.append(Edit(len(edits) + 1, [], lines[j + 1:end], pending_file, whole=True))
                i, pending_file = end + 1, None
                continue
            i += 1
            continue
        if SEARCH_RE.match(line):
            index = len(edits) + 1
            divider = _find(lines, i + 1, DIVIDER_RE, index, "=======", stop=(SEARCH_RE, REPLACE_RE))
            end = _find(lines, divider + 1, REPLACE_RE, index, ">>>>>>> REPLACE", stop=(SEARCH_RE, DIVIDER_RE))
            edits.append(Edit(index, lines[i + 1:divider], lines[divider + 1:end], pending_file))
            i, pending_file = end + 1, None
            continue
        if DIVIDER_RE.match(line) or REPLACE_RE.match(line):
            raise EditFormatError(f"line {i + 1} of your reply (`{line.strip()}`) is outside any block: "
                                  f"a block starts with `<<<<<<< SEARCH`. {FORMAT_HELP}")
        i += 1
    if not edits:
        fenced = any(FENCE_RE.match(line) for line in lines)
        hint = (" A whole file needs a line `FILE: <name>` right before its ``` fence." if fenced else "")
        raise EditFormatError(f"your reply holds no edit.{hint} {FORMAT_HELP}")
    return edits


def _find(lines: list[str], start: int, pattern: re.Pattern, index: int, marker: str,
          stop: tuple[re.Pattern, ...]) -> int:
    for k in range(start, len(lines)):
        if pattern.match(lines[k]):
            return k
        if any(p.match(lines[k]) for p in stop):
            raise EditFormatError(f"block {index} has `{lines[k].strip()}` (line {k + 1} of your reply) "
                                  f"where `{marker}` belongs. {FORMAT_HELP}")
    raise EditFormatError(f"block {index} is not terminated: no `{marker}` line after line {start} of your "
                          f"reply (was it cut off?). Send it again complete. {FORMAT_HELP}")


def _norm(line: str) -> str:
    return " ".join(line.split())


def _positions(haystack: list[str], needle: list[str]) -> list[int]:
    n = len(needle)
    return [i for i in range(len(haystack) - n + 1) if haystack[i:i + n] == needle]


def _indent(line: str) -> str:
    return line[: len(line) - len(line.lstrip())]


def _reindent(replace: list[str], search: list[str], found: list[str]) -> list[str]:
    """Shift the replacement by the indentation offset between the model's SEARCH and the file."""
    pairs = [(s, f) for s, f in zip(search, found) if s.strip()]
    if not pairs:
        return replace
    ours, theirs = _indent(pairs[0][0]), _indent(pairs[0][1])
    if theirs.endswith(ours):
        extra = theirs[: len(theirs) - len(ours)]
        return [extra + line if line.strip() else line for line in replace]
    if ours.endswith(theirs):
        cut = ours[: len(ours) - len(theirs)]
        return [line[len(cut):] if line.startswith(cut) else line for line in replace]
    return replace


def _trim_blank(lines: list[str]) -> list[str]:
    start, end = 0, len(lines)
    while start < end and not lines[start].strip():
        start += 1
    while end > start and not lines[end - 1].strip():
        end -= 1
    return lines[start:end]


def _nearest(file_lines: list[str], search: list[str]) -> str:
    """The window of the file most like `search` (difflib over windows of its length), numbered."""
    n = max(1, len(search))
    target = "\n".join(_norm(s) for s in search)
    best, best_at = -1.0, 0
    for i in range(max(1, len(file_lines) - n + 1)):
        window = "\n".join(_norm(s) for s in file_lines[i:i + n])
        matcher = difflib.SequenceMatcher(None, target, window, autojunk=False)
        if matcher.real_quick_ratio() > best and matcher.quick_ratio() > best and matcher.ratio() > best:
            best, best_at = matcher.ratio(), i
    lo, hi = max(0, best_at - CONTEXT), min(len(file_lines), best_at + n + CONTEXT)
    width = len(str(hi))
    shown = "\n".join(f"{k + 1:>{width}} | {file_lines[k]}" for k in range(lo, hi))
    return (f"The nearest lines of the file ({best:.0%} similar; lines {best_at + 1}-{best_at + n}, shown with "
            f"{CONTEXT} lines around them; the numbers and `|` are not part of the file):\n{shown}")


def _locate(lines: list[str], edit: Edit) -> tuple[list[int], int, list[str]]:
    """Where the block's SEARCH matches (start lines), how many file lines it covers, and the lines
    that replace them: exact first, then without surrounding blank lines, then ignoring whitespace."""
    search, replace = _trim_blank(edit.search), _trim_blank(edit.replace)
    for ours, theirs in ((edit.search, edit.replace), (search, replace)):
        found = _positions(lines, ours)
        if found:
            return found, len(ours), theirs
    found = _positions([_norm(line) for line in lines], [_norm(line) for line in search])
    if len(found) == 1:
        replace = _reindent(replace, search, lines[found[0]:found[0] + len(search)])
    return found, len(search), replace


def apply_edits(text: str, edits: list[Edit], *, filename: str | None = None) -> EditResult:
    """Apply `edits` in order to `text`; failed blocks are skipped and reported (see module doc)."""
    trailing = text.endswith("\n")
    lines, applied, failures = text.splitlines(), [], []
    for edit in edits:
        label = f"Block {edit.index} (first line `{edit.first_line}`)"
        if edit.file and filename and PurePosixPath(edit.file).name != PurePosixPath(filename).name:
            failures.append(EditFailure(edit.index, edit.first_line, "wrong_file",
                                        f"{label} names `{edit.file}`, but the only file you may edit is "
                                        f"`{filename}`."))
            continue
        if edit.whole:
            lines, trailing = list(edit.replace), True
            applied.append(edit.index)
            continue
        if not _trim_blank(edit.search):
            failures.append(EditFailure(edit.index, "", "empty_search",
                                        f"Block {edit.index} has an empty SEARCH section. Quote the existing "
                                        "lines to replace; to rewrite everything, send the whole file."))
            continue
        found, size, replace = _locate(lines, edit)
        if len(found) == 1:
            lines = lines[:found[0]] + replace + lines[found[0] + size:]
            applied.append(edit.index)
        elif not found:
            failures.append(EditFailure(edit.index, edit.first_line, "no_match",
                                        f"{label} failed: its SEARCH lines match nothing in the file, even "
                                        f"ignoring whitespace. {_nearest(lines, _trim_blank(edit.search))}\nCopy the SEARCH "
                                        "lines from the file exactly."))
        else:
            where = ", ".join(str(k + 1) for k in found[:8])
            failures.append(EditFailure(edit.index, edit.first_line, "ambiguous",
                                        f"{label} failed: its SEARCH lines match {len(found)} places (starting "
                                        f"at lines {where}). Add unchanged lines around the change so that "
                                        "the SEARCH section matches exactly one place."))
    for failure in failures:
        failure.applied = list(applied)
    new_text = "\n".join(lines) + ("\n" if trailing and lines else "")
    return EditResult(new_text, applied, failures)


def apply_reply(text: str, reply: str, *, filename: str | None = None) -> EditResult:
    """Parse `reply` and apply its edits; a malformed reply becomes one failure with index 0."""
    try:
        edits = parse_edits(reply)
    except EditFormatError as err:
        return EditResult(text, [], [EditFailure(0, "", "format", str(err))])
    return apply_edits(text, edits, filename=filename)
