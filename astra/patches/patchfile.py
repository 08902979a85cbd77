"""Reading Astra patches (trailers, the one file they change, hunk integrity) and applying them with git.

An Astra patch is a `git format-patch` mail whose message ends with machine-readable trailers:

    Astra-Spec: fused_add_rmsnorm
    Astra-Kernel-File: python/sglang/kernels/jit/csrc/elementwise/fused_add_rmsnorm.cuh
    Astra-Base-SHA256: <sha256 of the original file>
    Astra-Patched-SHA256: <sha256 of the file after the patch>
    Astra-SGLang-Version: 0.5.23
    Astra-GPU: NVIDIA H200

and whose diff changes exactly that one file, either at its SGLang repository path (`python/sglang/...`,
the "repo" layout) or at its installed-package path (`sglang/...`, the "package" layout).
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

from astra.errors import NotAnAstraPatch, ToolMissing

REQUIRED = ("Astra-Spec", "Astra-Kernel-File", "Astra-Base-SHA256", "Astra-Patched-SHA256")
_TRAILER = re.compile(r"^(Astra-[A-Za-z0-9-]+):[ \t]*(\S.*?)\s*$", re.M)
_DIFF = re.compile(r"^diff --git a/(\S+) b/(\S+)$", re.M)
_HUNK = re.compile(r"^@@ -\d+(?:,(\d+))? \+\d+(?:,(\d+))? @@")
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
    """Read and validate an Astra patch; NotAnAstraPatch (exit 9) says what is wrong with it."""
    path = Path(path)
    try:
        text = path.read_bytes().decode("utf-8")
    except FileNotFoundError:
        raise NotAnAstraPatch(f"{path}: no such file") from None
    except (OSError, UnicodeDecodeError) as err:
        raise NotAnAstraPatch(f"{path}: not a readable text patch ({err})") from None
    first_diff = _DIFF.search(text)
    message = text[: first_diff.start()] if first_diff else text
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
    files = {b for _, b in _DIFF.findall(text)}
    repo_path = trailers["Astra-Kernel-File"]
    package_path = repo_path.removeprefix("python/")
    if files - {repo_path, package_path} or len(files) != 1:
        raise NotAnAstraPatch(
            f"{path}: inconsistent patch: its trailers name {repo_path} but its diff changes "
            f"{', '.join(sorted(files))}; it was edited by hand, re-emit it with `astra patch`")
    diff_path = files.pop()
    _check_hunks(path, text, first_diff.start())
    subject = next((line[len("Subject: "):] for line in message.splitlines() if line.startswith("Subject: ")), "")
    return AstraPatch(path=path, text=text, trailers=trailers, diff_path=diff_path,
                      layout="repo" if diff_path == repo_path else "package", subject=subject)


def _check_hunks(path: Path, text: str, start: int) -> None:
    """Every hunk must hold as many old and new lines as its header says (catches truncation)."""
    lines = text[start:].split("\n")
    offset = text[:start].count("\n")
    hunks = 0
    i = 0
    while i < len(lines):
        match = _HUNK.match(lines[i])
        if not match:
            i += 1
            continue
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
        if old < 0 or new < 0:
            raise NotAnAstraPatch(f"{path}: corrupt patch: the hunk at line {header_line} has extra lines")
    if hunks == 0:
        raise NotAnAstraPatch(f"{path}: corrupt patch: the diff has no hunks (truncated?)")


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


def git_apply(patch: Path, cwd: Path, *, strip: int = 1, check: bool = False,
              context: int | None = None) -> tuple[bool, str]:
    """`git apply` (or `--check`) of `patch` in `cwd`. Returns (ok, git's message: first telling line)."""
    cmd = [git_exe(), "apply", f"-p{strip}", "--whitespace=nowarn"]
    if check:
        cmd.append("--check")
    if context is not None:
        cmd.append(f"-C{context}")
    cmd.append(str(Path(patch).resolve()))
    proc = subprocess.run(cmd, cwd=cwd, env=_git_env(cwd), capture_output=True, text=True)
    return proc.returncode == 0, _first_error(proc.stderr)


def gnu_patch() -> str | None:
    """GNU patch on PATH (its fuzz differs from git's -C), else None."""
    exe = shutil.which("patch")
    if exe is None:
        return None
    proc = subprocess.run([exe, "--version"], capture_output=True, text=True)
    return exe if proc.returncode == 0 and "GNU patch" in proc.stdout else None


def gnu_patch_apply(patch: Path, cwd: Path, *, strip: int = 1, fuzz: int = 2,
                    dry_run: bool = False) -> tuple[bool, str]:
    """GNU `patch --fuzz` of `patch` in `cwd`; (ok, its message)."""
    exe = gnu_patch()
    if exe is None:
        return False, "GNU patch not installed"
    cmd = [exe, f"-p{strip}", f"--fuzz={fuzz}", "--batch", "--forward", "--no-backup-if-mismatch",
           "-i", str(Path(patch).resolve())]
    if dry_run:
        cmd.append("--dry-run")
    proc = subprocess.run(cmd, cwd=cwd, capture_output=True, text=True)
    out = (proc.stdout + proc.stderr).strip().splitlines()
    return proc.returncode == 0, " / ".join(line.strip() for line in out[-2:])


def _first_error(stderr: str) -> str:
    lines = [line.strip() for line in stderr.splitlines() if line.strip()]
    for line in lines:
        if line.startswith("error:"):
            return line
    return lines[0] if lines else ""
