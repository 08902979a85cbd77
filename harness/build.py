"""Building a kernel module exactly as SGLang's `load_jit` does, plus a content-hashed cache.

A build is a generated wrapper (`cuda.cu` and/or `main.cpp`: the tvm-ffi includes, an `#include` of each
kernel file, one `TVM_FFI_DLL_EXPORT_TYPED_FUNC` per wrapper inside `namespace sglang`), compiled with
SGLang's flags plus `-Xptxas=-v` (resource report only; the SASS is unchanged) and linked into a `.so`.

A candidate kernel is built with `overrides`: its text replaces one file of the tree. The replaced file
lives in a mirror of its root (`<cache>/overlays/<hash>/root<i>/`, every other file a symlink to the
original), so quoted includes in both directions resolve as they would in a patched tree.

Every failure (compile error, missing nvcc, timeout, unwritable cache) is a `BuildResult` with ok=False.
Imports only the standard library and, lazily, tvm_ffi and torch: this runs on a bare GPU box.
"""

from __future__ import annotations

import fcntl
import hashlib
import importlib.metadata
import json
import os
import re
import shutil
import signal
import subprocess
import threading
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from functools import lru_cache
from pathlib import Path

from harness.ptxas import KernelResources, find_demangler, parse_ptxas

KEY_VERSION = "astra-harness-build-1"
NVCC_MISSING = "nvcc not found: set CUDA_HOME or install the CUDA toolkit"
FFI_INCLUDES = (
    "tvm/ffi/container/tensor.h",
    "tvm/ffi/dtype.h",
    "tvm/ffi/error.h",
    "tvm/ffi/extra/c_env_api.h",
    "tvm/ffi/function.h",
)
SOURCE_SUFFIXES = frozenset({".cuh", ".h", ".cu", ".hpp", ".cpp", ".cc", ".cxx", ".hh", ".inl", ".inc"})
_NAME_RE = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.-]*$")
_ARCH_RE = re.compile(r"^(\d+)(\d)([a-z]?)$")


@dataclass
class BuildRequest:
    """One module to build. Relative `cuda_files`/`cpp_files` resolve against `source_root` (csrc)."""

    name: str
    source_root: str
    include_dirs: list[str]
    cuda_files: list[str]
    cpp_files: list[str] = field(default_factory=list)
    cuda_wrappers: list[tuple[str, str]] = field(default_factory=list)
    cpp_wrappers: list[tuple[str, str]] = field(default_factory=list)
    extra_cuda_cflags: list[str] = field(default_factory=list)
    extra_cflags: list[str] = field(default_factory=list)
    extra_ldflags: list[str] = field(default_factory=list)
    header_only: bool = True
    arch: str = "90a"
    overrides: dict[str, str] = field(default_factory=dict)


@dataclass
class BuildResult:
    """What a build produced; `error` is a trimmed excerpt for a reader, `log` the full output."""

    ok: bool
    so_path: str | None
    cache_hit: bool
    seconds: float
    command: list[str]
    log: str
    error: str | None
    resources: list[KernelResources]
    key: str


class BuildFailure(Exception):
    """A reason a build cannot even start; `build` turns it into an ok=False result."""


@dataclass
class _Plan:
    """A request resolved into files to write and commands to run (cwd = the build directory)."""

    units: list[tuple[str, bool, str | None]]  # (filename, is_cuda, generated text or None)
    commands: list[list[str]]  # compiles, then the link
    so_name: str
    overlay: Path | None
    targets: dict[int, dict[str, str]]  # root index -> {relative path: replacement text}
    roots: list[str]  # original [source_root, *include_dirs]
    tree_digest: str


# ---------------------------------------------------------------- toolchain


