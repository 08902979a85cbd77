"""Landlock, the Linux security module an unprivileged process uses to restrict itself (kernel 5.13+).

Called through its three system calls with ctypes (landlock_create_ruleset 444, landlock_add_rule 445,
landlock_restrict_self 446: the same numbers on every architecture). The PyPI `landlock` package was
not used: it is a development release (1.0.0.dev), and it covers neither the network rules (ABI 4) nor
the scoping of signals and abstract UNIX sockets (ABI 6) that this sandbox relies on; the kernel
interface is small enough to hold here in full.

    abi()                                   the kernel's Landlock ABI version (0: none)
    ruleset = Ruleset(abi())                handles every access right the ABI knows (denied unless granted)
    ruleset.allow(path, READ)               a file or a directory tree, read-only
    ruleset.allow(path, WRITE_TREE)         a directory tree the process may create, write and delete in,
                                            but never open a file of for reading (or execute)
    ruleset.restrict_self()                 enforce it on the calling thread and the threads it starts

A domain binds the calling THREAD and what it creates afterwards (up to ABI 7, as on kernel 6.18,
nothing restricts the other threads of the process), so a worker applies its first ruleset while it
is still single-threaded, before torch starts its threads (harness.sandbox.confine). Rulesets nest:
each later one can only take rights away.

What each ABI adds: 1 the filesystem; 2 REFER (rename or link across directories); 3 TRUNCATE; 4 TCP
bind and connect (no port is granted: no TCP at all); 5 IOCTL_DEV (ioctl on device files, granted on
/dev/nvidia* only); 6 scoping: no signal to, and no connection to an abstract UNIX socket of, a process
outside the domain; 7 audit logging (not used).
"""

from __future__ import annotations

import ctypes
import errno
import os
import stat
from pathlib import Path

SYS_CREATE_RULESET, SYS_ADD_RULE, SYS_RESTRICT_SELF = 444, 445, 446
CREATE_RULESET_VERSION = 1 << 0
RULE_PATH_BENEATH, RULE_NET_PORT = 1, 2

EXECUTE = 1 << 0
WRITE_FILE = 1 << 1
READ_FILE = 1 << 2
READ_DIR = 1 << 3
REMOVE_DIR = 1 << 4
REMOVE_FILE = 1 << 5
MAKE_CHAR = 1 << 6
MAKE_DIR = 1 << 7
MAKE_REG = 1 << 8
MAKE_SOCK = 1 << 9
MAKE_FIFO = 1 << 10
MAKE_BLOCK = 1 << 11
MAKE_SYM = 1 << 12
REFER = 1 << 13  # ABI 2
TRUNCATE = 1 << 14  # ABI 3
IOCTL_DEV = 1 << 15  # ABI 5
NET_BIND_TCP, NET_CONNECT_TCP = 1 << 0, 1 << 1  # ABI 4
SCOPE_ABSTRACT_UNIX_SOCKET, SCOPE_SIGNAL = 1 << 0, 1 << 1  # ABI 6

FS_BY_ABI = {1: (1 << 13) - 1, 2: (1 << 14) - 1, 3: (1 << 15) - 1, 4: (1 << 15) - 1, 5: (1 << 16) - 1}
FILE_RIGHTS = EXECUTE | WRITE_FILE | READ_FILE | TRUNCATE | IOCTL_DEV  # the rights a rule on a file may hold

READ = READ_FILE | READ_DIR  # read-only: open for reading, list; no execve (nothing in a worker executes)
DEVICE = READ_FILE | WRITE_FILE | IOCTL_DEV  # a device file opened read-write with its ioctls (/dev/nvidia*)
# a directory the process writes in: create, write, rename and delete, list; NOT read a file's bytes back
# (so it cannot write a shared library there and map it), not execute, no devices, sockets, fifos, links
WRITE_TREE = WRITE_FILE | READ_DIR | REMOVE_DIR | REMOVE_FILE | MAKE_DIR | MAKE_REG | REFER | TRUNCATE


class LandlockError(OSError):
    """A Landlock system call failed (the message names which, and the path of a rule)."""


