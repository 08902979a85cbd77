"""`--agent exec:CMD`: any coding agent (Claude Code, Codex CLI, aider, a script of yours) drives the loop.

Each round Astra writes a folder under the run directory (astra.optimize.exec_context: sources, the best
and its verdict, the failures, the budget, a README for the agent), runs CMD there through the shell with
a time limit, in its own process group (ended whole on a timeout or Ctrl-C), and reads `candidate.cuh` back:

- changed: one `Proposal`, verified by the loop like any other candidate (`IDEA.txt` names it);
- unchanged, exit 0: no proposal, so the loop stops with "the agent has nothing left to try";
- a non-zero exit or a timeout: an AstraError with the exit status, the log's tail and what to do (the loop
  stops and keeps what verified); a timeout set by the run's wall-time budget is BudgetSpent, a normal end.

The command is the user's own, run with the user's rights, like `make`; the candidate it writes is
untrusted like any other and only ever runs in the judge's worker.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import signal
import subprocess
import time
from pathlib import Path

from astra.errors import AstraError, BudgetSpent
from astra.optimize import exec_context
from astra.optimize.exec_context import CANDIDATE, IDEA, LOG, USAGE
from astra.optimize.loop import Agent, Context, Proposal
from astra.text import one_line, printable
from harness.worker import children

PREFIX = "exec:"
DEFAULT_TIMEOUT_S = 900.0
TAIL_LINES = 15
TAIL_CHARS = 1500
KILL_GRACE_S = 5.0


def exec_command(agent: str) -> str:
    """The CMD of `--agent exec:CMD`; an AstraError saying what to write for anything else."""
    value = str(agent).strip()
    if not value.startswith(PREFIX):
        raise AstraError(f"--agent {agent!r}: write exec:CMD, a command Astra runs in each round's folder, e.g. "
                         "--agent 'exec:./my-agent.sh' (docs/agents.md); for the built-in agents leave --agent out "
                         "(--offline: the search agent; --model: the LLM agent)")
    command = value[len(PREFIX):].strip()
    if not command:
        raise AstraError("--agent exec: no command after `exec:`; name the one that edits candidate.cuh, e.g. "
                         "--agent 'exec:./my-agent.sh' (docs/agents.md)")
    return command


def first_word(command: str) -> str:
    try:
        words = shlex.split(command)
    except ValueError:  # unbalanced quotes: the shell will say so when it runs
        words = command.split()
    return words[0] if words else command


def slug(text: str, limit: int = 48) -> str:
    """A candidate-name piece from an idea: lower case, words joined by '-'."""
    return re.sub(r"[^a-z0-9]+", "-", text.lower()).strip("-")[:limit].strip("-")


def include_headers(spec, tree) -> list[tuple[str, Path]]:
    """(path under sources/, file) of each SGLang file the kernel includes, transitively; [] without a tree."""
    if tree is None:
        return []
    from astra.sglang.includes import include_closure

    kernel = (tree.csrc_dir / spec.kernel_file).resolve()
    out = []
    for path in include_closure(tree, [kernel]):
        if path == kernel:
            continue
        for root in (tree.include_dir, tree.csrc_dir, tree.root):
            if path.is_relative_to(root.resolve()):
                out.append((str(path.relative_to(root.resolve())), path))
                break
    return out


class ExecAgent(Agent):
    """An agent that is a command: one proposal per round, the file the command edited."""

    def __init__(self, command: str, spec, timeout_s: float = DEFAULT_TIMEOUT_S, tree=None):
        self.command = command
        self.spec = spec
        self.timeout_s = float(timeout_s)
        self.word = first_word(command)
        self.name = f"exec:{self.word}"
        self.rationale = ""
        self._headers = include_headers(spec, tree)
        self._tokens, self._cost = 0, 0.0

    def usage(self) -> tuple[int, float]:
        return self._tokens, self._cost

    def propose(self, ctx: Context) -> list[Proposal]:
        limit, by_wall = self._limit(ctx)
        folder = exec_context.write_round(ctx, self.spec, self.command, limit, self._headers)
        before = (folder / CANDIDATE).read_text(encoding="utf-8")
        start = time.monotonic()
        status = self._run(folder, ctx, limit)
        seconds = time.monotonic() - start
        self._read_usage(folder)
        if status is None:
            what = (f"the agent command `{self.word}` ran past its time limit of {limit:.0f}s and was stopped; "
                    f"{self._tail(folder)}")
            if by_wall:
                raise BudgetSpent(f"{what}; the run's wall-time budget ended it (raise --wall-min for more)")
            raise AstraError(f"{what}; give it longer with --agent-timeout SECONDS, or ask it for a smaller change "
                             f"per round; {self._resume(ctx)}")
        if status != 0:
            how = f"was killed by signal {-status}" if status < 0 else f"exited with status {status}"
            raise AstraError(f"the agent command `{self.word}` {how} after {seconds:.1f}s; {self._tail(folder)}; "
                             f"run it by hand in {folder} to see why, fix it, then {self._resume(ctx)}")
        after = self._candidate(folder)
        if after == before:
            self.rationale = f"{self.word} left {CANDIDATE} unchanged"
            return []
        idea = self._idea(folder)
        self.rationale = idea or f"edit by {self.word}"
        name = f"exec:r{ctx.round}" + (f":{slug(idea)}" if slug(idea) else "")
        return [Proposal(name, "exec", self.rationale, after)]

    def _limit(self, ctx: Context) -> tuple[float, bool]:
        """The command's time limit: --agent-timeout, or less where the wall-time budget has less left."""
        if ctx.wall_left_s is not None and ctx.wall_left_s < self.timeout_s:
            return max(1.0, ctx.wall_left_s), True
        return self.timeout_s, False

    def _run(self, folder: Path, ctx: Context, limit: float) -> int | None:
        """The command's exit status (negative: a signal), or None when it ran past `limit`."""
        env = {**os.environ, "ASTRA_CONTEXT_DIR": str(folder), "ASTRA_CANDIDATE": str(folder / CANDIDATE),
               "ASTRA_ROUND": str(ctx.round), "ASTRA_KERNEL": ctx.kernel}
        with open(folder / LOG, "wb") as log:
            with children.started(self.command, shell=True, cwd=folder, env=env, stdin=subprocess.DEVNULL,
                                  stdout=log, stderr=subprocess.STDOUT) as proc:
                return self._wait(proc, limit)

    @staticmethod
    def _wait(proc: subprocess.Popen, limit: float) -> int | None:
        """Its exit status, or None when it ran past `limit` (its group then ended: SIGTERM, then SIGKILL)."""
        try:
            return proc.wait(timeout=limit)
        except subprocess.TimeoutExpired:
            _end_group(proc)
            return None
        except BaseException:  # Ctrl-C reaches only Astra (the command has its own session): end it too
            _end_group(proc)
            raise

    def _candidate(self, folder: Path) -> str:
        path = folder / CANDIDATE
        try:
            return path.read_text(encoding="utf-8")
        except FileNotFoundError:
            raise AstraError(f"the agent command `{self.word}` deleted {path}; it must edit that file in place "
                             "(docs/agents.md)") from None
        except UnicodeDecodeError as err:
            raise AstraError(f"the agent command `{self.word}` left {path} that is not UTF-8 text (byte "
                             f"{err.start}); a kernel source is text") from None

    def _idea(self, folder: Path) -> str:
        path = folder / IDEA
        if not path.is_file():
            return ""
        text = path.read_text(encoding="utf-8", errors="replace")
        return one_line(next((line for line in text.splitlines() if line.strip()), ""), 200)

    def _read_usage(self, folder: Path) -> None:
        """Add what the agent says it spent (USAGE.json, optional) to the run's tokens and cost."""
        path = folder / USAGE
        if not path.is_file():
            return
        try:
            data = json.loads(path.read_text(encoding="utf-8"))
            tokens, cost = data.get("tokens", 0), data.get("cost_usd", 0.0)
            if isinstance(tokens, bool) or not isinstance(tokens, int) or not isinstance(cost, (int, float)) \
                    or isinstance(cost, bool) or tokens < 0 or not cost >= 0:
                raise ValueError("tokens must be a whole number >= 0 and cost_usd a number >= 0")
        except (ValueError, AttributeError, UnicodeDecodeError) as err:
            raise AstraError(f"{path}: {one_line(err, 160)}; write {{\"tokens\": N, \"cost_usd\": X}} "
                             "or no USAGE.json") from None
        self._tokens += tokens
        self._cost += float(cost)

    def _tail(self, folder: Path) -> str:
        path = folder / LOG
        try:
            text = printable(path.read_bytes()[-8 * TAIL_CHARS:].decode("utf-8", errors="replace"))
        except OSError:
            return f"no log at {path}"
        lines = [line.strip() for line in text.splitlines() if line.strip()][-TAIL_LINES:]
        tail = " | ".join(lines)[-TAIL_CHARS:]
        return f"the end of its log ({path}): {tail}" if tail else f"its log ({path}) is empty"

    def _resume(self, ctx: Context) -> str:
        return (f"continue with `astra optimize {ctx.kernel} --resume {Path(ctx.run_dir).name} "
                f"--agent {shlex.quote(PREFIX + self.command)}`")


def _end_group(proc: subprocess.Popen) -> None:
    """SIGTERM to the command's whole process group, then SIGKILL to whatever is left after a grace period."""
    try:
        os.killpg(proc.pid, signal.SIGTERM)
    except ProcessLookupError:
        return
    try:
        proc.wait(timeout=KILL_GRACE_S)
    except subprocess.TimeoutExpired:
        pass
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    proc.wait()
