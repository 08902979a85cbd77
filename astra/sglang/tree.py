"""Finding an SGLang source tree: a downloaded wheel of any version, a checkout, or the installed package.

Nothing here imports sglang (it would drag in its whole dependency tree); files are read as text.

Besides the kernels, a wheel gives the Python files of `sglang/srt/` (the runtime's call sites of the
kernels' op functions, read by `srt_gates`); trees unpacked before that get them on first use
(`ensure_srt`).

Two layouts of the JIT kernels exist:
  - `sglang/jit_kernel/`   (0.5.10, 0.5.15): loaders next to `csrc/` and `include/`
  - `sglang/kernels/jit/`  (0.5.20 on): `csrc/`, `include/` there, loaders under `sglang/kernels/ops/`
"""

from __future__ import annotations

import hashlib
import importlib.metadata
import importlib.util
import os
import re
import shutil
import subprocess
import sys
import tempfile
import zipfile
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path

from astra import DEFAULT_SGLANG_VERSION, input_files, paths
from astra.errors import AstraError, SglangNotFound

LAYOUTS = ("kernels/jit", "jit_kernel")
# What a wheel must give us: the JIT sources and every Python file that may call load_jit.
_WHEEL_PREFIXES = ("sglang/kernels/", "sglang/jit_kernel/")
_SRT_PREFIX = "sglang/srt/"  # only its .py files
_SRT_MARKER = ".srt-complete"
_VERSION_RE = re.compile(r"^\d+(\.\d+)*([a-z0-9.+-]*)$", re.I)


@dataclass(frozen=True)
class SglangTree:
    """An SGLang package on disk: `root` holds the `sglang/` package directory."""

    root: Path
    version: str
    origin: str  # "wheel" | "checkout" | "installed"

    @cached_property
    def layout(self) -> str:
        for layout in LAYOUTS:
            if (self.root / "sglang" / layout / "csrc").is_dir():
                return layout
        raise SglangNotFound(
            f"{self.root}/sglang has neither sglang/kernels/jit/csrc nor sglang/jit_kernel/csrc: "
            "this SGLang has no JIT CUDA kernels (0.5.5 and older ship none); try --sglang 0.5.23"
        )

    @property
    def jit_dir(self) -> Path:
        return self.root / "sglang" / self.layout

    @property
    def csrc_dir(self) -> Path:
        return self.jit_dir / "csrc"

    @property
    def include_dir(self) -> Path:
        return self.jit_dir / "include"

    @property
    def srt_dir(self) -> Path | None:
        """`sglang/srt/` (the runtime) when this tree has it; a wheel tree only once fully unpacked."""
        srt = self.root / "sglang" / "srt"
        if self.origin == "wheel" and not (self.root / _SRT_MARKER).exists():
            return None
        return srt if srt.is_dir() else None

    @property
    def loader_dirs(self) -> list[Path]:
        """Directories whose Python files may call `load_jit`."""
        if self.layout == "jit_kernel":
            return [self.jit_dir]
        return [self.root / "sglang" / "kernels"]

    def python_files(self) -> list[Path]:
        files: list[Path] = []
        for base in self.loader_dirs:
            for path in sorted(base.rglob("*.py")):
                rel = path.relative_to(base).parts
                if "tests" in rel or "benchmark" in rel or rel[:1] == ("utils",):
                    continue
                files.append(path)
        return files

    def repo_path(self, path: Path) -> str:
        """The path of `path` in the SGLang git repository layout (`python/sglang/...`)."""
        return "python/" + Path(path).resolve().relative_to(self.root.resolve()).as_posix()

    def package_path(self, path: Path) -> str:
        """The path of `path` inside an installed package (`sglang/...`)."""
        return Path(path).resolve().relative_to(self.root.resolve()).as_posix()

    def requirement(self, package: str) -> str | None:
        """The version specifier SGLang's metadata gives for `package` (e.g. "==0.1.11"), if known."""
        for meta in sorted(self.root.glob("sglang-*.dist-info/METADATA")):
            for line in meta.read_text(errors="replace").splitlines():
                m = re.match(r"Requires-Dist:\s*" + re.escape(package) + r"\s*([^;]*)", line, re.I)
                if m:
                    return m.group(1).strip().strip("()") or None
        return None

    def describe(self) -> str:
        return f"SGLang {self.version} ({self.origin}, layout sglang/{self.layout}) at {self.root}"


def read_tree_text(path: Path) -> str:
    """A text file of an SGLang tree (a loader, a kernel source, pyproject.toml), undecodable bytes replaced: a
    regular file of at most input_files.SOURCE_BYTES, else input_files.Refused (a FIFO in a tree would block
    the command, a link to /dev/zero would read until memory runs out)."""
    return input_files.read_bytes(path, input_files.SOURCE_BYTES, what="a source file").decode("utf-8", "replace")