def cuda_home() -> str | None:
    """CUDA_HOME or CUDA_PATH, else /usr/local/cuda if present, else the parent of nvcc on PATH."""
    configured = os.environ.get("CUDA_HOME") or os.environ.get("CUDA_PATH")
    if configured:
        return configured
    if os.path.isdir("/usr/local/cuda"):
        return "/usr/local/cuda"
    nvcc = shutil.which("nvcc")
    return os.path.dirname(os.path.dirname(nvcc)) if nvcc else None


def nvcc_path() -> str:
    """The nvcc a build runs, or BuildFailure with a message saying how to fix it."""
    home = cuda_home()
    candidate = os.path.join(home, "bin", "nvcc") if home else None
    if candidate and os.path.isfile(candidate) and os.access(candidate, os.X_OK):
        return candidate
    raise BuildFailure(f"{NVCC_MISSING} (looked for {candidate or 'nvcc on PATH'})")


def host_compiler() -> str:
    """$CXX or c++, resolved on PATH."""
    found = shutil.which(os.environ.get("CXX", "c++"))
    if not found:
        raise BuildFailure("host C++ compiler not found: install g++ or set CXX")
    return found


@lru_cache(maxsize=None)
def _tool_version_cached(path: str, mtime_ns: int) -> str:
    done = subprocess.run([path, "--version"], capture_output=True, text=True, timeout=60, check=False)
    return done.stdout + done.stderr


def tool_version(path: str) -> str:
    """`<tool> --version` output, memoised per binary and modification time."""
    return _tool_version_cached(path, os.stat(path).st_mtime_ns)


@lru_cache(maxsize=1)
def tvm_ffi_paths() -> tuple[tuple[str, ...], str, str]:
    """(include dirs, library dir, library name) of the installed tvm-ffi."""
    try:
        from tvm_ffi import libinfo
        lib = Path(libinfo.find_libtvm_ffi())
        includes = tuple(dict.fromkeys([libinfo.find_include_path(), libinfo.find_dlpack_include_path()]))
    except (ImportError, RuntimeError) as error:
        raise BuildFailure(f"apache-tvm-ffi not usable: {error}") from error
    return includes, str(lib.parent), lib.stem.removeprefix("lib")


def tvm_ffi_version() -> str:
    """The installed apache-tvm-ffi version (part of every cache key)."""
    try:
        return importlib.metadata.version("apache-tvm-ffi")
    except importlib.metadata.PackageNotFoundError:
        return "unknown"


def arch_for_capability(major: int, minor: int, nvcc_version: tuple[int, int] = (13, 0)) -> str:
    """SGLang's target for a device: "a" for 9.x and 10.x+, "f" for 12.0 with nvcc >= 12.9, else plain."""
    if major == 12 and minor == 0 and nvcc_version >= (12, 9):
        return "120f"
    return f"{major}{minor}" + ("a" if major >= 9 else "")


def arch_flags(arch: str) -> list[str]:
    """`-gencode=...` and `-DSGL_CUDA_ARCH=...` for an arch like "90a", "100a", "120f", "89"."""
    match = _ARCH_RE.match(arch)
    if not match:
        raise BuildFailure(f"bad arch {arch!r}: expected e.g. '90a', '100a', '120f', '89'")
    value = int(match.group(1)) * 100 + int(match.group(2)) * 10
    return [f"-gencode=arch=compute_{arch},code=sm_{arch}", f"-DSGL_CUDA_ARCH={value}"]


# ---------------------------------------------------------------- sources, overlay and key


def wrapper_source(files: list[str], wrappers: list[tuple[str, str]]) -> str:
    """The translation unit SGLang generates: tvm-ffi includes, the kernel files, the exports."""
    lines = [f"#include <{header}>" for header in FFI_INCLUDES]
    lines += [f'#include "{path}"' for path in files]
    lines.append("namespace sglang {")
    lines += [f"TVM_FFI_DLL_EXPORT_TYPED_FUNC({export}, ({entry}));" for export, entry in wrappers]
    lines.append("}  // namespace sglang")
    return "\n".join(lines) + "\n"


