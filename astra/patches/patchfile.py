"""Reading Astra patches (trailers, the one file they change, hunk integrity) and applying them with git.

An Astra patch is a `git format-patch` mail whose message ends with machine-readable trailers:

    Astra-Spec: fused_add_rmsnorm
    Astra-Kernel-File: python/sglang/kernels/jit/csrc/elementwise/fused_add_rmsnorm.cuh
    Astra-Base-SHA256: <sha256 of the original file>
    Astra-Patched-SHA256: <sha256 of the file after the patch>
    Astra-SGLang-Version: 0.5.23
    Astra-GPU: NVIDIA H200

and whose diff changes exactly that one file, either at its SGLang repository path (`python/sglang/...`,
the "repo" layout) or at its installed-package path (`sglang/...`, the "package" layout). "Exactly" is
what git says: `git apply --numstat`/`--summary` of the text (astra.patches.scope) must list that one
file, once, as a text change — hunks outside `diff --git` (plain `---/+++/@@` diffs after the diff or in
the message), binary patches, renames, mode changes and creations all count. The text must also be that
one diff and nothing else a patch tool reads. What is checked is what is applied: `git_apply` takes the
parsed text (stdin), GNU patch (recheck's fuzzy fallback) only the parsed `diff --git` section.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

from astra import input_files
from astra.errors import NotAnAstraPatch, ToolMissing
from astra.patches import scope

REQUIRED = ("Astra-Spec", "Astra-Kernel-File", "Astra-Base-SHA256", "Astra-Patched-SHA256")
_TRAILER = re.compile(r"^(Astra-[A-Za-z0-9-]+):[ \t]*(\S.*?)\s*$", re.M)
_DIFF = re.compile(r"^diff --git a/(\S+) b/(\S+)$", re.M)
_HUNK = re.compile(r"^@@ -\d+(?:,(\d+))? \+\d+(?:,(\d+))? @@")
_DIFF_HEADER = re.compile(r"^(?:index [0-9a-f]+\.\.[0-9a-f]+(?: [0-7]{6})?|--- \S.*|\+\+\+ \S.*)$")
_SHA = re.compile(r"^[0-9a-f]{64}$")


@dataclass
class AstraPatch:
    """A parsed Astra patch. `diff_path` is the path its diff changes; `layout` is "repo" or "package"."""

    path: Path
    text: str
    trailers: dict[str, str]
    diff_path: str
    layout: str
    subject: str = ""
    diff_text: str = ""  # the one `diff --git` section, without the message and the signature

    @property
    def spec(self) -> str:
        return self.trailers["Astra-Spec"]

    @property
    def repo_path(self) -> str:
        return self.trailers["Astra-Kernel-File"]

    @property
    def package_path(self) -> str:
        """The kernel file's path inside an installed package (`sglang/...`)."""
        return self.repo_path.removeprefix("python/")

    @property
    def csrc_rel(self) -> str | None:
        """The kernel file relative to the JIT `csrc/` directory (the same across layouts), if any."""
        _, sep, rel = self.package_path.partition("/csrc/")
        return rel if sep else None

    @property
    def base_sha(self) -> str:
        return self.trailers["Astra-Base-SHA256"]

    @property
    def patched_sha(self) -> str:
        return self.trailers["Astra-Patched-SHA256"]

    @property
    def sglang_version(self) -> str | None:
        return self.trailers.get("Astra-SGLang-Version")

    @property
    def strip(self) -> int:
        """The `-p` that turns the diff's paths into paths below an SGLang tree's root (which holds sglang/)."""
        return 2 if self.layout == "repo" else 1


