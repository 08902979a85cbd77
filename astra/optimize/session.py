"""One optimize run wired to the harness: options, the agent rule, evaluators, the loop, the patch.

Library code: `run_optimize(spec, tree, OptimizeOptions(...))`; the CLI only builds the options.
"""

from __future__ import annotations

import math
import os
import time
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Callable

from astra import paths
from astra.errors import AstraError, RunStateError, SandboxMissing
from astra.optimize.loop import Budget, mark_stopped, run_loop
from astra.optimize.offline import OfflineAgent
from astra.optimize.rundir import HistoryEntry, RunDir, RunState
from astra.sglang.tree import SglangTree
from astra.spec import jobs
from astra.spec.model import KernelSpec
from astra.spec.source_check import require_same_source
from astra.verify.runner import require_gpu, timeout_for
from harness import Options, Verdict, build_many, run_job, verified_faster, verify_job
from harness.sandbox import decide as sandbox_decision

Printer = Callable[[str], None]


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
    dry_run: bool = False  # no GPU: build every candidate with nvcc, verify none
    quick_search: bool = False  # search on the timed dtype; verify the best on the full suite at the end
    resume: str | None = None  # a run id to continue
    agent: str | None = None  # "exec:CMD": a command edits the candidate each round (astra.optimize.exec_agent)
    agent_timeout_s: float = 900.0  # the exec agent's time limit per round
    samples: int = 1  # the LLM coder's candidates per round, asked for at once

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


def llm_config(opts: OptimizeOptions):
    """The LLM settings from flags > $ASTRA_HOME/config.yaml > environment (astra.optimize.llm)."""
    from astra.optimize import llm

    flags = {"base_url": opts.base_url, "model": opts.model, "budget_tokens": opts.budget_tokens,
             "budget_usd": opts.budget_usd}
    return llm.resolve_config({k: v for k, v in flags.items() if v is not None})


def agent_kind(opts: OptimizeOptions) -> str:
    """The one rule choosing the agent: `--offline` forces the search agent; otherwise a model named by
    a flag, the config file or $ASTRA_MODEL selects the LLM agent; with none, the search agent. `--agent
    exec:CMD` (which refuses --offline and --model) runs a command as the agent."""
    if opts.agent:
        return opts.agent.strip()
    if opts.offline:
        return "offline"
    cfg = llm_config(opts)
    return f"llm:{cfg.model}" if cfg.model else "offline"


def make_agent(opts: OptimizeOptions, spec: KernelSpec, tree: SglangTree, run: RunDir):
    if opts.agent:
        from astra.optimize.exec_agent import ExecAgent, exec_command

        return ExecAgent(exec_command(opts.agent), spec, opts.agent_timeout_s, tree=tree)
    if agent_kind(opts) == "offline":
        return OfflineAgent(spec.kernel_file, tree.csrc_dir, [str(tree.include_dir)],
                            entries=[w["entry"] for w in spec.raw["build"].get("wrappers", []) if "entry" in w])
    from astra.optimize import llm
    from astra.optimize.llm_agent import LLMAgent

    return LLMAgent(llm.Client(llm_config(opts), transcript=run.transcript), spec, tree, samples=opts.samples)


def evaluation_options(kind: str, sanitizer: bool = True) -> Options:
    """The harness options of each kind of evaluation in a run:
    - "original": the baseline, timed without its outputs phase. The probe (or the review) already
      established that the original runs correctly and deterministically on these cases; its checks
      against itself took most of a baseline (on the H100, 36 of 45 s for channel_rmsnorm_finish_silu).
    - "screen": a point of the offline search on a rung's few shapes: one seed, no large/small/extreme
      trials, graph view only (the search ranks by the graph geomean), no sanitizer. A screened point is
      a guess; the survivors are verified in full like any candidate before they count.
    - "candidate": the full verification (every trial, both views, compute-sanitizer unless disabled)."""
    if kind == "original":
        return Options(sanitizer=False, outputs_checked=False)
    if kind == "screen":
        return Options(sanitizer=False, seeds=[0], extra_trials=False, modes=["graph"])
    if kind == "candidate":
        return Options(sanitizer=sanitizer)
    raise ValueError(f"unknown evaluation kind {kind!r}")


