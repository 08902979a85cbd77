"""`astra optimize`, `astra runs`, `astra show`: the loop wired to the harness and the terminal."""

from __future__ import annotations

import json
import time

from astra import jobs, paths, spec as spec_mod, table
from astra.agents.loop import Budget, band_summary, band_wins_line, run_loop
from astra.agents.offline import OfflineAgent
from astra.agents.rundir import RunDir, list_runs
from astra.errors import AstraError
from astra.sglang_tree import SglangTree


def harness_evaluator(spec, tree: SglangTree, sanitizer: bool = True, extra_shapes=lambda: [],
                      quick: bool = False):
    """Each candidate in its own worker against the original (GPU); `extra_shapes()` are the testing
    role's additions to the spec's suite. `quick`: the search checks the timed dtype only (fewer
    builds and checks); the run's best is then verified on the full suite before it counts."""
    from astra.check_cmd import timeout_for
    from harness.job import Options
    from harness.worker import run_job, verify_job

    def evaluate(source: str, label: str, *, full: bool = False) -> dict:
        is_original = label == "original"
        job = jobs.make_job(spec, tree, candidate_source=None if is_original else source, label=label,
                            options=Options(sanitizer=sanitizer and not is_original), extra_shapes=extra_shapes())
        if quick and not full:
            job.cases = [c for c in job.cases if c.dtype == spec.dtypes[0]]
        runner = run_job if is_original else verify_job
        return runner(job, timeout_s=timeout_for(job))

    return evaluate


def confirm_best(run: RunDir, evaluate, events=print) -> bool:
    """Re-verify the best candidate of a quick search on the full suite; on failure the run falls
    back to the original (a quick search never ships what the full suite rejects)."""
    from astra.agents.loop import Budget, accepted

    state = run.state()
    if state.best is None:
        return True
    source, meta, _ = run.candidate(state.best)
    verdict = evaluate(source, meta.get("name", "best"), full=True)
    run.save_verdict(state.best, verdict)
    ok, why = accepted(verdict, None, Budget())
    events(f"full-suite verification of #{state.best:03d}: {'passed' if ok else 'FAILED'}: {why}")
    if not ok:
        state.history.append({"n": state.best, "round": state.round, "name": meta.get("name"), "status":
                              verdict.get("status"), "score": 0.0, "accepted": False,
                              "why": f"full suite: {why}"})
        state.best, state.best_score = None, 1.0
        run.save(state)
    return ok


def build_only_evaluator(spec, tree: SglangTree):
    """No GPU: build each candidate with nvcc exactly as SGLang would; nothing is verified."""
    from harness.build import BuildRequest, build

    case_list, variants = jobs.cases(spec)
    variant = variants[case_list[0].variant]
    b = spec.raw["build"]

    def evaluate(source: str, label: str) -> dict:
        req = BuildRequest(name=f"{spec.module}-dry", source_root=str(tree.csrc_dir),
                           include_dirs=[str(tree.include_dir)], cuda_files=list(b.get("cuda_files", [])),
                           cpp_files=list(b.get("cpp_files", [])),
                           cuda_wrappers=[tuple(w) for w in variant.cuda_wrappers],
                           extra_cuda_cflags=variant.extra_cuda_cflags, arch="90a",
                           overrides={} if label == "original" else {spec.kernel_file: source})
        res = build(req, paths.sub("builds"))
        regs = max((r.registers for r in res.resources), default=0)
        spills = sum(r.spills for r in res.resources)
        return {"status": "built" if res.ok else "build_failed", "correct": False,
                "reason": (f"built in {res.seconds:.1f}s, max {regs} registers, {spills} B spills; not verified "
                           "(no GPU)") if res.ok else (res.error or "build failed").splitlines()[0],
                "resources": [r.__dict__ for r in res.resources]}

    return evaluate


def optimize(args, tree: SglangTree) -> int:
    spec = spec_mod.load(args.name)
    run, state = run_optimize(args, spec, tree)
    if state.best is not None:
        print(emit_best_patch(run, spec, tree))
    return 0 if state.best is not None or args.dry_run else 1


