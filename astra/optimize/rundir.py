"""A run directory holds everything an optimize run did, and lets it resume.

    $ASTRA_HOME/runs/<run id>/
        state.json                 round, best candidate, budgets spent, history, plans, stop reason (rewritten atomically)
        original.cuh               the kernel file the run started from
        baseline.json              the original timed against itself (the first round's profile; timed by
                                   the run, or a copy of a stored one: astra.optimize.baseline_store)
        candidates/<n>/kernel.cuh  every candidate's source ...
        candidates/<n>/verdict.json  ... and its verdict (or build-only result)
        candidates/<n>/meta.json   who proposed it, the plan, the edit
        transcript.jsonl           the agents' exchanges (never an API key)

Verdicts are harness `Verdict`s in memory and JSON only on disk; history entries are `HistoryEntry`s.
The run's `RunState` is read from state.json once (on open, or on first use) and held in memory; every
`save` is a checkpoint that rewrites state.json atomically when the state changed since it was written.
"""

from __future__ import annotations

import json
import os
import time
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path

from astra import input_files, paths
from astra.errors import AstraError, RunStateError
from astra.text import printable
from harness import Verdict


@dataclass
class HistoryEntry:
    """One candidate as the loop saw it."""

    n: int  # candidate number
    round: int
    name: str  # the change, e.g. "kWarpsPerBlock=8" or the planner's idea
    status: str  # the verdict's status, or "built"/"build_failed" in a dry run
    score: float  # geomean speedup, graph mode, all timed shapes (0: not verified correct)
    accepted: bool  # became the run's best
    why: str  # the acceptance decision in one line
    base: str = ""  # source_id of the source it was made from
    bands: dict[str, float] = field(default_factory=dict)  # graph-mode geomean per band

    @classmethod
    def from_dict(cls, data: dict) -> "HistoryEntry":
        known = {f.name for f in fields(cls)}
        return cls(**{k: v for k, v in data.items() if k in known})


@dataclass
class RoundPlan:
    """What an agent planned for one round, before its candidates were judged: the profile's symptoms
    (astra.optimize.profiling.Symptom as dicts) of the base it edits and, where it differs, of the original;
    the plan (astra.optimize.llm_context.Plan as dicts, in the order tried: the offline planner's steps or
    the LLM planner's one idea); and notes (a pass held back, a step that did not apply)."""

    round: int
    agent: str
    base: str = ""  # what was profiled: "original" or "best #n"
    symptoms: list[dict] = field(default_factory=list)
    original_symptoms: list[dict] = field(default_factory=list)  # empty when the base is the original
    plans: list[dict] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    @classmethod
    def from_dict(cls, data: dict) -> "RoundPlan":
        known = {f.name for f in fields(cls)}
        return cls(**{k: v for k, v in data.items() if k in known})


@dataclass
class RunState:
    run_id: str
    kernel: str
    sglang_version: str
    agent: str  # "offline" or "llm:<model>"
    round: int = 0
    best: int | None = None  # candidate number of the best verified candidate (None: the original)
    best_score: float = 1.0  # geomean speedup (graph mode, all timed shapes) of the best
    history: list[HistoryEntry] = field(default_factory=list)
    plans: list[RoundPlan] = field(default_factory=list)  # per round, what the agent planned (where it plans)
    tokens: int = 0
    cost_usd: float = 0.0
    started: float = field(default_factory=time.time)
    stopped: str | None = None
    identity: dict = field(default_factory=dict)  # what decides whether `astra eval` may reuse it (driver.run_identity)
    wall_s: float = 0.0  # seconds its sessions ran (run_optimize, start to end), summed over resumptions
    # where baseline.json came from (astra.optimize.baseline_store): {"how": "reused", "file", "timed_at",
    # "timed_by", "gpu"} or {"how": "timed", "timed_at", "gpu", "file" (stored as, or ""), "note" (why not
    # stored), "why" (why no stored one was reused)}; empty when the run kept no store
    baseline_origin: dict = field(default_factory=dict)

    def to_dict(self) -> dict:
        return asdict(self)

    def judged(self, since: int = 0) -> int:
        """Candidates the judge gave a verdict, in history entries from `since` on: every entry but a dry
        run's "built" (built by nvcc, never verified). A build failure is a verdict; a candidate judged again
        (a quick search's best on the full suite) counts each time."""
        return sum(1 for h in self.history[since:] if h.status != "built")

    @classmethod
    def from_dict(cls, data: dict) -> "RunState":
        """The state in `data`; a ValueError says what is wrong with it."""
        if not isinstance(data, dict):
            raise ValueError(f"a JSON {type(data).__name__}, not an object")
        known = {f.name for f in fields(cls)}
        data = {k: v for k, v in data.items() if k in known}
        missing = [k for k in ("run_id", "kernel", "sglang_version", "agent") if k not in data]
        if missing:
            raise ValueError(f"no {', '.join(missing)}")
        history = data.get("history") or []
        if not isinstance(history, list) or not all(isinstance(h, dict) for h in history):
            raise ValueError("`history` is not a list of entries")
        plans = data.get("plans") or []
        if not isinstance(plans, list) or not all(isinstance(p, dict) for p in plans):
            raise ValueError("`plans` is not a list of round plans")
        try:
            data["history"] = [HistoryEntry.from_dict(h) for h in history]
            data["plans"] = [RoundPlan.from_dict(p) for p in plans]
        except TypeError as err:
            raise ValueError(f"a history entry or a round plan is incomplete ({err})") from None
        state = cls(**data)
        if not isinstance(state.kernel, str) or not isinstance(state.round, int) or not (
                state.best is None or isinstance(state.best, int)):
            raise ValueError("`kernel`, `round` or `best` has the wrong type")
        if not isinstance(state.tokens, int) or not isinstance(state.cost_usd, (int, float)) or not isinstance(
                state.wall_s, (int, float)):
            raise ValueError("`tokens`, `cost_usd` or `wall_s` is not a number")
        if not isinstance(state.baseline_origin, dict):
            raise ValueError("`baseline_origin` is not an object")
        return state


