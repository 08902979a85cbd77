"""What a worker that loads candidate code may touch on the filesystem: two Landlock allow-lists.

`floor(...)`: applied while the worker is still single-threaded, before its trusted warm-up (torch,
CUDA, tvm_ffi), so every thread torch and the driver start is bound by it. It must let the warm-up
run, so it is drawn from where things are installed rather than from what was loaded:
    read-only   the Python standard library, every directory on sys.path except the working directory
                and the checkout holding `harness` (only its harness/ package), CUDA_HOME, the
                directories of the shared libraries mapped now, the system library directories,
                LD_LIBRARY_PATH, /etc/ld.so.cache, /sys, /proc/self (and writing to its task/ files, which
                the CUDA driver does) and a few global /proc files
    devices     /dev/null, /dev/zero, /dev/urandom, /dev/random, /dev/nvidia* (read, write, ioctl)
    read files  the candidate module's own file(s) and the worker's read-only inputs, nothing beside them
    execute     the programs the warm-up may run to describe the machine (nvcc, nvidia-smi) and the ELF
                interpreter they need; nothing runs once the worker is sealed (seccomp refuses execve)
    write       the worker's own temporary directories: create, write, rename, delete, list, but NEVER
                open a file there for reading or execution, so a library written there cannot be mapped

`tight(...)`: applied after the warm-up on the thread that loads and calls the candidate (a nested
Landlock domain: it can only narrow the floor). Read-only becomes the directories of every shared
library mapped in /proc/self/maps after the warm-up and the top-level directory of every imported
Python package, plus the standard library, harness/, CUDA_HOME, /etc/ld.so.cache, /sys, /proc/self.

Nothing else is reachable: not the user's home, the judge's files, the build cache beyond the one
module file, the SGLang tree, other processes' /proc entries, /tmp, /dev/shm.
"""

from __future__ import annotations

import glob
import importlib.util
import os
import shutil
import sys
import sysconfig
from pathlib import Path

from harness.sandbox.landlock import DEVICE, EXECUTE, READ, READ_FILE, TRUNCATE, WRITE_FILE, WRITE_TREE

HARNESS_DIR = Path(__file__).resolve().parent.parent
SYSTEM_LIBS = ("/lib", "/lib64", "/usr/lib", "/usr/lib64", "/usr/local/lib", "/lib/x86_64-linux-gnu",
               "/usr/lib/x86_64-linux-gnu", "/usr/local/nvidia", "/usr/share/nvidia", "/etc/nvidia")
PLAIN_DEVICES = ("/dev/null", "/dev/zero", "/dev/full", "/dev/urandom", "/dev/random")
PROC_FILES = ("/proc/cpuinfo", "/proc/meminfo", "/proc/stat", "/proc/devices", "/proc/filesystems",
              "/proc/driver/nvidia", "/proc/sys/vm/overcommit_memory", "/proc/sys/kernel/osrelease")
LIBRARY_PACKAGES = ("torch", "tvm_ffi", "nvidia", "numpy", "triton")

Rules = list[tuple[str, int]]


def cuda_home() -> str | None:
    from harness.building.toolchain import cuda_home as configured

    return configured()


def warm_up_programs() -> list[str]:
    """nvcc and nvidia-smi (harness.environment.report runs both) and the ELF interpreter, where they exist."""
    from harness.building.toolchain import BuildFailure, nvcc_path

    programs = [shutil.which("nvidia-smi") or "", *glob.glob("/lib64/ld-linux*.so*"), *glob.glob("/lib/ld-linux*.so*")]
    try:
        programs.append(nvcc_path())
    except BuildFailure:
        pass  # no CUDA toolkit here: nothing to describe
    return [os.path.realpath(p) for p in programs if p and os.path.isfile(p)]


def _stdlib() -> list[str]:
    paths = sysconfig.get_paths()
    return [paths[key] for key in ("stdlib", "platstdlib") if key in paths]