class _RulesetAttr(ctypes.Structure):
    _fields_ = [("handled_access_fs", ctypes.c_uint64), ("handled_access_net", ctypes.c_uint64),
                ("scoped", ctypes.c_uint64)]


class _PathBeneathAttr(ctypes.Structure):
    _pack_ = 1  # __attribute__((packed)) in the kernel's header: 12 bytes
    _fields_ = [("allowed_access", ctypes.c_uint64), ("parent_fd", ctypes.c_int32)]


_libc = ctypes.CDLL(None, use_errno=True)
_syscall = _libc.syscall
_syscall.restype = ctypes.c_long


def abi() -> int:
    """The highest Landlock ABI the running kernel supports; 0 when it has none (too old, or not enabled
    at boot: `lsm=` without landlock), or when a seccomp filter of a container refuses the call."""
    version = _syscall(ctypes.c_long(SYS_CREATE_RULESET), None, ctypes.c_size_t(0),
                       ctypes.c_uint32(CREATE_RULESET_VERSION))
    return max(0, int(version))


def _raise(what: str, path: str | None = None) -> None:
    code = ctypes.get_errno()
    raise LandlockError(code, f"{what}: {os.strerror(code)}", path)


class Ruleset:
    """One Landlock ruleset being built: every right of `abi` is handled (denied unless a rule grants it),
    TCP bind and connect too from ABI 4, and from ABI 6 signals and abstract UNIX sockets are scoped to
    the domain. `allow` adds rules; `restrict_self` enforces and closes it."""

    def __init__(self, abi_version: int) -> None:
        if abi_version < 1:
            raise LandlockError(errno.EOPNOTSUPP, "Landlock is not available in this kernel")
        self.abi = abi_version
        self.handled = FS_BY_ABI.get(abi_version, FS_BY_ABI[5])
        attr = _RulesetAttr(self.handled, NET_BIND_TCP | NET_CONNECT_TCP if abi_version >= 4 else 0,
                            SCOPE_ABSTRACT_UNIX_SOCKET | SCOPE_SIGNAL if abi_version >= 6 else 0)
        size = ctypes.sizeof(attr) if abi_version >= 6 else (16 if abi_version >= 4 else 8)
        fd = _syscall(ctypes.c_long(SYS_CREATE_RULESET), ctypes.byref(attr), ctypes.c_size_t(size), ctypes.c_uint32(0))
        if fd < 0:
            _raise("landlock_create_ruleset")
        self.fd: int | None = int(fd)
        self.granted: list[tuple[str, int]] = []

    def allow(self, path: str | Path, access: int) -> bool:
        """Grant `access` (masked to what the ABI handles, and to file rights on a file) beneath `path`.
        A path that does not exist is skipped (False); so is one the process cannot open."""
        try:
            target = os.open(path, os.O_PATH | os.O_CLOEXEC)
        except OSError:
            return False
        try:
            rights = access & self.handled
            if not stat.S_ISDIR(os.fstat(target).st_mode):
                rights &= FILE_RIGHTS
            if not rights:
                return False
            rule = _PathBeneathAttr(rights, target)
            done = _syscall(ctypes.c_long(SYS_ADD_RULE), ctypes.c_int(self.fd), ctypes.c_int(RULE_PATH_BENEATH),
                            ctypes.byref(rule), ctypes.c_uint32(0))
            if done < 0:
                _raise("landlock_add_rule", str(path))
        finally:
            os.close(target)
        self.granted.append((str(path), rights))
        return True

    def restrict_self(self) -> None:
        """Enforce the ruleset on the calling thread (and the threads and processes it creates from now
        on). PR_SET_NO_NEW_PRIVS must be set first (harness.sandbox.confine does)."""
        try:
            done = _syscall(ctypes.c_long(SYS_RESTRICT_SELF), ctypes.c_int(self.fd), ctypes.c_uint32(0))
            if done < 0:
                _raise("landlock_restrict_self")
        finally:
            self.close()

    def close(self) -> None:
        if self.fd is not None:
            os.close(self.fd)
            self.fd = None
