"""The seccomp-bpf filters of a worker that loads candidate code, built with `pyseccomp` (ctypes over
libseccomp.so.2, the API of libseccomp's own Python bindings; pinned in pyproject).

Default ALLOW with an explicit deny list: a worker runs torch, the CUDA driver and Python, whose system
calls are many and change between versions, while what a candidate must never do is a short list.
Every rule answers EPERM (clone3 answers ENOSYS, so glibc falls back to clone, which the filter can
inspect), so a candidate sees an ordinary failure and the worker goes on to report it. Both filters are
installed with TSYNC: every thread of the process gets them, also the ones torch and CUDA started.

Stage 1 (`deny_escapes`), before the candidate module is loaded:
    execve, execveat                     no program runs (Landlock grants no EXECUTE either)
    fork, vfork, clone w/o CLONE_THREAD  no new process; threads are still allowed
    clone3                               ENOSYS (its flags sit in memory, where a filter cannot look)
    socket, socketpair other than AF_UNIX   no network (Landlock ABI >= 4 also refuses TCP)
    memfd_create, memfd_secret           no anonymous file to write a library into and map
    ptrace, process_vm_readv/writev, process_madvise, pidfd_open, pidfd_getfd, pidfd_send_signal, kcmp
    kill, tgkill, rt_sigqueueinfo, rt_tgsigqueueinfo to another process (the worker's own pid only), tkill
    mount, umount2, pivot_root, chroot, the new mount API, setns, unshare
    kexec_load, kexec_file_load, init_module, finit_module, delete_module, bpf, perf_event_open
    personality, open_by_handle_at, name_to_handle_at (a path-free open that would skip Landlock)
    io_uring_setup/enter/register (its operations never pass through seccomp)
    userfaultfd, keyctl, add_key, request_key, iopl, ioperm, reboot, swapon, swapoff, acct, syslog,
    settimeofday, clock_settime, clock_adjtime, adjtimex, sethostname, setdomainname, quotactl, quotactl_fd
  Calls of another architecture (int 0x80 into the i386 table, x32 numbers) get EPERM too (BADARCH).

Stage 2 (`deny_new_code`), once the candidate module is loaded: mmap, mprotect and pkey_mprotect with
PROT_EXEC, and shmat with SHM_EXEC, fail, so no further library can be mapped from inside a call and
no page of data becomes code. `STAGE_TWO` switches it off should a CUDA version need executable
mappings after the module is loaded (the driver and torch map theirs during the warm-up).
"""

from __future__ import annotations

import errno
import mmap
import socket

STAGE_TWO = True  # False: the candidate may still map executable pages after loading (see the docstring)

CLONE_THREAD = 0x00010000
SHM_EXEC = 0o100000
ALWAYS_DENIED = (
    "execve", "execveat", "fork", "vfork", "memfd_create", "memfd_secret",
    "ptrace", "process_vm_readv", "process_vm_writev", "process_madvise", "pidfd_open", "pidfd_getfd",
    "pidfd_send_signal", "kcmp", "tkill",
    "mount", "umount2", "pivot_root", "chroot", "move_mount", "open_tree", "fsopen", "fsconfig", "fsmount",
    "fspick", "mount_setattr", "setns", "unshare",
    "kexec_load", "kexec_file_load", "init_module", "finit_module", "delete_module", "bpf", "perf_event_open",
    "personality", "open_by_handle_at", "name_to_handle_at", "io_uring_setup", "io_uring_enter",
    "io_uring_register", "userfaultfd", "keyctl", "add_key", "request_key", "iopl", "ioperm", "reboot",
    "swapon", "swapoff", "acct", "syslog", "settimeofday", "clock_settime", "clock_adjtime", "adjtimex",
    "sethostname", "setdomainname", "quotactl", "quotactl_fd",
)
OTHER_PROCESS = ("kill", "tgkill", "rt_sigqueueinfo", "rt_tgsigqueueinfo")  # first argument: the target pid


class SeccompUnavailable(RuntimeError):
    """pyseccomp or libseccomp.so.2 is missing, or the kernel refused the filter."""


def _library():
    try:
        import pyseccomp
    except (ImportError, RuntimeError, OSError) as error:  # RuntimeError: "Unable to find libseccomp"
        raise SeccompUnavailable(f"pyseccomp/libseccomp not usable: {error}") from None
    return pyseccomp


def available() -> str | None:
    """None when seccomp filters can be built here, else why not. Importing pyseccomp looks libseccomp up
    with `ldconfig -p` (a subprocess), so call this before anything that forbids programs."""
    try:
        _library().SyscallFilter(_library().ALLOW)
    except SeccompUnavailable as error:
        return str(error)
    except OSError as error:
        return f"libseccomp refused to build a filter: {error}"
    return None


def _new_filter(lib):
    flt = lib.SyscallFilter(lib.ALLOW)
    flt.set_attr(lib.Attr.CTL_TSYNC, 1)  # every thread, not only the caller
    flt.set_attr(lib.Attr.ACT_BADARCH, lib.ERRNO(errno.EPERM))
    return flt


def _add(lib, flt, action: int, name: str, *args, skipped: list[str]) -> None:
    """One rule; a call this libseccomp does not know (older than the kernel) is listed in `skipped`."""
    if lib.resolve_syscall(lib.Arch.NATIVE, name) < 0:
        skipped.append(name)
        return
    flt.add_rule(action, name, *args)


def _load(flt, stage: str) -> None:
    try:
        flt.load()
    except OSError as error:
        raise SeccompUnavailable(f"the kernel refused the {stage} seccomp filter: {error}") from None


def deny_escapes(own_pid: int) -> list[str]:
    """Install stage 1 (see the module docstring); returns the names this libseccomp does not know."""
    lib = _library()
    flt, skipped = _new_filter(lib), []
    deny = lib.ERRNO(errno.EPERM)
    for name in ALWAYS_DENIED:
        _add(lib, flt, deny, name, skipped=skipped)
    _add(lib, flt, lib.ERRNO(errno.ENOSYS), "clone3", skipped=skipped)
    _add(lib, flt, deny, "clone", lib.Arg(0, lib.MASKED_EQ, CLONE_THREAD, 0), skipped=skipped)
    for name in ("socket", "socketpair"):
        _add(lib, flt, deny, name, lib.Arg(0, lib.NE, socket.AF_UNIX), skipped=skipped)
    for name in OTHER_PROCESS:
        _add(lib, flt, deny, name, lib.Arg(0, lib.NE, own_pid), skipped=skipped)
    _load(flt, "stage 1")
    return skipped


def deny_new_code() -> list[str]:
    """Install stage 2: no new executable mapping (see the module docstring); returns unknown names."""
    lib = _library()
    flt, skipped = _new_filter(lib), []
    deny = lib.ERRNO(errno.EPERM)
    for name in ("mmap", "mprotect", "pkey_mprotect"):
        _add(lib, flt, deny, name, lib.Arg(2, lib.MASKED_EQ, mmap.PROT_EXEC, mmap.PROT_EXEC), skipped=skipped)
    _add(lib, flt, deny, "shmat", lib.Arg(2, lib.MASKED_EQ, SHM_EXEC, SHM_EXEC), skipped=skipped)
    _load(flt, "stage 2")
    return skipped
