"""The order in which a worker that loads candidate code closes itself in (every such worker follows it).

    box = Confinement(request.get("sandbox"), writable=[home, work], readable=[*module_paths])
    box.begin()        # single-threaded, before torch: NO_NEW_PRIVS, capabilities dropped, Landlock floor
    ...                # the trusted warm-up: box.warm_up(device) imports torch, initialises CUDA, tvm_ffi
    box.seal()         # Landlock tightened to what the warm-up mapped; seccomp stage 1 on every thread
    modules = load(...)   # the candidate's constructors run here, sandboxed
    box.lock_exec()    # seccomp stage 2: no new executable mapping
    ...                # calls

`mode` is what the judge wrote into the request: "enforce" (also when missing: fail closed) or "off".
With "off" every step is a no-op and `label` says so. `filesystem=False` leaves Landlock out (the
process Nsight Compute profiles: its injected profiler needs files the allow-list does not give);
seccomp, NO_NEW_PRIVS and the dropped capabilities still apply. With "enforce" on a kernel without Landlock or
seccomp, `begin()` raises `SandboxUnavailable` before anything is loaded.

Why the floor comes before the warm-up: a Landlock domain binds the calling thread and what it starts
afterwards, and importing torch already starts a thread; a candidate that could run code on a thread
left outside the domain (a signal handler delivered to it, say) would escape it. seccomp has TSYNC and
is installed on every thread later. The tight list (harness.sandbox.allowlist.tight) nests inside the
floor on the thread that loads and calls the candidate.
"""

from __future__ import annotations

import ctypes
import importlib
import logging
import os
from pathlib import Path

from harness.sandbox import allowlist, landlock, syscalls
from harness.sandbox.support import ENFORCE, OFF, SandboxUnavailable, support

log = logging.getLogger(__name__)

PR_SET_NO_NEW_PRIVS, PR_CAPBSET_DROP, PR_CAP_AMBIENT, PR_CAP_AMBIENT_CLEAR_ALL = 38, 24, 47, 4
DROP_CAPABILITIES = True  # a root worker gives up every capability before the warm-up
# Imported during the warm-up so that no library has to be mapped after the candidate is loaded: the
# harness modules a worker uses later, and the standard modules behind them that are C extensions.
WARM_MODULES = ("hashlib", "json", "struct", "zlib", "harness.judge.correctness", "harness.judge.inputs",
                "harness.candidate.exchange", "harness.candidate.cuda_ipc", "harness.timing.modes", "harness.judge.timed_outputs",
                "harness.building.module_loading", "harness.probe.observation", "harness.judge.back_to_back",
                "harness.timing.timing_side", "harness.timing.timing_link", "harness.timing.timed_sets")
# Libraries the CUDA driver opens lazily (PTX JIT): mapped in the warm-up when present, so a later use
# finds them loaded rather than mapping them under stage 2.
LAZY_LIBRARIES = ("libnvidia-ptxjitcompiler.so.1",)


class _UserCapHeader(ctypes.Structure):
    _fields_ = [("version", ctypes.c_uint32), ("pid", ctypes.c_int)]


class _UserCapData(ctypes.Structure):
    _fields_ = [("effective", ctypes.c_uint32), ("permitted", ctypes.c_uint32), ("inheritable", ctypes.c_uint32)]


_libc = ctypes.CDLL(None, use_errno=True)


def _prctl(option: int, arg: int = 0) -> int:
    return _libc.prctl(ctypes.c_int(option), ctypes.c_ulong(arg), ctypes.c_ulong(0), ctypes.c_ulong(0),
                       ctypes.c_ulong(0))


def _no_new_privs() -> None:
    if _prctl(PR_SET_NO_NEW_PRIVS, 1) != 0:
        code = ctypes.get_errno()
        raise SandboxUnavailable(f"prctl(PR_SET_NO_NEW_PRIVS) failed: {os.strerror(code)}")


def _drop_capabilities() -> None:
    """Empty the bounding, ambient, effective, permitted and inheritable capability sets of this thread
    (and so of the threads it starts). A process that already has none is unchanged."""
    last = int(Path("/proc/sys/kernel/cap_last_cap").read_text()) if Path("/proc/sys/kernel/cap_last_cap").exists() else 40
    for cap in range(last + 1):
        _prctl(PR_CAPBSET_DROP, cap)  # EPERM without CAP_SETPCAP: nothing to drop then
    _prctl(PR_CAP_AMBIENT, PR_CAP_AMBIENT_CLEAR_ALL)
    header = _UserCapHeader(0x20080522, 0)  # _LINUX_CAPABILITY_VERSION_3: two data words
    data = (_UserCapData * 2)()
    if _libc.capset(ctypes.byref(header), data) != 0:
        code = ctypes.get_errno()
        raise SandboxUnavailable(f"capset (dropping capabilities) failed: {os.strerror(code)}")


