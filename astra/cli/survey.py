"""`astra survey`: bench every selected spec on its suite (resumable store) and rank the kernels by the time
they leave above their practical floor; `--report-only` ranks what a store holds, with no GPU."""

from __future__ import annotations

import math
from pathlib import Path

from astra.cli.common import check_output, check_output_dir, write_text
from astra.errors import AstraError, BadInput
from astra.sglang import tree as sglang_tree
from astra.survey import bench, mixes, rank, report, run, summary
from astra.survey.store import Store, default_label, latest, slug, surveys_dir
from astra.verify import runner


def _say(line: str) -> None:
    print(line, flush=True)


def _check_flags(args) -> None:
    if args.top is not None and args.top < 1:
        raise BadInput(f"--top {args.top}: give a positive number of kernels to show")
    if args.budget_ms is not None and not 0 < args.budget_ms < math.inf:
        raise BadInput(f"--budget-ms {args.budget_ms}: must be a positive number of milliseconds")
    _modes(args)
    for flag, value in (("--sglang", args.sglang), ("--sglang-src", args.sglang_src), ("--out", args.out),
                        ("--mix", args.mix)):
        if value is not None and not value.strip():
            raise BadInput(f"{flag}: empty; give a value, or leave it out")
    if args.sglang and args.sglang_src:
        raise BadInput("give either --sglang VERSION or --sglang-src PATH, not both")
    if args.report_only and args.force:
        raise BadInput("--report-only benches nothing; --force has nothing to redo (leave one out)")
    check_output(args.json)
    check_output_dir(args.report, "--report")
    check_output_dir(args.out, "--out")


def _modes(args) -> tuple[str, ...]:
    """--modes as the views to bench: graph, cold or both, each once."""
    modes = tuple(dict.fromkeys(m.strip() for m in (args.modes or "").split(",") if m.strip()))
    wrong = [m for m in modes if m not in bench.VIEWS]
    if not modes or wrong:
        raise BadInput(f"--modes {args.modes!r}: give graph, cold or graph,cold")
    if args.report_only and modes != bench.VIEWS:
        raise BadInput("--report-only benches nothing; --modes has nothing to choose (leave it out)")
    return modes


def _report_store(args) -> Store:
    """--out, else the latest survey (of the named SGLang version, when one is named)."""
    if args.out:
        if not Path(args.out).is_dir():
            raise BadInput(f"--out {args.out}: no such survey directory; run `astra survey` on a GPU machine first")
        return Store(Path(args.out))
    prefix = ""
    if args.sglang or args.sglang_src:
        version = args.sglang or sglang_tree.from_source(Path(args.sglang_src)).version
        prefix = f"sglang-{slug(version)}-"
    found = latest(prefix)
    if found is None:
        raise BadInput(f"--report-only: no survey under {surveys_dir()}" + (f" for {prefix[:-1]}" if prefix else "")
                       + "; run `astra survey --all` on a GPU machine first, or give --out DIR")
    return Store(found)


def cmd_survey(args) -> int:
    _check_flags(args)
    mix = mixes.load_mix(args.mix)
    failed: list[str] = []
    if args.report_only:
        store = _report_store(args)
        records = store.records()
        if args.names:
            missing = [n for n in args.names if n not in records]
            if missing:
                raise BadInput(f"--report-only: {store.root} has no record of {', '.join(missing)}; it has "
                               f"{', '.join(records) or 'none'}")
            records = {n: records[n] for n in args.names}
        if not records:
            why = f" ({'; '.join(store.problems[:3])})" if store.problems else ""
            raise BadInput(f"--report-only: {store.root} holds no survey record{why}; run `astra survey` on a GPU "
                           "machine")
        records = run.refresh_unknown_reach(records, store, say=_say)
    else:
        targets = run.select(args.names, all_drafts=args.all, reviewed=args.reviewed, say=_say)
        runner.require_gpu()  # exit 7, as `astra bench`
        gpu = bench.gpu_name()
        if args.out:
            store = Store(Path(args.out))
        else:
            version = run.sglang_label_version(targets, args.sglang, args.sglang_src)
            store = Store(surveys_dir() / default_label(version, gpu))
        _say(f"survey store: {store.root} ({len(targets)} kernel(s))")
        executor = _executor(args)
        try:
            outcome = run.survey(targets, store, sglang_version=args.sglang, sglang_src=args.sglang_src, gpu=gpu,
                                 force=args.force, settings=bench.BenchSettings(modes=_modes(args), budget_ms=args.budget_ms,
                                                                              outputs_checked=args.check_outputs,
                                                                              sandbox=not args.no_sandbox), say=_say,
                                 run=bench.executor_run(executor) if executor else bench.serial_run,
                                 prebuild=None if getattr(args, "ray", None) else bench.prebuild)
        finally:
            if executor:
                executor.close()
        failed = outcome.failed
        wanted = {t.name for t in targets}
        records = {n: r for n, r in store.records().items() if n in wanted}
    ranking = rank.rank(records, args.view, mix, store.problems)
    print(summary.text(ranking, store.root, args.top))
    write_text(args.json, summary.to_json(ranking, store.root))
    if args.report:
        try:
            for path in report.write(ranking, Path(args.report), store.root, args.top):
                print(f"wrote {path}")
        except OSError as err:
            raise AstraError(f"--report {args.report}: cannot write ({err.strerror or err})") from None
    if failed:
        print(f"{len(failed)} kernel(s) gave no verdict: {', '.join(failed)} (a re-run retries them)")
    return 1 if failed else 0


def _executor(args):
    """None: bench in this process (one GPU, no --ray); else a local pool of GPU workers or Ray."""
    if args.workers is not None and args.workers < 1:
        raise BadInput(f"--workers {args.workers}: give 1 or more")
    if args.ray:
        from astra.scale import make_executor

        return make_executor(ray=args.ray, gpus=args.workers)
    from astra.verify.probing import gpu_count

    workers = args.workers or gpu_count()
    if workers <= 1:
        return None
    from astra.scale import make_executor

    _say(f"{workers} GPU worker(s) on this host")
    return make_executor(gpus=workers)