def mapped_files() -> list[str]:
    """Every regular file mapped into this process now (shared libraries, the interpreter), from
    /proc/self/maps; not device files (the driver maps /dev/nvidia*: their directory is /dev) nor anything
    under /dev (shared memory), /proc or /sys."""
    found: list[str] = []
    for line in Path("/proc/self/maps").read_text().splitlines():
        parts = line.split(None, 5)
        path = parts[5] if len(parts) == 6 else ""
        if path.startswith("/") and not path.startswith(("/dev/", "/proc/", "/sys/")) and os.path.isfile(path):
            found.append(path)
    return list(dict.fromkeys(found))


def _package_dirs(names) -> list[str]:
    """The install directories of these top-level packages, found without importing them."""
    dirs: list[str] = []
    for name in names:
        try:
            spec = importlib.util.find_spec(name)
        except (ImportError, ValueError):
            continue
        if spec is None:
            continue
        dirs += list(spec.submodule_search_locations or [])
        if spec.origin and not spec.submodule_search_locations and os.path.isabs(spec.origin):
            dirs.append(spec.origin)
    return dirs


def _imported_packages() -> list[str]:
    """The top-level directory (or file) of every module imported now."""
    found: list[str] = []
    for name, module in list(sys.modules.items()):
        if "." in name or module is None:
            continue
        path = getattr(module, "__file__", None)
        if path:
            found.append(str(Path(path).parent) if Path(path).name.startswith("__init__.") else path)
        found += [str(p) for p in (getattr(module, "__path__", None) or []) if isinstance(p, str)]
    return found


def _devices() -> Rules:
    nvidia = sorted(glob.glob("/dev/nvidia*"))
    return [(path, DEVICE) for path in (*PLAIN_DEVICES, *nvidia)]


def _common(writable, readable) -> Rules:
    """What both lists hold: devices, /proc/self, /sys, the loader's cache, the inputs, the writable dirs."""
    rules: Rules = _devices()
    own = os.path.realpath("/proc/self")  # /proc/<pid>: another process's entries stay out of reach
    # the CUDA driver opens files of its threads (/proc/self/task/<tid>/...) for writing with O_TRUNC; without
    # that cuInit fails with error 304 (seen with driver 580 on an H100)
    rules += [(own, READ), (f"{own}/task", READ | WRITE_FILE | TRUNCATE)]
    rules += [("/sys", READ), ("/etc/ld.so.cache", READ_FILE),
              ("/etc/localtime", READ_FILE), (str(HARNESS_DIR), READ)]
    rules += [(str(path), READ_FILE) for path in readable]
    rules += [(str(path), WRITE_TREE) for path in writable]
    home = cuda_home()
    rules += [(home, READ)] if home else []
    rules += [(path, READ) for path in _stdlib()]
    return rules


def floor(writable, readable) -> Rules:
    """The allow-list applied before the warm-up (see the module docstring)."""
    checkout = str(HARNESS_DIR.parent)
    skip = {os.path.realpath(p) for p in (os.getcwd(), checkout, *map(str, writable))}
    rules = _common(writable, readable)
    rules += [(p, READ) for p in sys.path if p and os.path.isdir(p) and os.path.realpath(p) not in skip]
    rules += [(p, READ) for p in _package_dirs(LIBRARY_PACKAGES)]
    rules += [(p, READ) for p in SYSTEM_LIBS]
    rules += [(p, READ) for p in os.environ.get("LD_LIBRARY_PATH", "").split(os.pathsep) if p]
    rules += [(os.path.dirname(p), READ) for p in mapped_files()]
    rules += [(p, READ) for p in PROC_FILES]
    rules += [(p, READ_FILE | EXECUTE) for p in warm_up_programs()]
    return _unique(rules)


def tight(writable, readable) -> Rules:
    """The allow-list applied after the warm-up (see the module docstring)."""
    rules = _common(writable, readable)
    rules += [(os.path.dirname(p), READ) for p in mapped_files()]
    rules += [(p, READ) for p in _imported_packages() if not _inside(p, writable)]
    rules += [(p, READ) for p in PROC_FILES]
    return _unique(rules)


def _inside(path: str, dirs) -> bool:
    real = os.path.realpath(path)
    return any(real == os.path.realpath(d) or real.startswith(os.path.realpath(d) + os.sep) for d in dirs)


def _unique(rules: Rules) -> Rules:
    merged: dict[str, int] = {}
    for path, access in rules:
        merged[path] = merged.get(path, 0) | access
    return list(merged.items())