def threads() -> int:
    """How many threads this process has now."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("Threads:"):
            return int(line.split()[1])
    return 1


class Confinement:
    """One worker's sandbox (see the module docstring). `report()` says what was applied."""

    def __init__(self, mode: str | None, *, writable, readable=(), filesystem: bool = True) -> None:
        self.enforce = (mode or ENFORCE) != OFF
        self.writable = [Path(p) for p in writable]
        self.readable = [Path(p) for p in readable]
        self.filesystem = filesystem  # False: no Landlock (a profiler in the process needs the filesystem)
        self.abi = 0
        self.steps: list[str] = []
        self.notes: list[str] = []

    @property
    def label(self) -> str:
        return "enforced" if self.enforce else "off"

    def begin(self) -> None:
        """NO_NEW_PRIVS, capabilities dropped, the Landlock floor; call while single-threaded."""
        if not self.enforce:
            return
        found = support()  # imports pyseccomp (its library lookup runs a program: before Landlock)
        if not found.usable:
            raise SandboxUnavailable(f"sandbox unavailable: {found.reason()}")
        self.abi = found.landlock_abi
        if threads() > 1:  # e.g. a tool's injected library started one; seccomp still binds it (TSYNC)
            self.notes.append(f"{threads()} threads before the Landlock floor: the ones not started by this "
                              "thread are bound by seccomp only")
        _no_new_privs()
        if DROP_CAPABILITIES:
            _drop_capabilities()
        self._restrict(allowlist.floor(self.writable, self.readable), "floor")

    def _restrict(self, rules: allowlist.Rules, name: str) -> None:
        if not self.filesystem:
            if name == "floor":
                self.notes.append("no Landlock: a tool in this process needs the filesystem (seccomp only)")
            return
        self._refuse_readable_writable(rules)
        ruleset = landlock.Ruleset(self.abi)
        try:
            for path, access in rules:
                ruleset.allow(path, access)
        except landlock.LandlockError as error:
            ruleset.close()
            raise SandboxUnavailable(f"sandbox unavailable: Landlock {name}: {error}") from None
        ruleset.restrict_self()
        self.steps.append(f"landlock {name} (ABI {self.abi}, {len(ruleset.granted)} rules)")

    def _refuse_readable_writable(self, rules: allowlist.Rules) -> None:
        """A writable directory inside a readable one would let a written library be mapped: refuse."""
        for path, access in rules:
            if access & landlock.READ_FILE and any(
                    Path(os.path.realpath(w)).is_relative_to(os.path.realpath(path)) for w in self.writable):
                raise SandboxUnavailable(f"sandbox unavailable: the writable directory lies inside {path}, which "
                                         "the worker must be able to read; use a temporary directory elsewhere")

    def warm_up(self, device=None, tvm_ffi: bool = True) -> None:
        """The trusted warm-up (also run with the sandbox off, so both paths load the same way): torch,
        CUDA on `device` (one allocation, one kernel, a synchronisation), tvm_ffi (unless the worker loads
        no module: a test's stand-in launches), the modules and libraries used later."""
        import torch

        if device is not None and torch.device(device).type == "cuda":
            probe = torch.ones(1, device=device)
            (probe + 1).sum().item()
            torch.cuda.synchronize(device)
            del probe
        if tvm_ffi:
            import tvm_ffi as _  # noqa: F401  (it installs its own SIGSEGV handler: a C++ stack on a crash)
        for name in WARM_MODULES:
            importlib.import_module(name)
        for name in LAZY_LIBRARIES:
            try:
                ctypes.CDLL(name, mode=os.RTLD_NOW | os.RTLD_GLOBAL)
            except OSError:
                pass  # not installed here (no NVIDIA driver): nothing to map later either

    def seal(self) -> None:
        """After the warm-up: the tight Landlock list, then seccomp stage 1 on every thread."""
        if not self.enforce:
            return
        self._restrict(allowlist.tight(self.writable, self.readable), "tight")
        try:
            skipped = syscalls.deny_escapes(os.getpid())
        except syscalls.SeccompUnavailable as error:
            raise SandboxUnavailable(f"sandbox unavailable: {error}") from None
        self.steps.append("seccomp stage 1")
        if skipped:
            self.notes.append(f"libseccomp does not know {', '.join(skipped)}: not filtered")

    def lock_exec(self) -> None:
        """After the candidate module is loaded: seccomp stage 2 (no new executable mapping). Logs what
        the worker runs under (INFO), so its stderr says it."""
        if not self.enforce:
            log.info("sandbox: off")
            return
        if not syscalls.STAGE_TWO:
            log.info("sandbox: %s (stage 2 switched off)", "; ".join(self.steps))
            return
        try:
            skipped = syscalls.deny_new_code()
        except syscalls.SeccompUnavailable as error:
            raise SandboxUnavailable(f"sandbox unavailable: {error}") from None
        self.steps.append("seccomp stage 2")
        if skipped:
            self.notes.append(f"libseccomp does not know {', '.join(skipped)}: not filtered")
        log.info("sandbox: %s", "; ".join(self.steps + self.notes))

    def report(self) -> dict:
        return {"mode": self.label, "landlock_abi": self.abi, "steps": list(self.steps), "notes": list(self.notes)}