def harness_evaluator(spec: KernelSpec, tree: SglangTree, sanitizer: bool = True, extra_shapes=lambda: [],
                      quick: bool = False, sandbox: bool = True):
    """Each candidate in its own worker against the original (GPU); `extra_shapes()` are the testing
    role's additions to the spec's suite. `quick`: the search checks the timed dtype only (fewer
    builds and checks); the run's best is then verified on the full suite before it counts."""

    def evaluate(source: str, label: str, *, full: bool = False, cases: list[str] | None = None,
                 gpu: int | None = None) -> Verdict:
        """`cases`: screen on those case ids only, without the sanitizer (the offline search's rungs);
        `gpu`: the worker sees that GPU only (the loop evaluates a round's candidates one per GPU)."""
        is_original = label == "original"
        kind = "original" if is_original else "screen" if cases is not None else "candidate"
        job = jobs.make_job(spec, tree, candidate_source=None if is_original else source, label=label,
                            options=evaluation_options(kind, sanitizer), extra_shapes=extra_shapes())
        job.options.sandbox = sandbox
        if quick and not full:
            job.cases = [c for c in job.cases if c.dtype == spec.dtypes[0]]
        if cases is not None:
            job.cases = [c for c in job.cases if c.id in set(cases)]
        runner = run_job if is_original else verify_job
        env = None if gpu is None else {**os.environ, "CUDA_VISIBLE_DEVICES": str(gpu)}
        return runner(job, timeout_s=timeout_for(job), env=env)

    evaluate.gpus = _visible_gpus()
    return evaluate


def _visible_gpus() -> list[int]:
    """Indices of this host's GPUs as CUDA numbers them (honouring CUDA_VISIBLE_DEVICES); [] without one."""
    try:
        import torch

        count = torch.cuda.device_count() if torch.cuda.is_available() else 0
    except ImportError:
        return []
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    if visible:
        ids = [v.strip() for v in visible.split(",") if v.strip()]
        return [int(v) for v in ids[:count] if v.isdigit()]
    return list(range(count))


def screening(spec: KernelSpec, tree: SglangTree, evaluate):
    """(screen, prebuild) for the offline search: `screen(source, label, case_ids)` is `evaluate` on those
    cases; `prebuild(sources, case_ids, base)` builds the candidate variants those sources (and the search's
    base) need on every CPU core into the cache the workers read, so a rung's builds run side by side
    instead of one per worker, and returns the sources whose every built variant is the base's machine
    code (astra.optimize.machine_code): screening those could only measure x1.000. The base is built as
    a candidate too, so both sit in an overlay folder of the same length and their modules compare."""
    from astra.optimize.machine_code import code_digest

    variants_of = {c.id: c.variant for c in jobs.make_job(spec, tree, label="screen").cases}

    def screen(source: str, label: str, cases: list[str]) -> Verdict:
        return evaluate(source, label, cases=cases)

    def prebuild(sources: list[str], cases: list[str], base: str | None = None) -> set[str]:
        wanted = {variants_of.get(c) for c in cases}
        every = [base, *sources] if base is not None else list(sources)
        owners, requests = [], []
        for i, source in enumerate(every):
            for side, key, req in jobs.spec_build_requests(spec, tree, candidate_source=source):
                if side == "cand" and key in wanted:
                    owners.append((i, key))
                    requests.append(req)
        digests: dict[int, dict[str, str | None]] = {}
        for (i, key), result in zip(owners, build_many(requests, paths.sub("builds"))):
            digests.setdefault(i, {})[key] = code_digest(result.so_path) if result.ok and result.so_path else None
        if base is None or not digests.get(0):
            return set()
        reference = digests[0]
        return {every[i] for i, found in digests.items() if i > 0 and found == reference
                and all(d is not None for d in found.values())}

    return screen, prebuild


def search_logger(run: RunDir, say: Printer):
    """Each line of the parameter search's log, as it is written: appended to the run's search.log (with
    the time) and printed, so a user sees what was screened and why it lost."""

    def on_line(line: str) -> None:
        try:
            with run.search_log.open("a", encoding="utf-8") as out:
                out.write(f"[{time.strftime('%Y-%m-%dT%H:%M:%S')}] {line}\n")
        except OSError as err:  # a full disk loses the log line, not the run
            say(f"warning: cannot write {run.search_log}: {err.strerror or err}")
        say(f"[{time.strftime('%H:%M:%S')}]      search: {line}")

    return on_line