def parse(path: str | os.PathLike) -> AstraPatch:
    """Read and validate an Astra patch; NotAnAstraPatch (exit 9) says what is wrong with it.

    Beyond its trailers, `git apply --numstat`/`--summary` of the text must show exactly one text change, to
    the file the trailers name (astra.patches.scope), and the text must be that one diff: no other patch in
    its message, nothing after its signature that any patch tool reads."""
    path = Path(path)
    try:  # a regular file of at most PATCH_BYTES, UTF-8 (astra.input_files)
        text = input_files.read_text(path, input_files.PATCH_BYTES, what="an Astra patch")
    except input_files.Refused as err:
        raise NotAnAstraPatch(str(err)) from None
    diffs = list(_DIFF.finditer(text))
    first_diff = diffs[0] if diffs else None
    message = text[: diffs[-1].start()] if diffs else text
    trailers = dict(_TRAILER.findall(message))
    missing = [key for key in REQUIRED if key not in trailers]
    if missing and first_diff is None and ("Astra-" in text or text.startswith("From ")):
        raise NotAnAstraPatch(f"{path}: corrupt patch: it ends before its Astra trailers and its diff (truncated?); "
                              "take the patch file again from where it was emitted")
    if missing:
        raise NotAnAstraPatch(
            f"{path}: not an Astra patch (no {', '.join(missing)} trailer); Astra patches come from "
            "`astra patch` — apply other patches with `git apply`")
    for key in ("Astra-Base-SHA256", "Astra-Patched-SHA256"):
        if not _SHA.match(trailers[key]):
            raise NotAnAstraPatch(f"{path}: corrupt patch: {key} is not 64 lowercase hex characters")
    if first_diff is None:
        raise NotAnAstraPatch(f"{path}: corrupt patch: the message is there but the diff is missing (truncated?)")
    repo_path = trailers["Astra-Kernel-File"]
    package_path = repo_path.removeprefix("python/")
    seen, error = scope.git_scope(text, git_exe())
    if seen is None:
        _check_diff(path, text, first_diff.start())  # our own words for a truncated patch, if that is it
        raise NotAnAstraPatch(f"{path}: corrupt patch: git apply cannot read it ({error})")
    diff_path = scope.require_one_file(str(path), seen, repo_path, package_path)
    files = [b for _, b in _DIFF.findall(text)]
    if files != [diff_path]:
        raise NotAnAstraPatch(
            f"{path}: inconsistent patch: its trailers name {repo_path} but its diff changes "
            f"{', '.join(sorted(set(files)))}; it was edited by hand, re-emit it with `astra patch`")
    _check_message(path, message)
    diff_text = _check_diff(path, text, first_diff.start())
    subject = next((line[len("Subject: "):] for line in message.splitlines() if line.startswith("Subject: ")), "")
    return AstraPatch(path=path, text=text, trailers=trailers, diff_path=diff_path,
                      layout="repo" if diff_path == repo_path else "package", subject=subject, diff_text=diff_text)


def _check_message(path: Path, message: str) -> None:
    """No line of the message body (after the mail headers) may start a patch for any patch tool."""
    lines = message.split("\n")
    start = lines.index("") if "" in lines else 0
    for number, line in enumerate(lines[start:], start + 1):
        if scope.PATCH_START.match(line):
            raise NotAnAstraPatch(
                f"{path}: inconsistent patch: line {number} of its message starts a patch ({line[:60]!r}); "
                "Astra indents free text so that no tool reads it as one — re-emit it with `astra patch`")


def _check_diff(path: Path, text: str, start: int) -> str:
    """The one diff from `start`: a header, hunks holding as many old and new lines as their headers say
    (catches truncation), then nothing but the `-- ` signature. Returns the diff without the signature."""
    lines = text[start:].split("\n")
    offset = text[:start].count("\n")
    hunks = 0
    i = 1
    while i < len(lines) and not _HUNK.match(lines[i]):
        if not _DIFF_HEADER.match(lines[i]) and not (lines[i] == "" and i == len(lines) - 1):
            raise NotAnAstraPatch(f"{path}: inconsistent patch: line {offset + i + 1} of its diff header is not "
                                  f"one git writes for a modification: {lines[i][:60]!r}")
        i += 1
    while i < len(lines):
        match = _HUNK.match(lines[i])
        if not match:
            if lines[i] == "-- " or (lines[i] == "" and i == len(lines) - 1):
                break
            raise NotAnAstraPatch(
                f"{path}: inconsistent patch: line {offset + i + 1} after its diff is not part of it "
                f"({lines[i][:60]!r}; something appended?); re-emit it with `astra patch`")
        hunks += 1
        header_line = offset + i + 1
        old = int(match.group(1) or 1)
        new = int(match.group(2) or 1)
        i += 1
        while old > 0 or new > 0:
            if i >= len(lines) or (lines[i] == "" and i == len(lines) - 1):
                raise NotAnAstraPatch(
                    f"{path}: corrupt patch: the hunk at line {header_line} ends early "
                    f"({old} old and {new} new lines missing; truncated?)")
            line = lines[i]
            tag = line[:1]
            if tag == " " or line == "":
                old, new = old - 1, new - 1
            elif tag == "-":
                old -= 1
            elif tag == "+":
                new -= 1
            elif tag != "\\":
                raise NotAnAstraPatch(
                    f"{path}: corrupt patch: line {offset + i + 1} inside the hunk at line {header_line} "
                    f"is not a diff line: {line[:60]!r}")
            i += 1
        while i < len(lines) and lines[i].startswith("\\"):
            i += 1
        if old < 0 or new < 0:
            raise NotAnAstraPatch(f"{path}: corrupt patch: the hunk at line {header_line} has extra lines")
    if hunks == 0:
        raise NotAnAstraPatch(f"{path}: corrupt patch: the diff has no hunks (truncated?)")
    diff_text = "\n".join(lines[:i]) + "\n"
    for j in range(i + 1, len(lines)):
        if scope.PATCH_START.match(lines[j]) or _HUNK.match(lines[j]):
            raise NotAnAstraPatch(
                f"{path}: inconsistent patch: line {offset + j + 1}, after its signature, starts a patch "
                f"({lines[j][:60]!r}); re-emit it with `astra patch`")
    return diff_text


