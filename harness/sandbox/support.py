"""Whether this kernel can sandbox a worker, and whether the user asked for it: the one decision.

    support()            Support(landlock_abi, seccomp, problems): what the kernel and libseccomp offer
    decide(requested)    (label, refusal): "enforced", "off (--no-sandbox)", "off (ASTRA_SANDBOX=off)",
                         or a refusal reason when the sandbox is wanted and cannot be had (fail closed)

The judge decides once per job (harness.judge.evaluate) and writes "enforce" or "off" into each request it
hands a candidate process; a worker never turns the sandbox off by itself. `ASTRA_SANDBOX=off` in the
environment of the harness, or `--no-sandbox` on a judging command (Options.sandbox False), opts out;
the verdict records which. `ASTRA_SANDBOX_SIMULATE_MISSING=landlock|seccomp|all` makes `support()`
report that part missing, so the refusal can be tested on a kernel that has both (it never enables
anything: it can only take the sandbox away, and a refused worker loads nothing).
"""

from __future__ import annotations

import ctypes
import os
from dataclasses import dataclass, field

from harness.sandbox import landlock, syscalls

MODE_ENV = "ASTRA_SANDBOX"  # "off" (or 0, no, false): run candidates without the OS sandbox, recorded
SIMULATE_ENV = "ASTRA_SANDBOX_SIMULATE_MISSING"  # tests: landlock | seccomp | all
ENFORCE, OFF = "enforce", "off"  # what a request tells its worker
PR_GET_SECCOMP = 21


class SandboxUnavailable(RuntimeError):
    """The sandbox was required and the kernel (or libseccomp) cannot provide it: nothing is loaded."""


@dataclass
class Support:
    landlock_abi: int
    seccomp: bool
    problems: list[str] = field(default_factory=list)

    @property
    def usable(self) -> bool:
        return not self.problems

    def reason(self) -> str:
        return "; ".join(self.problems)


def _kernel_seccomp() -> str | None:
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(PR_GET_SECCOMP, 0, 0, 0, 0) < 0:
        return f"the kernel has no seccomp ({os.strerror(ctypes.get_errno())})"
    return None


def support() -> Support:
    """What this machine offers (see the module docstring for the simulation switch)."""
    simulate = os.environ.get(SIMULATE_ENV, "").strip().lower()
    problems: list[str] = []
    abi = 0 if simulate in ("landlock", "all") else landlock.abi()
    if abi < 1:
        problems.append("the kernel has no Landlock (Linux 5.13+ with landlock in its lsm= list)"
                        + (f" [simulated by {SIMULATE_ENV}]" if simulate in ("landlock", "all") else ""))
    if simulate in ("seccomp", "all"):
        why: str | None = f"seccomp is missing [simulated by {SIMULATE_ENV}]"
    else:
        why = _kernel_seccomp() or syscalls.available()
    if why:
        problems.append(why)
    return Support(landlock_abi=abi, seccomp=why is None, problems=problems)


def opted_out(requested: bool = True) -> str | None:
    """Why the sandbox is off by the user's choice ("--no-sandbox", "ASTRA_SANDBOX=off"), or None."""
    if not requested:
        return "--no-sandbox"
    value = os.environ.get(MODE_ENV, "").strip()
    if value.lower() in ("off", "0", "no", "false"):
        return f"{MODE_ENV}={value}"
    return None


def decide(requested: bool = True) -> tuple[str, str | None]:
    """(label for the verdict, refusal reason or None). Refused: wanted, and the kernel cannot."""
    why_off = opted_out(requested)
    if why_off:
        return f"off ({why_off})", None
    found = support()
    if not found.usable:
        return (f"unavailable ({found.reason()})",
                f"the OS sandbox cannot be enforced on this machine: {found.reason()}. Candidate code is only "
                f"run sandboxed; pass --no-sandbox (or set {MODE_ENV}=off) to judge without it, at your own risk")
    return "enforced", None


def request_mode(label: str) -> str:
    """What the judge writes into a worker's request for its decision `label`."""
    return OFF if label.startswith("off") else ENFORCE