def build_only_evaluator(spec: KernelSpec, tree: SglangTree):
    """No GPU: build each candidate with nvcc exactly as SGLang would (the same requests the worker
    builds, `jobs.spec_build_requests`); nothing is verified."""

    def evaluate(source: str, label: str, **_) -> Verdict:
        requests = jobs.spec_build_requests(spec, tree, candidate_source=None if label == "original" else source)
        side = "orig" if label == "original" else "cand"
        chosen = [req for s, _, req in requests if s == side][:1]
        res = build_many(chosen, paths.sub("builds"))[0]
        regs = max((r.registers or 0 for r in res.resources), default=0)
        spills = sum(r.spills for r in res.resources)
        reason = (f"built in {res.seconds:.1f}s, max {regs} registers, {spills} B spills; not verified (no GPU)"
                  if res.ok else (res.error or "build failed").splitlines()[0])
        return Verdict(status="built" if res.ok else "build_failed", reason=reason, correct=False, faster=False,
                       name=spec.name, candidate_label=label,
                       builds=[{"side": side, "ok": res.ok, "error": res.error,
                                "resources": [r.__dict__ for r in res.resources]}])

    return evaluate


def confirm_best(run: RunDir, evaluate, events: Printer = print) -> bool:
    """Re-verify the best candidate of a quick search on the full suite; on failure the run falls
    back to the original (a quick search never ships what the full suite rejects)."""
    state = run.state()
    if state.best is None:
        return True
    source, meta, _ = run.candidate(state.best)
    verdict = evaluate(source, meta.get("name", "best"), full=True)
    run.save_verdict(state.best, verdict)
    decision = verified_faster(verdict)
    events(f"full-suite verification of #{state.best:03d}: {'passed' if decision.ok else 'FAILED'}: "
           f"{decision.reason}")
    if not decision.ok:
        state.history.append(HistoryEntry(n=state.best, round=state.round, name=meta.get("name", "best"),
                                          status=verdict.status, score=0.0, accepted=False,
                                          why=f"full suite: {decision.reason}"))
        state.best, state.best_score = None, 1.0
        run.save(state)
    return decision.ok


def run_identity(spec: KernelSpec, opts: OptimizeOptions) -> dict:
    """What a run's result depends on beyond kernel, SGLang version, agent and source: the spec's bytes
    (its cases, floors and tolerances), whether it verified with the sanitizer and on the full suite,
    and whether it ran on a GPU at all. `astra eval` reuses a run only when all of it matches."""
    from astra.spec.resolve import spec_sha256

    return {"spec_sha256": spec_sha256(spec.path), "sanitizer": opts.sanitizer, "quick_search": opts.quick_search,
            "dry_run": opts.dry_run}


def run_optimize(spec: KernelSpec, tree: SglangTree, opts: OptimizeOptions, *, events=None,
                 say: Printer = print) -> tuple[RunDir, RunState]:
    """One optimize run of `spec` (or its resumption): agent, evaluator, budget, loop, report."""
    source = (tree.csrc_dir / spec.kernel_file).read_text()
    if opts.resume:
        run = _resume(opts.resume, spec)
    else:
        run = RunDir.create(spec.name, tree.version, agent_kind(opts), source)
        state = run.state()
        state.identity = run_identity(spec, opts)
        run.save(state)
    try:
        return run, _run(run, spec, tree, opts, events, say)
    except KeyboardInterrupt:
        mark_stopped(run, "interrupted (Ctrl-C)")
        raise
    except BaseException as err:
        from astra.report.safe_text import one_line

        mark_stopped(run, f"failed: {one_line(err, 300) or type(err).__name__}")
        raise


def _resume(run_id: str, spec: KernelSpec) -> RunDir:
    """A run to continue: of this very kernel; its stop reason is cleared so the loop goes on."""
    run = RunDir.open(run_id)
    state = run.state()
    if state.kernel != spec.name:
        raise RunStateError(f"--resume {run_id}: that run optimizes {state.kernel!r}, not {spec.name!r}; "
                            f"resume it with `astra optimize {state.kernel} --resume {run_id}`")
    if state.stopped is not None:
        state.stopped = None
        run.save(state)
    return run


