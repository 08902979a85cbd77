"""One optimize run from start to patch: the run directory (new or resumed), the evaluator, the agent
(astra.optimize.agent_registry), the loop, the steps after it (band dispatch, a quick search's full-suite
check) and the patch of the best.

Library code: `run_optimize(spec, tree, OptimizeOptions(...))`; the CLI only builds the options.
"""

from __future__ import annotations

import time
from contextlib import contextmanager
from typing import Callable

from astra import input_files
from astra.errors import AstraError, RunStateError, SandboxMissing
from astra.optimize.agent_registry import AgentSetup, agent_kind, make_agent
from astra.optimize.baseline_store import BaselineStore
from astra.optimize.evaluator import BuildOnlyEvaluator, Evaluator, HarnessEvaluator
from astra.optimize.loop import mark_stopped, run_loop
from astra.optimize.options import OptimizeOptions
from astra.optimize.rundir import HistoryEntry, RunDir, RunState
from astra.sglang.tree import SglangTree
from astra.spec.model import KernelSpec
from astra.spec.source_check import require_same_source
from astra.verify.runner import require_gpu
from harness import verified_faster
from harness.sandbox import decide as sandbox_decision
from harness.worker.children import stop_reason

Printer = Callable[[str], None]


def run_optimize(spec: KernelSpec, tree: SglangTree, opts: OptimizeOptions, *, events=None,
                 say: Printer = print) -> tuple[RunDir, RunState]:
    """One optimize run of `spec` (or its resumption): agent, evaluator, budget, loop, report."""
    source = input_files.read_text(tree.csrc_dir / spec.kernel_file, input_files.SOURCE_BYTES, what="a kernel source")
    if opts.resume:
        run = _resume(opts.resume, spec)
    else:
        run = RunDir.create(spec.name, tree.version, agent_kind(opts), source)
        state = run.state()
        state.identity = run_identity(spec, opts)
        run.save(state)
    began = time.monotonic()
    try:
        return run, _run(run, spec, tree, opts, events, say)
    except KeyboardInterrupt as stop:  # Ctrl-C, SIGTERM or SIGHUP (harness.worker.children)
        mark_stopped(run, stop_reason(stop))
        raise
    except BaseException as err:
        from astra.text import one_line

        mark_stopped(run, f"failed: {one_line(err, 300) or type(err).__name__}")
        raise
    finally:
        _add_wall(run, time.monotonic() - began)


def _add_wall(run: RunDir, seconds: float) -> None:
    """Add this session's seconds to the run's `wall_s` (its candidates judged per hour)."""
    try:
        state = run.state()
    except AstraError:
        return
    state.wall_s += seconds
    run.save(state)


def _resume(run_id: str, spec: KernelSpec) -> RunDir:
    """A run to continue: of this very kernel; its stop reason is cleared so the loop goes on."""
    run = RunDir.open(run_id)  # reads state.json, once
    state = run.state()
    if state.kernel != spec.name:
        raise RunStateError(f"--resume {run_id}: that run optimizes {state.kernel!r}, not {spec.name!r}; "
                            f"resume it with `astra optimize {state.kernel} --resume {run_id}`")
    if state.stopped is not None:
        state.stopped = None
        run.save(state)
    return run


def make_evaluator(spec: KernelSpec, tree: SglangTree, opts: OptimizeOptions) -> Evaluator:
    """The run's judge: nvcc builds only in a dry run, else each candidate in its own GPU worker (the
    timed dtype only in a quick search). Building it needs no GPU; `_run` checks for one."""
    if opts.dry_run:
        return BuildOnlyEvaluator(spec, tree)
    return HarnessEvaluator(spec, tree, sanitizer=opts.sanitizer, quick=opts.quick_search, sandbox=opts.sandbox)


def _run(run: RunDir, spec: KernelSpec, tree: SglangTree, opts: OptimizeOptions, events, say: Printer) -> RunState:
    evaluator = make_evaluator(spec, tree, opts)
    agent = make_agent(AgentSetup(spec, tree, run, evaluator, opts, say))
    require_same_source(spec, tree)  # candidates are edits of, and verified against, the spec's kernel
    if not opts.dry_run:
        try:
            require_gpu()
        except AstraError as err:
            raise AstraError(f"{err} To see what the agent would try, with every candidate built by nvcc: "
                             "add --dry-run.", exit_code=err.exit_code) from None
        refusal = sandbox_decision(opts.sandbox)[1]
        if refusal:  # every candidate would be refused: stop before the agent spends anything
            raise SandboxMissing(refusal)
    say(f"run {run.root.name}: {spec.name} from SGLang {tree.version}, agent {agent.name}; directory {run.root}")
    state = run_loop(run, agent, evaluator, opts.budget(), events=events or (lambda kind, data: None),
                     baselines=baseline_store(opts))
    if opts.dry_run:
        return state
    with held_open(run):  # killed during these steps, the run is continued, not taken as finished
        from astra.optimize.band_dispatch import try_band_dispatch

        # a small-token winner and a large-token one become one candidate, judged like any
        try_band_dispatch(run, spec, tree, evaluator, say)
        if opts.quick_search:
            confirm_best(run, evaluator, say)
    return run.state()


def baseline_store(opts: OptimizeOptions) -> BaselineStore | None:
    """Where the run looks up and stores the original's baseline ($ASTRA_HOME/baselines); None in a dry run
    (nothing is timed)."""
    return None if opts.dry_run else BaselineStore.default(rebaseline=opts.rebaseline)


@contextmanager
def held_open(run: RunDir):
    """The run's stop reason is cleared while the block runs and put back after it, so a run killed in
    the block reads as cut off (`astra eval` continues it) and one whose block raised reads as failed."""
    state = run.state()
    reason, state.stopped = state.stopped, None
    run.save(state)
    yield
    state.stopped = reason
    run.save(state)


def confirm_best(run: RunDir, evaluator: Evaluator, events: Printer = print) -> bool:
    """Re-verify the best candidate of a quick search on the full suite; on failure the run falls
    back to the original (a quick search never ships what the full suite rejects)."""
    state = run.state()
    if state.best is None:
        return True
    source, meta, _ = run.candidate(state.best)
    verdict = evaluator.full(source, meta.get("name", "best"))
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