def sha256_file(path: Path) -> str:
    """sha256 of a regular file (read in chunks); anything else is input_files.Refused, never an endless read."""
    input_files.check_file(path)
    digest = hashlib.sha256()
    with open(path, "rb") as fh:
        for chunk in iter(lambda: fh.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


def locate(version: str | None = None, src: str | os.PathLike | None = None) -> SglangTree:
    """The tree the user asked for: `src` (a checkout or unpacked package), `version` (downloaded),
    else the installed package, else the pinned default version (downloaded)."""
    if version and src:
        raise AstraError("give either --sglang VERSION or --sglang-src PATH, not both")
    if src:
        return from_source(Path(src))
    if version:
        return from_wheel(version)
    installed = find_installed()
    if installed is not None:
        return installed
    return from_wheel(DEFAULT_SGLANG_VERSION)


def from_source(path: Path) -> SglangTree:
    try:
        path = path.expanduser().resolve()
        exists = path.exists()
    except RuntimeError as err:  # a symlink loop, or `~nosuchuser/...`
        raise SglangNotFound(f"--sglang-src {path}: not a usable path ({err})") from None
    except OSError as err:
        raise SglangNotFound(f"--sglang-src {path}: cannot be read ({err.strerror or err})") from None
    if not exists:
        raise SglangNotFound(f"--sglang-src {path}: no such directory")
    for root in (path / "python", path, path.parent):
        if (root / "sglang" / "__init__.py").is_file() or (root / "sglang" / "kernels").is_dir() or (
            root / "sglang" / "jit_kernel"
        ).is_dir():
            if path.name == "sglang" and root == path:
                continue
            tree = SglangTree(root=root, version=_version_of_source(root), origin="checkout")
            tree.layout  # noqa: B018  (validates the layout, raising a clear error)
            return tree
    raise SglangNotFound(
        f"--sglang-src {path}: not an SGLang tree (expected python/sglang/ in a checkout, "
        "or sglang/ in an unpacked package)"
    )


def find_installed() -> SglangTree | None:
    """The installed sglang package, found without importing it."""
    try:
        spec = importlib.util.find_spec("sglang")
    except (ImportError, ValueError):
        return None
    if spec is None or not spec.submodule_search_locations:
        return None
    pkg_dir = Path(list(spec.submodule_search_locations)[0])
    try:
        version = importlib.metadata.version("sglang")
    except importlib.metadata.PackageNotFoundError:
        version = _version_of_source(pkg_dir.parent)
    tree = SglangTree(root=pkg_dir.parent, version=version, origin="installed")
    try:
        tree.layout  # noqa: B018
    except SglangNotFound:
        return None
    return tree


def _version_of_source(root: Path) -> str:
    for candidate in (root / "sglang" / "_version.py",):
        if candidate.is_file():
            m = re.search(r"__version__\s*=\s*(?:version\s*=\s*)?['\"]([^'\"]+)['\"]", _text_or_empty(candidate))
            if m:
                return m.group(1)
    for pyproject in (root / "pyproject.toml", root.parent / "pyproject.toml"):
        if pyproject.exists():
            m = re.search(r'^version\s*=\s*"([^"]+)"', _text_or_empty(pyproject), re.M)
            if m:
                return m.group(1)
    for dist in sorted(root.glob("sglang-*.dist-info")):
        return dist.name[len("sglang-") : -len(".dist-info")]
    git_dir = root if (root / ".git").exists() else root.parent
    if (git_dir / ".git").exists():
        try:
            out = subprocess.run(
                ["git", "-C", str(git_dir), "describe", "--tags", "--always"],
                capture_output=True, text=True, timeout=10, check=True,
            ).stdout.strip()
            return out.lstrip("v") or "unknown"
        except (OSError, subprocess.SubprocessError):
            pass
    return "unknown"


def _text_or_empty(path: Path) -> str:
    try:
        return read_tree_text(path)
    except input_files.Refused:  # no regular file, or too large: no version from it
        return ""


def from_wheel(version: str) -> SglangTree:
    """Download (once) the SGLang wheel of `version` with pip and unpack only the kernel sources
    (and the .py files of sglang/srt/)."""
    if not _VERSION_RE.fullmatch(version):  # fullmatch: `$` alone would let a trailing newline through
        raise AstraError(f"--sglang {version!r} is not a version number (example: --sglang 0.5.23)")
    target = paths.sub("sglang") / version
    marker = target / ".complete"
    if not marker.exists():
        _download_and_unpack(version, target)
    return SglangTree(root=target, version=version, origin="wheel")


_SRT_FAILED: dict[str, AstraError] = {}  # tree root -> why its runtime could not be fetched (asked once per process)


def ensure_srt(tree: SglangTree) -> Path | None:
    """`tree.srt_dir`, unpacking the runtime's .py files from the wheel again for a wheel tree that
    was unpacked without them. A checkout or installed package has it or not: None when not.
    A download that failed is not tried again in this process (a machine with no network: the survey
    asks once per kernel, and pip's retries cost seconds each time)."""
    if tree.srt_dir is not None or tree.origin != "wheel":
        return tree.srt_dir
    key = str(tree.root)
    if key in _SRT_FAILED:
        raise _SRT_FAILED[key]
    try:
        return _fetch_srt(tree)
    except AstraError as err:
        _SRT_FAILED[key] = err
        raise


def _fetch_srt(tree: SglangTree) -> Path | None:
    with tempfile.TemporaryDirectory(prefix="astra-wheel-") as tmp:
        wheel = _pip_download(tree.version, Path(tmp))
        if tree.srt_dir is not None:  # another process finished meanwhile
            return tree.srt_dir
        staging = Path(tempfile.mkdtemp(prefix=".srt-", dir=tree.root))
        try:
            with zipfile.ZipFile(wheel) as zf:
                for member in _srt_members(zf):
                    zf.extract(member, staging)
            final = tree.root / "sglang" / "srt"
            if final.exists():  # a partial unpack (no marker): replace it
                shutil.rmtree(final)
            (staging / "sglang" / "srt").mkdir(parents=True, exist_ok=True)
            (staging / "sglang" / "srt").rename(final)
            (tree.root / _SRT_MARKER).write_text(wheel.name + "\n")
        finally:
            shutil.rmtree(staging, ignore_errors=True)
    return tree.srt_dir


def _srt_members(zf: zipfile.ZipFile) -> list[str]:
    return [m for m in zf.namelist() if m.startswith(_SRT_PREFIX) and m.endswith(".py")]


def _download_and_unpack(version: str, target: Path) -> None:
    with tempfile.TemporaryDirectory(prefix="astra-wheel-") as tmp:
        wheel = _pip_download(version, Path(tmp))
        staging = Path(tempfile.mkdtemp(prefix=f".{version}-", dir=target.parent))
        try:
            with zipfile.ZipFile(wheel) as zf:
                members = [m for m in zf.namelist() if m.startswith(_WHEEL_PREFIXES)
                           or (m.startswith("sglang-") and m.endswith(".dist-info/METADATA"))]
                if not any(m.startswith(_WHEEL_PREFIXES) for m in members):
                    raise SglangNotFound(
                        f"SGLang {version} ships no JIT kernel sources (sglang/kernels/jit or "
                        "sglang/jit_kernel); JIT kernels exist from 0.5.10 on"
                    )
                for member in members + _srt_members(zf):
                    zf.extract(member, staging)
                (staging / "sglang").mkdir(exist_ok=True)
                (staging / "sglang" / "__init__.py").touch()
            (staging / ".wheel").write_text(wheel.name + "\n")
            (staging / _SRT_MARKER).write_text(wheel.name + "\n")
            (staging / ".complete").write_text(version + "\n")
            if target.exists():
                shutil.rmtree(target)
            staging.rename(target)
        except BaseException:
            shutil.rmtree(staging, ignore_errors=True)
            raise


def _pip_download(version: str, dest: Path) -> Path:
    cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:",
           "--disable-pip-version-check", "-q", "-d", str(dest), f"sglang=={version}"]
    attempts = [cmd]
    # Newer SGLang wheels are built per CPython version; the sources we need are the same in all of them.
    for py in ("3.12", "3.11", "3.10"):
        attempts.append(cmd[:6] + ["--python-version", py, "--platform", "manylinux_2_34_x86_64",
                                   "--platform", "manylinux_2_28_x86_64", "--platform", "any"] + cmd[6:])
    errors = ""
    for attempt in attempts:
        proc = subprocess.run(attempt, capture_output=True, text=True)
        wheels = sorted(dest.glob("sglang-*.whl"))
        if proc.returncode == 0 and wheels:
            return wheels[0]
        errors = proc.stderr
    if "No matching distribution" in errors or "Could not find a version" in errors:
        raise SglangNotFound(
            f"SGLang {version} is not in the package index (pip found no wheel); "
            "check the version, e.g. `pip index versions sglang`"
        )
    last = errors.strip().splitlines()[-1] if errors.strip() else "no output"
    raise SglangNotFound(f"could not download SGLang {version} with pip: {last}")