def per_hour(count: int, seconds: float | None) -> float | None:
    """`count` over `seconds`, per hour; None when no time was measured."""
    return count * 3600.0 / seconds if seconds and seconds > 0 else None


class RunDir:
    def __init__(self, root: Path):
        self.root = root
        self._state: RunState | None = None  # held in memory once read or created
        self._written: str | None = None  # the JSON state.json holds (as last read or written)

    @classmethod
    def create(cls, kernel: str, sglang_version: str, agent: str, original: str) -> "RunDir":
        run_id = time.strftime("%Y%m%d-%H%M%S") + f"-{kernel}"
        root = paths.sub("runs") / run_id
        suffix = 1
        while root.exists():
            suffix += 1
            root = paths.sub("runs") / f"{run_id}-{suffix}"
        (root / "candidates").mkdir(parents=True)
        run = cls(root)
        (root / "original.cuh").write_text(original)
        run.save(RunState(root.name, kernel, sglang_version, agent))
        return run

    @classmethod
    def open(cls, run_id: str) -> "RunDir":
        """An existing run by id (a directory under $ASTRA_HOME/runs); its state must be readable."""
        if not run_id or not run_id.strip() or "/" in run_id or run_id in (".", ".."):
            raise AstraError(f"{run_id!r} is not a run id; `astra runs` lists them")
        root = paths.sub("runs") / run_id
        if not (root / "state.json").exists():
            known = ", ".join(list_runs()[-5:]) or "none"
            raise AstraError(f"no run {run_id!r} under {paths.sub('runs')} (recent: {known})")
        run = cls(root)
        run.state()
        return run

    def state(self) -> RunState:
        """The run's state, the same object on every call: read from state.json on first use (an unreadable
        file is a RunStateError, exit 14, saying why), then held in memory; change it and `save`."""
        if self._state is None:
            self._state = self._read()
            self._written = _json(self._state)
        return self._state

    def _read(self) -> RunState:
        path = self.root / "state.json"
        try:
            data = input_files.read_bytes(path, input_files.RECORD_BYTES, what="a run's state")
            return RunState.from_dict(json.loads(data.decode("utf-8")))
        except (OSError, UnicodeDecodeError, ValueError, RecursionError, input_files.Refused) as err:
            why = unreadable_reason(err)
            problem = RunStateError(f"run {self.root.name}: {path} is unreadable ({why}); the run cannot be "
                                    "shown or resumed; start a new one")
            problem.reason = why
            raise problem from None

    def save(self, state: RunState | None = None) -> None:
        """A checkpoint: the held state (or `state`, held from now on) written to state.json atomically,
        when it differs from what the file holds."""
        if state is not None:
            self._state = state
        text = _json(self.state())
        if text == self._written:
            return
        tmp = self.root / "state.json.tmp"
        tmp.write_text(text)
        os.replace(tmp, self.root / "state.json")
        self._written = text

    def original(self) -> str:
        try:
            return _source(self.root / "original.cuh")
        except input_files.Refused as err:
            raise RunStateError(f"run {self.root.name}: {err}; the run cannot be resumed; start a new one") from None

    def add_candidate(self, source: str, meta: dict) -> int:
        n = len(list((self.root / "candidates").iterdir())) + 1
        folder = self.root / "candidates" / f"{n:03d}"
        folder.mkdir()
        (folder / "kernel.cuh").write_text(source)
        meta = {k: printable(v) if isinstance(v, str) else v for k, v in meta.items()}
        (folder / "meta.json").write_text(json.dumps(meta, indent=1))
        return n

    def save_verdict(self, n: int, verdict: Verdict) -> None:
        (self.root / "candidates" / f"{n:03d}" / "verdict.json").write_text(verdict.to_json())

    def candidate(self, n: int) -> tuple[str, dict, Verdict | None]:
        folder = self.root / "candidates" / f"{n:03d}"
        verdict = folder / "verdict.json"
        try:
            meta = json.loads(_record(folder / "meta.json"))
            return (_source(folder / "kernel.cuh"), meta if isinstance(meta, dict) else {},
                    Verdict.from_json(_record(verdict)) if verdict.exists() else None)
        except (OSError, UnicodeDecodeError, ValueError, TypeError, KeyError, AttributeError,
                input_files.Refused) as err:
            raise RunStateError(f"run {self.root.name}: candidate {n:03d} is unreadable "
                                f"({unreadable_reason(err)}) in {folder}") from None

    def baseline(self) -> Verdict | None:
        path = self.root / "baseline.json"
        try:
            return Verdict.from_json(_record(path)) if path.exists() else None
        except (ValueError, TypeError, KeyError, AttributeError, input_files.Refused) as err:
            raise RunStateError(f"run {self.root.name}: {path} is unreadable ({unreadable_reason(err)}); start a "
                                "new run") from None

    def save_baseline(self, verdict: Verdict) -> None:
        (self.root / "baseline.json").write_text(verdict.to_json())

    def lineage(self, n: int) -> list[tuple[int, dict]]:
        """The accepted candidates candidate `n` was built on, oldest first, ending with `n` itself: each
        (number, meta). A candidate's `base` in the history is the hash of the source it edited, so the
        chain is followed back to the original (every change a patch carries is named, not only the last)."""
        import hashlib

        history = self.state().history
        by_source: dict[str, int] = {}
        for entry in history:
            if entry.accepted:
                source = self.candidate(entry.n)[0]
                by_source.setdefault(hashlib.sha256(source.encode()).hexdigest(), entry.n)
        bases = {entry.n: entry.base for entry in history}
        chain, current, seen = [], n, set()
        while current is not None and current not in seen:
            seen.add(current)
            chain.append((current, self.candidate(current)[1]))
            current = by_source.get(bases.get(current) or "")
        return list(reversed(chain))

    def best_source(self) -> str:
        state = self.state()
        return self.original() if state.best is None else self.candidate(state.best)[0]

    @property
    def search_log(self) -> Path:
        """The offline parameter search's screenings, one line each (astra.optimize.offline.search_logger)."""
        return self.root / "search.log"

    @property
    def transcript(self) -> Path:
        return self.root / "transcript.jsonl"


