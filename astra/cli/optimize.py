"""Commands of the optimize loop: optimize, eval, runs, show."""

from __future__ import annotations

import json
import time

from astra.cli.common import check_output, check_tree_flags, tree_for_spec, write_text
from astra.cli.testing import check_llm_config
from astra.errors import AstraError
from astra.optimize.baseline_store import origin_text
from astra.optimize.driver import emit_best_patch, run_optimize
from astra.optimize.optimizer_eval import eval_executor, run_eval
from astra.optimize.options import OptimizeOptions
from astra.optimize.rundir import RunDir
from astra.report import run_text, table
from astra.report.run_text import readable_run
from astra.spec.resolve import resolve
from astra.text import one_line


def loop_options(args) -> OptimizeOptions:
    """The typed options of `optimize` and `eval` (the library never sees argparse)."""
    return OptimizeOptions(rounds=args.rounds, offline=args.offline, model=args.model, base_url=args.base_url,
                           budget_tokens=args.budget_tokens, budget_usd=args.budget_usd, wall_min=args.wall_min,
                           sanitizer=not args.no_sanitizer, sandbox=not args.no_sandbox, dry_run=args.dry_run,
                           quick_search=args.quick_search,
                           resume=getattr(args, "resume", None), agent=args.agent, agent_timeout_s=args.agent_timeout,
                           samples=args.samples, rebaseline=args.rebaseline)


def _printer(kind: str, data: dict) -> None:
    """The loop's events as lines; an event from an `astra eval` worker names its kernel (data["kernel"])."""
    stamp = time.strftime("%H:%M:%S") + (f" {data['kernel']}" if data.get("kernel") else "")
    if kind == "baseline":
        if data.get("how") == "reused":
            print(f"[{stamp}] {one_line(origin_text(data), 600)}", flush=True)
        else:
            why = f"; {one_line(data['why'], 300)}" if data.get("why") else ""
            print(f"[{stamp}] timing the original against itself (baseline profile{why})", flush=True)
    elif kind == "candidate":
        rationale = one_line(data.get("rationale") or "", 200)
        print(f"[{stamp}] #{data['n']:03d} {one_line(data['description'], 200)}"
              + (f"  [{rationale}]" if rationale else ""), flush=True)
    elif kind == "verdict":
        mark = "ACCEPTED" if data["accepted"] else "rejected"
        print(f"[{stamp}]      {mark}: {one_line(data['why'])}", flush=True)
    elif kind == "warning":
        print(f"[{stamp}] warning: {one_line(data['message'], 600)}", flush=True)
    elif kind == "stopped":
        print(f"[{stamp}] stopped: {one_line(data['reason'])}", flush=True)


def _finish(run, spec, t) -> None:
    from astra.report import run_html

    print(run_text.summary(run))
    print(f"report: {run_html.write(run)}")


def _check_config(args) -> None:
    """The built-in agents read $ASTRA_HOME/config.yaml unless --offline or --agent: refuse a bad one first."""
    if not args.offline and not args.agent:
        check_llm_config(args)


def cmd_optimize(args) -> int:
    opts = loop_options(args)
    _check_config(args)
    spec = resolve(args.name)
    t = tree_for_spec(args, str(spec.path))
    run, state = run_optimize(spec, t, opts, events=_printer)
    _finish(run, spec, t)
    if state.best is not None:
        print(emit_best_patch(run, spec, t, sanitizer_required=opts.sanitizer))
    return 0 if state.best is not None or opts.dry_run else 1


