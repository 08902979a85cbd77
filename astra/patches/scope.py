"""Patches change only what they name: what `git apply` would touch, and free text that cannot parse as a diff.

`git apply` does not stop at `diff --git` sections: it also applies plain `---`/`+++`/`@@` hunks anywhere
in its input (after a patch's signature, or inside its commit message), binary patches, renames, mode
changes and creations from /dev/null. So the authority on what an Astra patch changes is git itself:
`git apply --numstat -z` (one entry per patch git would apply, binary ones as `-`) and `git apply --summary`
(creations, deletions, renames, copies, mode changes), run on the patch text alone (no tree needed).
`astra apply`, `astra recheck` and the emitter (on what it wrote) accept a patch only when git would change
exactly the one kernel file its trailers name, once, as a text modification.

Free text in a commit message (the `why` of a patch, which in `astra optimize` comes from the LLM's plan) is
indented by four spaces line by line, with control and invisible formatting characters removed, so that no
line of it starts a patch for git apply, git mailinfo (`diff -`, `Index: `, `--- NAME`), git mailsplit
(`From `), GNU patch (`*** `) or reads as an in-body header or an Astra trailer.
"""

from __future__ import annotations

import os
import re
import subprocess
import tempfile
import unicodedata
from dataclasses import dataclass, field
from pathlib import Path

from astra.errors import NotAnAstraPatch

INDENT = "    "
# A line that some patch tool or mail splitter reads as the start of a patch, a new mail or a header.
PATCH_START = re.compile(r"^(?:diff |Index: |--- ?\S|\+\+\+ |@@ |\*\*\* ?\S|From[ :]|Subject:|Date:|GIT binary patch|"
                         r"Binary files |rename (?:from|to) |copy (?:from|to) |(?:old|new|deleted file|new file) mode )")


@dataclass
class Scope:
    """What `git apply` would do with a patch text: one `(added, deleted, path)` per file patch, in order
    (`-` counts for a binary patch), and its --summary lines (create/delete/rename/copy/mode change)."""

    files: list[tuple[str, str, str]] = field(default_factory=list)
    summary: list[str] = field(default_factory=list)

    @property
    def paths(self) -> list[str]:
        return list(dict.fromkeys(path for _, _, path in self.files))


def _git(git: str, text: bytes, *args: str) -> tuple[bool, bytes, str]:
    with tempfile.TemporaryDirectory(prefix="astra-scope-") as tmp:
        env = {k: v for k, v in os.environ.items() if not k.startswith("GIT_")}
        # No repository above, no user or system configuration: git reads the patch text and nothing else.
        env.update(GIT_CEILING_DIRECTORIES=str(Path(tmp).resolve().parent), HOME=tmp, XDG_CONFIG_HOME=tmp,
                   GIT_CONFIG_NOSYSTEM="1", LC_ALL="C")
        proc = subprocess.run([git, "apply", *args], input=text, cwd=tmp, env=env, capture_output=True)
    err = proc.stderr.decode("utf-8", "replace").strip().splitlines()
    first = next((line for line in err if line.startswith("error:")), err[0] if err else "")
    return proc.returncode == 0, proc.stdout, first


def git_scope(text: str, git: str) -> tuple[Scope | None, str]:
    """(what git would change, "") or (None, git's error) when git cannot read the patch."""
    data = text.encode("utf-8")
    ok, out, error = _git(git, data, "--numstat", "-z", "-p1")
    if not ok:
        return None, error
    scope = Scope()
    for entry in out.split(b"\0"):
        if not entry:
            continue
        parts = entry.decode("utf-8", "replace").split("\t", 2)
        if len(parts) != 3:
            return None, f"unexpected `git apply --numstat` output {entry[:80]!r}"
        scope.files.append((parts[0], parts[1], parts[2]))
    ok, out, error = _git(git, data, "--summary", "-p1")
    if not ok:
        return None, error
    scope.summary = [line.strip() for line in out.decode("utf-8", "replace").splitlines() if line.strip()]
    return scope, ""


def require_one_file(label: str, scope: Scope, repo_path: str, package_path: str) -> str:
    """The one path (repo or package layout) `scope` changes; NotAnAstraPatch naming anything else."""
    allowed = {repo_path, package_path}
    paths = scope.paths
    fix = "an Astra patch changes only the file its trailers name; refused, nothing was changed"
    if not paths:
        raise NotAnAstraPatch(f"{label}: corrupt patch: `git apply --numstat` finds no change in it (truncated?)")
    extra = [p for p in paths if p not in allowed]
    if extra or len(paths) != 1:
        raise NotAnAstraPatch(
            f"{label}: inconsistent patch: its trailers name {repo_path} but its diff changes "
            f"{', '.join(_show(p) for p in paths)} (as `git apply --numstat` reads it, hunks outside `diff --git` "
            f"included; extra: {', '.join(_show(p) for p in extra) or _show(paths[-1])}); {fix}")
    path = paths[0]
    if scope.summary:
        raise NotAnAstraPatch(f"{label}: inconsistent patch: besides changing the text of {path}, it makes git apply "
                              f"{'; '.join(one_line(s) for s in scope.summary)[:300]} (`git apply --summary`); {fix}")
    if len(scope.files) != 1:
        raise NotAnAstraPatch(f"{label}: inconsistent patch: it changes {path} in {len(scope.files)} separate "
                              f"diffs (one is hidden outside its `diff --git` section); {fix}")
    added, deleted, _ = scope.files[0]
    if added == "-" or deleted == "-":
        raise NotAnAstraPatch(f"{label}: inconsistent patch: it is a binary patch of {path}; {fix}")
    return path


def _show(path: str) -> str:
    return one_line(path)[:200]


# ---------------------------------------------------------------- free text in commit messages


def _clean(line: str) -> str:
    """`line` without control, invisible-format or separator characters (tabs become spaces)."""
    line = line.expandtabs(4)
    return "".join(c for c in line if unicodedata.category(c) not in ("Cc", "Cf", "Zl", "Zp", "Cs", "Co", "Cn"))


def free_text(text: str) -> list[str]:
    """`text` as message lines that cannot parse as a patch: every line cleaned and indented by four spaces
    (blank lines stay blank; leading and trailing blank lines dropped). Every line break Python knows
    (\\r, \\v, \\f, \\x85, \\u2028, ...) ends a line here, so none hides inside one."""
    lines = [_clean(line).rstrip() for line in str(text).splitlines()]
    while lines and not lines[0].strip():
        lines.pop(0)
    while lines and not lines[-1].strip():
        lines.pop()
    return [INDENT + line if line.strip() else "" for line in lines]


def one_line(text) -> str:
    """A value placed inside one line of a message (GPU name, shape label, ...): every line break and
    control character becomes a space."""
    return " ".join(_clean(part) for part in str(text).splitlines())


def guard(lines: list[str]) -> list[str]:
    """The safety net over a finished message: a line that still starts a patch gets indented."""
    return [INDENT + line if PATCH_START.match(line) else line for line in lines]