_DIGESTS: dict[tuple[str, int, int], str] = {}
_DIGESTS_LOCK = threading.Lock()


def file_digest(path: str) -> str:
    """sha256 of a file's bytes, memoised by (path, mtime, size); "missing" if it does not exist."""
    try:
        stat = os.stat(path)
    except FileNotFoundError:
        return "missing"
    memo_key = (path, stat.st_mtime_ns, stat.st_size)
    with _DIGESTS_LOCK:
        if memo_key in _DIGESTS:
            return _DIGESTS[memo_key]
    digest = hashlib.sha256(Path(path).read_bytes()).hexdigest()
    with _DIGESTS_LOCK:
        _DIGESTS[memo_key] = digest
    return digest


def tree_digest(roots: list[str]) -> str:
    """One hash over every C/C++/CUDA source under each root (path relative to its root + content)."""
    hasher = hashlib.sha256()
    for index, root in enumerate(roots):
        for dirpath, dirnames, filenames in os.walk(root):
            dirnames.sort()
            for filename in sorted(filenames):
                if Path(filename).suffix in SOURCE_SUFFIXES:
                    path = os.path.join(dirpath, filename)
                    hasher.update(f"{index}:{os.path.relpath(path, root)}:{file_digest(path)}\n".encode())
    return hasher.hexdigest()


def _override_targets(req: BuildRequest) -> dict[int, dict[str, str]]:
    """Group overrides by the root they replace a file in (0 = source_root, i = include_dirs[i-1])."""
    roots = [os.path.abspath(root) for root in [req.source_root, *req.include_dirs]]
    targets: dict[int, dict[str, str]] = {}
    for path, text in sorted(req.overrides.items()):
        index, rel = 0, path
        if os.path.isabs(path):
            owners = [i for i, root in enumerate(roots) if os.path.abspath(path).startswith(root + os.sep)]
            if not owners:
                raise BuildFailure(f"override {path} is outside source_root and include_dirs")
            index, rel = owners[0], os.path.relpath(os.path.abspath(path), roots[owners[0]])
        elif ".." in Path(path).parts:
            raise BuildFailure(f"override path {path!r} must not contain '..'")
        else:
            index = next((i for i, root in enumerate(roots) if os.path.isfile(os.path.join(root, path))), 0)
        targets.setdefault(index, {})[rel] = text
    return targets


def _mirror(root: Path, dest: Path, replacements: dict[str, str]) -> None:
    """Recreate `root` under `dest` as real directories of symlinked files, then write replacements."""
    for dirpath, _, filenames in os.walk(root):
        target_dir = dest / os.path.relpath(dirpath, root)
        target_dir.mkdir(parents=True, exist_ok=True)
        for filename in filenames:
            os.symlink(os.path.join(dirpath, filename), target_dir / filename)
    for rel, text in replacements.items():
        path = dest / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        if path.is_symlink():
            path.unlink()
        path.write_text(text)


def materialise_overlay(plan: _Plan) -> None:
    """Create the plan's overlay directory once (staged, then renamed into place)."""
    if plan.overlay is None or (plan.overlay / ".done").exists():
        return
    staging = plan.overlay.parent / f".staging-{uuid.uuid4().hex}"
    try:
        for index, replacements in plan.targets.items():
            _mirror(Path(plan.roots[index]).resolve(), staging / f"root{index}", replacements)
        (staging / ".done").touch()
        try:
            os.rename(staging, plan.overlay)
        except OSError:
            if not (plan.overlay / ".done").exists():
                raise  # not a lost race with another builder: a real error
    finally:
        shutil.rmtree(staging, ignore_errors=True)


