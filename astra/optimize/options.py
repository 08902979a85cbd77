"""The options of one optimize run (`astra optimize`) and of `astra eval`, typed and checked: the CLI builds
them from flags, library code passes them to `run_optimize` (astra.optimize.driver)."""

from __future__ import annotations

import math
from dataclasses import dataclass

from astra.errors import AstraError
from astra.optimize.loop import Budget


@dataclass
class OptimizeOptions:
    """What `optimize` and `eval` share: the agent, the endpoint, the budgets."""

    rounds: int = 5
    offline: bool = False  # the built-in search agent even when an LLM is configured
    model: str | None = None
    base_url: str | None = None
    budget_tokens: int | None = None
    budget_usd: float | None = None
    wall_min: float = 60.0
    sanitizer: bool = True
    sandbox: bool = True  # False: candidates run without the OS sandbox (--no-sandbox; each verdict says so)
    dry_run: bool = False  # no GPU: one round, its candidates built with nvcc, none verified (patience 1)
    quick_search: bool = False  # search on the timed dtype; verify the best on the full suite at the end
    resume: str | None = None  # a run id to continue
    agent: str | None = None  # "exec:CMD": a command edits the candidate each round (astra.optimize.exec_agent)
    agent_timeout_s: float = 900.0  # the exec agent's time limit per round
    samples: int = 1  # the LLM coder's candidates per round, asked for at once
    rebaseline: bool = False  # time the original again instead of reusing a stored baseline, and replace it

    def __post_init__(self) -> None:
        """Refuse values no run can use, with the flag that sets each (exit 12)."""
        def positive(value, flag: str, *, integer: bool = False, optional: bool = False) -> None:
            if value is None and optional:
                return
            kind = "a positive integer" if integer else "a positive number"
            if isinstance(value, bool) or not isinstance(value, int if integer else (int, float)):
                raise AstraError(f"{flag} {value!r}: must be {kind}")
            if not value > 0 or not math.isfinite(value):  # `not >` also refuses NaN
                raise AstraError(f"{flag} {value}: must be {kind}")

        positive(self.rounds, "--rounds", integer=True)
        positive(self.wall_min, "--wall-min")
        positive(self.budget_tokens, "--budget-tokens", integer=True, optional=True)
        positive(self.budget_usd, "--budget-usd", optional=True)
        for flag, value in (("--model", self.model), ("--base-url", self.base_url), ("--resume", self.resume)):
            if value is not None and not str(value).strip():
                raise AstraError(f"{flag}: empty; leave it out or give a value")
        positive(self.agent_timeout_s, "--agent-timeout")
        positive(self.samples, "--samples", integer=True)
        if self.agent is not None:
            from astra.optimize.exec_agent import exec_command

            exec_command(self.agent)  # `exec:` and a command, or an error saying what to write
            clash = next((flag for flag, on in (("--offline", self.offline), ("--model", self.model),
                                                ("--base-url", self.base_url)) if on), None)
            if clash:
                raise AstraError(f"--agent and {clash}: pick one agent; --agent exec:CMD runs your command (it "
                                 f"chooses its own model), {clash} is for the built-in agents: drop one of the two")

    def budget(self) -> Budget:
        return Budget(rounds=self.rounds, wall_s=self.wall_min * 60, tokens=self.budget_tokens,
                      cost_usd=self.budget_usd, patience=1 if self.dry_run else 2)
