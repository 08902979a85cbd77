"""The OS sandbox of every process that loads candidate code (Landlock + seccomp; docs/threat-model.md).

The static scan of the candidate's source and the check of its built module (harness.scan) stay as
the early warning with a line number; this is the guarantee. A worker that loads candidate code (the
candidate process of harness.candidate.process, in both its phases, and the probe's case runner of
harness.probe.processes; the Nsight Compute profile of astra.optimize.ncu_profile with seccomp only)
closes itself in with `Confinement` (harness.sandbox.confine) in this order:

    begin()    NO_NEW_PRIVS, no capabilities, Landlock floor        single-threaded, before torch
    warm_up()  torch, CUDA context, tvm_ffi, the modules used later  trusted code
    seal()     Landlock tight list, seccomp stage 1 (TSYNC)          then the candidate is loaded
    lock_exec() seccomp stage 2: no new executable mapping           then it is called

Modules: landlock (the kernel interface), syscalls (the seccomp filters), allowlist (what may be read
and written), support (can this machine, and does the user want it: `decide`), confine (the order),
selftest (a C payload that tries every forbidden action; `astra doctor` runs it).
"""

from harness.sandbox.confine import Confinement
from harness.sandbox.support import (
    ENFORCE,
    MODE_ENV,
    OFF,
    SIMULATE_ENV,
    SandboxUnavailable,
    decide,
    request_mode,
    support,
)

__all__ = ["ENFORCE", "MODE_ENV", "OFF", "SIMULATE_ENV", "Confinement", "SandboxUnavailable", "decide",
           "request_mode", "support"]