def cmd_eval(args) -> int:
    _check_config(args)
    if args.kernels is None:
        from astra.survey.targets import survey_targets

        names = survey_targets(args.top, args.survey)
        print(f"targets: the survey's top {len(names)} by recoverable time: {', '.join(names)}", flush=True)
    else:
        names = [n.strip() for n in args.kernels.split(",") if n.strip()]
    if not names:
        raise AstraError("--kernels: name at least one spec, e.g. --kernels rmsnorm,qknorm (see `astra spec-check`)")
    twice = sorted({n for n in names if names.count(n) > 1})
    if twice:
        raise AstraError(f"--kernels {args.kernels}: {', '.join(twice)} named more than once; name each spec once")
    specs = [resolve(n) for n in names]
    check_output(args.json)
    opts = loop_options(args)
    check_tree_flags(args)
    executor = eval_executor(args.ray, args.gpus, len(specs))
    if executor is not None:
        where = "the Ray cluster" if args.ray else "this host"
        each = "one CPU task each (a dry run only builds)" if opts.dry_run else "one GPU each"
        print(f"{len(specs)} kernel(s) at once, {each}, on {where} ({executor.gpus} GPU(s))", flush=True)
    try:
        result = run_eval(specs, opts, sglang_version=args.sglang, sglang_src=args.sglang_src, fresh=args.fresh,
                          executor=executor, events=_printer)
    finally:
        if executor is not None:
            executor.close()
    rows = result["rows"]

    def band(r: dict, name: str) -> str:
        b = r.get("bands", {}).get(name)
        return "-" if not b else f"{b['us_before']:.3g} -> {b['us_after']:.3g}"

    def correct(r: dict) -> str:
        return "ERROR" if r.get("error") else {True: "yes", False: "NO", None: "(original kept)"}[r["correct"]]

    print(table.render(["kernel", "lines changed", "us before", "us after", "decode us", "middle us", "prefill us",
                        "speedup", "worst shape", "correct", "candidates", "agent", "patch"],
                       [[r["kernel"], r["lines_changed"], r["us_before"], r["us_after"], band(r, "decode"),
                         band(r, "middle"), band(r, "prefill"), r["speedup"], r["worst_shape"] or "-",
                         correct(r), r["candidates"], r["agent"], _patch_cell(r.get("patch"))]
                        for r in rows]))
    for r in rows:
        if r.get("error"):
            print(f"{r['kernel']}: ERROR: {r['error']}")
    mean = result["geomean_speedup"]
    print(f"average speedup (geomean over kernels): {'x%.3f' % mean if mean else 'n/a (nothing timed)'}; "
          "the Astra paper reports 1.32x (o4-mini, five rounds, simplified kernels)")
    print(throughput_text(result))
    write_text(args.json, json.dumps(result, indent=1))
    if result["failed"]:
        print(f"{len(result['failed'])} kernel(s) failed: {', '.join(result['failed'])} (a re-run continues them)")
    return 1 if result["failed"] else 0


def throughput_text(result: dict) -> str:
    """'judged 40 candidate(s) in 1800 s: 80.0 per hour (the runs hold 52 in all)': the candidates judged during
    this evaluation (not those of runs it reused or resumed) per hour of its wall time."""
    rate = result["judged_per_hour"]
    return (f"judged {result['judged']} candidate(s) in {result['wall_s']:.0f} s: "
            + (f"{rate:.1f} per hour" if rate is not None else "n/a per hour")
            + (f" (the runs hold {result['candidates']} in all)" if result["candidates"] != result["judged"] else ""))


def _patch_cell(text: str | None) -> str:
    if not text:
        return "-"
    return "refused" if "not emitted" in text else "yes"


def cmd_runs(args) -> int:
    from astra import paths

    text = run_text.runs_table()
    print(text if text is not None else f"no runs under {paths.sub('runs')}")
    return 0


def cmd_show(args) -> int:
    from astra import paths

    root = paths.sub("runs") / args.run
    if "/" not in args.run and args.run.strip(".") and (root / "state.json").exists():
        readable_run(root)  # a FIFO or a link to /dev/zero as state.json: one line, not a hang
    run = RunDir.open(args.run)
    if args.html:
        from astra.report import run_html

        print(run_html.write(run))
    elif args.json:
        print(json.dumps({"state": run.state().to_dict()}, indent=1))
    else:
        print(run_text.summary(run))
    return 0
