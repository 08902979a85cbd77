"""Where the compilers and tvm-ffi are, their versions, and SGLang's target-architecture rules.

Resolution follows SGLang 0.5.23's loader: CUDA_HOME or CUDA_PATH, else /usr/local/cuda, else the parent
of nvcc on PATH (on machines where /usr/local/bin/nvcc is a shim the toolkit directory is what links).
"""

from __future__ import annotations

import importlib
import importlib.metadata
import importlib.util
import os
import re
import shutil
import subprocess
import sys
from functools import lru_cache
from pathlib import Path

NVCC_MISSING = "nvcc not found: set CUDA_HOME or install the CUDA toolkit"
_ARCH_RE = re.compile(r"^(\d+)(\d)([a-z]?)$")


class BuildFailure(Exception):
    """A reason a build cannot even start; `build` turns it into an ok=False result."""


def cuda_home() -> str | None:
    """CUDA_HOME or CUDA_PATH, else /usr/local/cuda if present, else the parent of nvcc on PATH."""
    configured = os.environ.get("CUDA_HOME") or os.environ.get("CUDA_PATH")
    if configured:
        return configured
    if os.path.isdir("/usr/local/cuda"):
        return "/usr/local/cuda"
    nvcc = shutil.which("nvcc")
    return os.path.dirname(os.path.dirname(nvcc)) if nvcc else None


def cuda_tool(name: str) -> str | None:
    """A CUDA toolkit program (compute-sanitizer, ncu, ...) on PATH, else in cuda_home()/bin, else None."""
    found = shutil.which(name)
    if found:
        return found
    home = cuda_home()
    candidate = os.path.join(home, "bin", name) if home else None
    return candidate if candidate and os.access(candidate, os.X_OK) else None


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


def _libinfo():
    """tvm_ffi.libinfo, loaded from its file when tvm_ffi is not imported yet.

    Importing the tvm_ffi package imports torch first (about 2 s); locating headers and the library
    needs neither, and a cache hit should not pay for it.
    """
    if "tvm_ffi" in sys.modules:
        return importlib.import_module("tvm_ffi.libinfo")
    spec = importlib.util.find_spec("tvm_ffi")
    if spec is None or not spec.submodule_search_locations:
        raise BuildFailure("apache-tvm-ffi is not installed: pip install apache-tvm-ffi")
    path = Path(list(spec.submodule_search_locations)[0]) / "libinfo.py"
    file_spec = importlib.util.spec_from_file_location("_harness_tvm_ffi_libinfo", path)
    module = importlib.util.module_from_spec(file_spec)
    file_spec.loader.exec_module(module)
    return module


@lru_cache(maxsize=1)
def tvm_ffi_paths() -> tuple[tuple[str, ...], str, str]:
    """(include dirs, library dir, library name) of the installed tvm-ffi."""
    try:
        libinfo = _libinfo()
        lib = Path(libinfo.find_libtvm_ffi())
        includes = tuple(dict.fromkeys([libinfo.find_include_path(), libinfo.find_dlpack_include_path()]))
    except (ImportError, OSError, RuntimeError) as error:
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


def nvcc_release() -> tuple[int, int]:
    """(major, minor) of the nvcc builds run; BuildFailure without nvcc."""
    match = re.search(r"release (\d+)\.(\d+)", tool_version(nvcc_path()))
    if not match:
        raise BuildFailure(f"cannot read the release from `{nvcc_path()} --version`")
    return int(match.group(1)), int(match.group(2))


def default_arch() -> str:
    """The target of the first GPU this process sees, or "90a" (Hopper) where none is visible. Asked of the CUDA
    driver (harness.environment.cuda_devices), as torch asks it, without importing torch or making a context:
    the judge's builds start before torch loads (harness.judge.early_build)."""
    from harness.environment.cuda_devices import device_capability

    capability = device_capability()
    return arch_for_capability(*capability, nvcc_release()) if capability is not None else "90a"