def plan_build(req: BuildRequest, cache_dir: Path) -> _Plan:
    """Resolve sources (through an overlay when there are overrides) and write out every command."""
    roots = [req.source_root, *req.include_dirs]
    digest = tree_digest(roots)
    targets = _override_targets(req)
    overlay = None
    if targets:
        seed = json.dumps([digest, [os.path.abspath(r) for r in roots], sorted(req.overrides.items())])
        overlay = cache_dir.resolve() / "overlays" / hashlib.sha256(seed.encode()).hexdigest()[:16]
    effective = [str(overlay / f"root{i}") if i in targets else os.path.abspath(r) for i, r in enumerate(roots)]

    def resolve(path: str) -> str:
        return path if os.path.isabs(path) else os.path.join(effective[0], path)

    cuda, cpp = [resolve(p) for p in req.cuda_files], [resolve(p) for p in req.cpp_files]
    units: list[tuple[str, bool, str | None]] = []
    if req.header_only:
        if cpp or req.cpp_wrappers:
            units.append(("main.cpp", False, wrapper_source(cpp, req.cpp_wrappers)))
        if cuda or req.cuda_wrappers:
            units.append(("cuda.cu", True, wrapper_source(cuda, req.cuda_wrappers)))
    else:
        units = [(path, path.endswith(".cu"), None) for path in cpp + cuda]
    if not units:
        raise BuildFailure("nothing to build: no cuda_files, cpp_files or wrappers")
    commands = _commands(req, units, effective[1:])
    return _Plan(units, commands, f"{req.name}.so", overlay, targets, roots, digest)


def _commands(req: BuildRequest, units: list[tuple[str, bool, str | None]], includes: list[str]) -> list[list[str]]:
    """Compile commands (one per unit, with a depfile) and the link, in SGLang's flag order."""
    ffi_includes, lib_dir, lib_name = tvm_ffi_paths()
    include_flags = [f"-I{path}" for path in [*ffi_includes, *includes]]
    cxx = host_compiler()
    with_device = any(is_cuda for _, is_cuda, _ in units)
    nvcc = nvcc_path() if with_device else None
    commands, objects = [], []
    for index, (filename, is_cuda, _) in enumerate(units):
        obj = f"{Path(filename).stem}_{index}.o"
        objects.append(obj)
        if is_cuda:
            ptxas_v = [] if "-Xptxas=-v" in req.extra_cuda_cflags else ["-Xptxas=-v"]
            flags = ["-Xcompiler", "-fPIC", *arch_flags(req.arch), "-std=c++20", "-O3",
                     "--expt-relaxed-constexpr", *req.extra_cuda_cflags, *ptxas_v]
            commands.append([nvcc, "-MD", "-MF", f"{obj}.d", *flags, *include_flags, "-c", filename, "-o", obj])
        else:
            flags = ["-fPIC", "-std=c++20", "-O3", *req.extra_cflags]
            commands.append([cxx, "-MD", "-MF", f"{obj}.d", *flags, *include_flags, "-c", filename, "-o", obj])
    link = [cxx, *objects, "-shared", f"-L{lib_dir}", f"-l{lib_name}"]
    if with_device:
        link += [f"-L{cuda_home()}/lib64", "-lcudart"]
    commands.append([*link, *req.extra_ldflags, "-o", f"{req.name}.so"])
    return commands


def build_key(req: BuildRequest, plan: _Plan) -> str:
    """sha256 over everything that can change the output: texts, sources, flags, tool versions."""
    tools = sorted({command[0] for command in plan.commands})
    originals = [p if os.path.isabs(p) else os.path.join(req.source_root, p) for p in req.cuda_files + req.cpp_files]
    payload = {
        "version": KEY_VERSION,
        "name": req.name,
        "units": plan.units,
        "commands": plan.commands,
        "tree": plan.tree_digest,
        "sources": {path: file_digest(path) for path in originals},
        "overrides": sorted(req.overrides.items()),
        "tools": {tool: tool_version(tool) for tool in tools},
        "arch": req.arch,
        "tvm_ffi": tvm_ffi_version(),
    }
    return hashlib.sha256(json.dumps(payload, sort_keys=True).encode()).hexdigest()
