"""Errors that reach the user as one line and an exit code (never a traceback).

Library code raises these; only the CLI edge turns them into output. Each message says what
to do next. The exit codes (docs/exit-codes.md is the table users read):

     0  done; the result is what was asked for
     1  a negative result: a candidate incorrect or not faster, a patch refused, a recheck regression
     2  usage: a command line argparse rejects; for `apply`/`recheck`, a patch that no longer applies
     3  not an SGLang tree, or the version is not in the package index        SglangNotFound
     4  unknown kernel or spec                                                  UnknownKernel
     5  malformed spec (one line per problem)                                  SpecError
     6  a tool is missing (nvcc, git, libclang, CUDA headers)                   ToolMissing
     7  no CUDA GPU here (check, bench, optimize without --dry-run)             NoGpu
     8  the file's sha256 is not the patch's base (apply without --force)      BaseHashMismatch
     9  not an Astra patch, or a corrupt or inconsistent one                   NotAnAstraPatch
    10  a token or cost budget is spent (the run keeps what it verified)       BudgetSpent
    11  recheck could not verify (base version missing, sources not compared, GPU checks not run)
    12  bad input: a value or file the command cannot use                      BadInput (AstraError)
    13  the LLM endpoint failed (unreachable, wrong key, unknown model, garbage) LLMError
        or $ASTRA_HOME/config.yaml cannot be used                               astra.config.ConfigFileError
    14  a run directory is unusable (corrupt state, another kernel's run)       RunStateError
    15  the machine failed, not the kernel (disk full, out of memory)          EnvironmentFailure
    16  the OS sandbox cannot be enforced here (doctor; a check refused)       SandboxMissing
    17  the model answered, but nothing usable came out (no edit that applies)  LLMNoUsableReply
"""

from __future__ import annotations


class AstraError(Exception):
    """A failure the user can act on. `exit_code` is what the CLI exits with."""

    exit_code = 12

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


class NoGpu(AstraError):
    exit_code = 7


class BadInput(AstraError):
    """A value or file the command cannot use (the default for AstraError)."""

    exit_code = 12


class RunStateError(AstraError):
    exit_code = 14


class EnvironmentFailure(AstraError):
    exit_code = 15


class SandboxMissing(AstraError):
    """Candidate code cannot be sandboxed here (no Landlock or seccomp, or the self-test saw an action
    through): `astra doctor`, and a check whose verdict is "sandbox_unavailable"."""

    exit_code = 16


class BudgetSpent(AstraError):
    """A budget (tokens, cost) is spent: a normal end of an optimize run, not a failure."""

    exit_code = 10


# ---- patches (astra patch / apply / recheck)


class PatchDoesNotApply(AstraError):
    exit_code = 2


class BaseHashMismatch(AstraError):
    exit_code = 8


class NotAnAstraPatch(AstraError):
    """Not an Astra patch, or a corrupt/truncated one."""

    exit_code = 9


class CouldNotVerify(AstraError):
    """recheck could not compare sources or run its GPU checks: not a pass."""

    exit_code = 11