def run_optimize(args, spec, tree: SglangTree) -> tuple[RunDir, object]:
    """One optimize run of `spec` (or its resumption): agent, evaluator, budget, loop, report."""
    source = (tree.csrc_dir / spec.kernel_file).read_text()
    if getattr(args, "resume", None):
        run = RunDir.open(args.resume)
    else:
        run = RunDir.create(spec.name, tree.version, "offline" if _offline(args) else f"llm:{args.model}", source)
    agent = _agent(args, spec, tree, run)
    if args.dry_run:
        evaluate = build_only_evaluator(spec, tree)
    else:
        from astra.check_cmd import require_gpu

        try:
            require_gpu()
        except AstraError as err:
            raise AstraError(f"{err} To see what the offline agent would try, with every candidate built by "
                             f"nvcc: `astra {args.command} ... --dry-run`.", exit_code=err.exit_code) from None
        evaluate = harness_evaluator(spec, tree, sanitizer=not args.no_sanitizer,
                                     extra_shapes=lambda: getattr(agent, "extra_shapes", []),
                                     quick=getattr(args, "quick_search", False))
    budget = Budget(rounds=args.rounds, wall_s=args.wall_min * 60, tokens=args.budget_tokens,
                    cost_usd=args.budget_usd, patience=1 if args.dry_run else 2)
    print(f"run {run.root.name}: {spec.name} from SGLang {tree.version}, agent {agent.name}; directory {run.root}")
    state = run_loop(run, agent, evaluate, budget, events=_printer(agent))
    if getattr(args, "quick_search", False) and not args.dry_run:
        confirm_best(run, evaluate)
        state = run.state()
    print(summary(run))
    from astra import run_report

    print(f"report: {run_report.write(run)}")
    return run, state


def emit_best_patch(run: RunDir, spec, tree: SglangTree) -> str:
    """The run's best verified candidate as patches in the run directory (the emitter refuses what
    does not meet its bar, and says why)."""
    from astra.patch import emit_patch

    source, meta, verdict = run.candidate(run.state().best)
    result = emit_patch(spec, tree, source, verdict or {}, run.root / "patches",
                        why=f"Found by `astra optimize` ({run.state().agent}): {meta.get('description', '')}.")
    if result.refused:
        return f"patch: not emitted: {result.refused}"
    return f"patch: {result.repo_patch}\n       {result.package_patch}"


def _offline(args) -> bool:
    return args.offline or not (args.model or args.base_url)


def _agent(args, spec, tree: SglangTree, run: RunDir):
    if _offline(args):
        return OfflineAgent(spec.kernel_file, tree.csrc_dir, [str(tree.include_dir)])
    from astra.agents.llm_agent import LLMAgent

    return LLMAgent.from_args(args, spec, tree, run)


def _printer(agent):
    def show(kind: str, data: dict) -> None:
        stamp = time.strftime("%H:%M:%S")
        if kind == "baseline":
            print(f"[{stamp}] timing the original against itself (baseline profile)", flush=True)
        elif kind == "candidate":
            rationale = getattr(agent, "rationale", "")
            print(f"[{stamp}] #{data['n']:03d} {data['description']}" + (f"  [{rationale}]" if rationale else ""),
                  flush=True)
        elif kind == "verdict":
            mark = "ACCEPTED" if data["accepted"] else "rejected"
            print(f"[{stamp}]      {mark}: {data['why']}", flush=True)
        elif kind == "stopped":
            print(f"[{stamp}] stopped: {data['reason']}", flush=True)
    return show


def summary(run: RunDir) -> str:
    state = run.state()
    best = run.candidate(state.best)[2] if state.best else None
    rows = [[h["n"], h["round"], h["name"], h["status"], h.get("score") or None, "yes" if h["accepted"] else "",
             h["why"][:60]] for h in state.history]
    out = [table.render(["#", "round", "change", "verdict", "x (graph, all)", "kept", "why"], rows)]
    if best:
        bands = band_summary(best)
        out.append("best: #%03d %s; speedup per band (graph): %s" % (
            state.best, run.candidate(state.best)[1]["description"],
            ", ".join(f"{b} x{v:.3f}" for b, v in bands.items())))
    else:
        out.append("best: the original (no candidate was verified faster)")
    out.append(band_wins_line(run))
    out.append(f"stopped: {state.stopped}; tokens {state.tokens}, cost ${state.cost_usd:.4f}; run directory {run.root}")
    return "\n".join(out)


def runs(args) -> int:
    names = list_runs()
    if not names:
        print(f"no runs under {paths.sub('runs')}")
        return 0
    rows = []
    for name in names:
        s = RunDir.open(name).state()
        rows.append([name, s.kernel, s.agent, len(s.history), s.best or "-", round(s.best_score, 3), s.stopped or "running"])
    print(table.render(["run", "kernel", "agent", "candidates", "best", "x", "state"], rows))
    return 0


def show(args) -> int:
    run = RunDir.open(args.run)
    if args.html:
        from astra import run_report

        print(run_report.write(run))
    elif args.json:
        print(json.dumps({"state": run.state().__dict__}, indent=1))
    else:
        print(summary(run))
    return 0
