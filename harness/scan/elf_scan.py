"""The shared-object backstop of harness.scan: a candidate .so must import nothing dangerous that the
original's .so (built the same way) does not, and must not grow its load-time initialisers (.init_array)."""

from __future__ import annotations

import re
import shutil
import subprocess

# --------------------------------------------------------------------------------------------------------------
# Shared-object backstop.
# --------------------------------------------------------------------------------------------------------------

_DANGEROUS_IMPORTS = re.compile(
    r"^(dlopen|dlmopen|dlsym|dlvsym|dl_iterate_phdr|system|popen|fork|vfork|_Fork|clone3?|exec[lv]p?e?|fexecve|"
    r"posix_spawnp?|fopen|fopen64|freopen|freopen64|fdopen|open|open64|__open_2|__open64_2|openat|openat64|"
    r"__openat_2|__openat64_2|creat|creat64|unlink|unlinkat|rename|mkdir|socket|socketpair|connect|bind|sendto|"
    r"recvfrom|getenv|secure_getenv|setenv|putenv|environ|__environ|syscall|ptrace|_?Py\w+|"
    r"(cuModuleLoad|cuLibraryLoad|cudaLibraryLoad|cuLink|nvrtc|nvJitLink)\w*)$")


def elf_tools_available() -> bool:
    """Whether `scan_shared_object` can look at a .so (binutils' nm or readelf on PATH)."""
    return bool(shutil.which("nm") or shutil.which("readelf"))


def _run(command: list[str]) -> str | None:
    try:
        done = subprocess.run(command, capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return done.stdout if done.returncode == 0 else None


def undefined_symbols(so_path: str) -> set[str] | None:
    """The undefined dynamic symbols of a shared object (version suffixes dropped), or None without tools."""
    if shutil.which("nm"):
        out = _run(["nm", "-D", "--undefined-only", so_path])
        if out is not None:
            return {line.split()[-1].split("@")[0] for line in out.splitlines() if line.split()}
    if shutil.which("readelf"):
        out = _run(["readelf", "--dyn-syms", "-W", so_path])
        if out is not None:
            names = set()
            for line in out.splitlines():
                parts = line.split()
                if len(parts) >= 8 and parts[6] == "UND" and parts[7]:
                    names.add(parts[7].split("@")[0])
            return names
    return None


def init_sizes(so_path: str) -> dict[str, int] | None:
    """Sizes in bytes of the load-time code sections (.init_array, .preinit_array, .ctors), or None."""
    sections = (".init_array", ".preinit_array", ".ctors")
    if shutil.which("readelf"):
        out = _run(["readelf", "-S", "-W", so_path])
        if out is not None:
            sizes = dict.fromkeys(sections, 0)
            for line in out.splitlines():
                parts = line.replace("[ ", "[").split()
                for k, part in enumerate(parts):
                    if part in sections and len(parts) > k + 4:
                        sizes[part] = int(parts[k + 4], 16)
            return sizes
    if shutil.which("objdump"):
        out = _run(["objdump", "-h", so_path])
        if out is not None:
            sizes = dict.fromkeys(sections, 0)
            for line in out.splitlines():
                parts = line.split()
                if len(parts) >= 3 and parts[1] in sections:
                    sizes[parts[1]] = int(parts[2], 16)
            return sizes
    return None


def scan_shared_object(orig_so: str, cand_so: str) -> str | None:
    """None if the candidate module imports nothing dangerous that the original does not and has no more
    load-time constructors; else a one-line reason. None too when no ELF tool exists (see elf_tools_available)."""
    orig, cand = undefined_symbols(orig_so), undefined_symbols(cand_so)
    if orig is not None and cand is not None:
        new = sorted(name for name in cand - orig if _DANGEROUS_IMPORTS.match(name))
        if new:
            return f"the candidate module newly imports {', '.join(new)}, which a kernel file must not use"
    orig_init, cand_init = init_sizes(orig_so), init_sizes(cand_so)
    if orig_init is not None and cand_init is not None:
        for section, size in cand_init.items():
            if size > orig_init.get(section, 0):
                return (f"the candidate module's {section} grew from {orig_init.get(section, 0)} to {size} bytes "
                        "(a new static constructor)")
    return None