# ---------------------------------------------------------------- applying


def git_exe() -> str:
    exe = shutil.which("git")
    if exe is None:
        raise ToolMissing("git is not on PATH; Astra makes and applies patches with the git CLI (install git)")
    return exe


def _git_env(cwd: Path) -> dict[str, str]:
    """Keep git from discovering a repository above `cwd` (a checkout's top, or a project holding a cache):
    paths in the patch are then always relative to `cwd`."""
    env = dict(os.environ)
    env["GIT_CEILING_DIRECTORIES"] = str(Path(cwd).resolve().parent)
    for var in ("GIT_DIR", "GIT_WORK_TREE", "GIT_INDEX_FILE"):
        env.pop(var, None)
    return env


def git_apply(patch_text: str, cwd: Path, *, strip: int = 1, check: bool = False,
              context: int | None = None) -> tuple[bool, str]:
    """`git apply` (or `--check`) of `patch_text` (a parsed patch's text, given on stdin so that what is
    applied is what was checked) in `cwd`. Returns (ok, git's message: first telling line)."""
    cmd = [git_exe(), "apply", f"-p{strip}", "--whitespace=nowarn"]
    if check:
        cmd.append("--check")
    if context is not None:
        cmd.append(f"-C{context}")
    proc = subprocess.run(cmd, cwd=cwd, env=_git_env(cwd), input=patch_text.encode("utf-8"), capture_output=True)
    return proc.returncode == 0, _first_error(proc.stderr.decode("utf-8", "replace"))


def gnu_patch() -> str | None:
    """GNU patch on PATH (its fuzz differs from git's -C), else None."""
    exe = shutil.which("patch")
    if exe is None:
        return None
    proc = subprocess.run([exe, "--version"], capture_output=True, text=True)
    return exe if proc.returncode == 0 and "GNU patch" in proc.stdout else None


def gnu_patch_apply(diff_text: str, cwd: Path, *, strip: int = 1, fuzz: int = 2,
                    dry_run: bool = False) -> tuple[bool, str]:
    """GNU `patch --fuzz` of `diff_text` in `cwd`; (ok, its message). Give it only a parsed patch's
    `diff_text`: GNU patch also reads context diffs, ed scripts and normal diffs that git does not count."""
    exe = gnu_patch()
    if exe is None:
        return False, "GNU patch not installed"
    cmd = [exe, f"-p{strip}", f"--fuzz={fuzz}", "--batch", "--forward", "--no-backup-if-mismatch"]
    if dry_run:
        cmd.append("--dry-run")
    proc = subprocess.run(cmd, cwd=cwd, input=diff_text.encode("utf-8"), capture_output=True)
    out = (proc.stdout + proc.stderr).decode("utf-8", "replace").strip().splitlines()
    return proc.returncode == 0, " / ".join(line.strip() for line in out[-2:])


def _first_error(stderr: str) -> str:
    lines = [line.strip() for line in stderr.splitlines() if line.strip()]
    for line in lines:
        if line.startswith("error:"):
            return line
    return lines[0] if lines else ""