def _source(path: Path) -> str:
    """A kernel source the run keeps (bounded as any source: astra.input_files)."""
    return input_files.read_text(path, input_files.SOURCE_BYTES, what="a kernel source")


def _record(path: Path) -> str:
    """A JSON record the run keeps (a verdict, a candidate's meta), its text (bounded: astra.input_files)."""
    return input_files.read_text(path, input_files.RECORD_BYTES, what="a JSON record")


def _json(state: RunState) -> str:
    return json.dumps(state.to_dict(), indent=1)


def unreadable_reason(err: BaseException) -> str:
    """A short reason a run file cannot be read (`truncated JSON at line 3`, `file missing`)."""
    if isinstance(err, json.JSONDecodeError):
        cut = err.pos >= len(err.doc.rstrip()) or err.msg.startswith("Unterminated string")
        what = "truncated JSON" if cut else "not JSON"
        return f"{what} at line {err.lineno}, column {err.colno}"
    if isinstance(err, FileNotFoundError):
        return "file missing"
    if isinstance(err, OSError):
        return err.strerror or str(err)
    if isinstance(err, UnicodeDecodeError):
        return f"not UTF-8 at byte {err.start}"
    if isinstance(err, input_files.Refused):
        return err.why
    return printable(str(err))[:120] or type(err).__name__


def list_runs() -> list[str]:
    """Run ids, oldest first: by their second, then kernel, then the number `create` appends to a second run of
    one kernel within the same second (numerically: -10 after -9)."""
    return sorted((p.name for p in paths.sub("runs").iterdir() if (p / "state.json").exists()), key=_run_order)


def _run_order(run_id: str) -> tuple[str, int]:
    base, _, suffix = run_id.rpartition("-")
    if base[:15].replace("-", "").isdigit() and suffix.isdigit() and base.count("-") >= 2:
        return base, int(suffix)
    return run_id, 0
