"""Errors that reach the user as one line and an exit code (never a traceback).

Library code raises these; only the CLI edge turns them into output. Each message says what
to do next.
"""

from __future__ import annotations


class AstraError(Exception):
    """A failure the user can act on. `exit_code` is what the CLI exits with."""

    exit_code = 2

    def __init__(self, message: str, *, exit_code: int | None = None):
        super().__init__(message)
        if exit_code is not None:
            self.exit_code = exit_code


class SglangNotFound(AstraError):
    exit_code = 3


class UnknownKernel(AstraError):
    exit_code = 4


class SpecError(AstraError):
    """A malformed kernel spec; `problems` lists one message per mistake."""

    exit_code = 5

    def __init__(self, path: str, problems: list[str]):
        self.path = path
        self.problems = list(problems)
        lines = "\n".join(f"  - {p}" for p in self.problems)
        super().__init__(f"{path}: {len(self.problems)} problem(s) in the kernel spec:\n{lines}")


class ToolMissing(AstraError):
    exit_code = 6


class BudgetSpent(AstraError):
    """A budget (tokens, cost) is spent: a normal end of an optimize run, not a failure."""

    exit_code = 10


# ---- patches (astra patch / apply / recheck); exit codes documented in astra/apply_cmd.py


class PatchDoesNotApply(AstraError):
    exit_code = 2


class BaseHashMismatch(AstraError):
    exit_code = 8


class NotAnAstraPatch(AstraError):
    """Not an Astra patch, or a corrupt/truncated one."""

    exit_code = 9