def _run(run: RunDir, spec: KernelSpec, tree: SglangTree, opts: OptimizeOptions, events, say: Printer) -> RunState:
    agent = make_agent(opts, spec, tree, run)
    require_same_source(spec, tree)  # candidates are edits of, and verified against, the spec's kernel
    spent = run.state()
    client = getattr(agent, "client", None)
    if client is not None and hasattr(client, "carry"):
        client.carry(spent.tokens, spent.cost_usd)  # budgets count what earlier sessions of this run spent
    if opts.dry_run:
        evaluate = build_only_evaluator(spec, tree)
    else:
        try:
            require_gpu()
        except AstraError as err:
            raise AstraError(f"{err} To see what the agent would try, with every candidate built by nvcc: "
                             "add --dry-run.", exit_code=err.exit_code) from None
        refusal = sandbox_decision(opts.sandbox)[1]
        if refusal:  # every candidate would be refused: stop before the agent spends anything
            raise SandboxMissing(refusal)
        evaluate = harness_evaluator(spec, tree, sanitizer=opts.sanitizer,
                                     extra_shapes=lambda: getattr(agent, "extra_shapes", []), quick=opts.quick_search,
                                     sandbox=opts.sandbox)
        if isinstance(agent, OfflineAgent):  # the parameter search screens on the GPU before proposing
            agent.screen, agent.prebuild = screening(spec, tree, evaluate)
            agent.timed_dtype = spec.dtypes[0]
            agent.on_search_line = search_logger(run, say)
    say(f"run {run.root.name}: {spec.name} from SGLang {tree.version}, agent {agent.name}; directory {run.root}")
    state = run_loop(run, agent, evaluate, opts.budget(), events=events or (lambda kind, data: None))
    if opts.dry_run:
        return state
    with held_open(run):  # killed during these steps, the run is continued, not taken as finished
        from astra.optimize.band_dispatch import try_band_dispatch

        # a small-token winner and a large-token one become one candidate, judged like any
        try_band_dispatch(run, spec, tree, evaluate, say)
        if opts.quick_search:
            confirm_best(run, evaluate, say)
    return run.state()


@contextmanager
def held_open(run: RunDir):
    """The run's stop reason is cleared while the block runs and put back after it, so a run killed in
    the block reads as cut off (`astra eval` continues it) and one whose block raised reads as failed."""
    state = run.state()
    reason, state.stopped = state.stopped, None
    run.save(state)
    yield
    state = run.state()
    state.stopped = reason
    run.save(state)


def found_by(run: RunDir, n: int, agent: str) -> str:
    """The patch's account of how candidate `n` was found: every accepted step from the original, in order
    (a candidate built on an earlier winner carries that winner's change too)."""
    chain = run.lineage(n)
    scores = {entry.n: entry.score for entry in run.state().history}
    if len(chain) <= 1:
        return f"Found by `astra optimize` ({agent}): {chain[-1][1].get('description', '') if chain else ''}."
    steps = "\n".join(f"{i}. {meta.get('description', '')}" + (f" (verified x{scores[k]:.3f} overall)" if scores.get(k) else "")
                      for i, (k, meta) in enumerate(chain, 1))
    return f"Found by `astra optimize` ({agent}) in {len(chain)} accepted steps, each built on the one before:\n{steps}"


def emit_best_patch(run: RunDir, spec: KernelSpec, tree: SglangTree, *, sanitizer_required: bool = True) -> str:
    """The run's best verified candidate as patches in the run directory (the emitter refuses what
    does not meet its bar, and says why). `sanitizer_required=False` for a run with --no-sanitizer
    (the patch then says compute-sanitizer was not run)."""
    from astra.errors import NotAnAstraPatch
    from astra.patches.emit import emit_patch

    state = run.state()
    source, meta, verdict = run.candidate(state.best)
    if verdict is None:
        return "patch: not emitted: the best candidate has no verdict"
    try:
        result = emit_patch(spec, tree, source, verdict, run.root / "patches", sanitizer_required=sanitizer_required,
                            why=found_by(run, state.best, state.agent))
    except NotAnAstraPatch as err:
        return f"patch: not emitted: {err}"
    if result.refused:
        return f"patch: not emitted: {result.refused}"
    return f"patch: {result.repo_patch}\n       {result.package_patch}"
