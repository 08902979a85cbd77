"""Commands that find, describe and build SGLang's kernels: list, extract, build, parse-check, spec-check."""

from __future__ import annotations

import json
from dataclasses import asdict
from pathlib import Path

from astra.cli.common import check_output, check_output_dir, tree, write_text
from astra.cli.testing import check_llm_config, propose_drafts, wants_llm
from astra.errors import AstraError, SpecError, ToolMissing
from astra.report import table
from astra.report.progress import Progress, on_terminal
from astra.sglang import discovery, registry
from astra.spec import builds, checks, extract, jobs
from astra.spec import model as spec_mod
from astra.spec.resolve import draft_path


def _progress(args, what: str) -> Progress:
    """The command's progress line: on a terminal's stderr only, never with --quiet."""
    return Progress(f"astra {args.command}: {what}", enabled=on_terminal(quiet=args.quiet))


def cmd_list(args) -> int:
    t = tree(args)
    if args.why:
        from astra.sglang import srt_gates
        from astra.sglang.srt_gates_text import format_reach

        reach = srt_gates.why(t, args.why)
        print(json.dumps(asdict(reach), indent=1) if args.json else format_reach(reach))
        return 0
    progress = _progress(args, "reading SGLang's loader files")
    mods = registry.modules(t, progress=progress)
    skipped = discovery.unparsable(t, progress=progress)
    progress.close()
    if args.buildable:
        mods = [m for m in mods if m.sm90a in ("yes", "built")]
    if args.json:
        print(json.dumps({
            "sglang": {"version": t.version, "origin": t.origin, "root": str(t.root), "layout": t.layout},
            "modules": [registry.module_record(t, m) for m in mods],
        }, indent=1))
        return 0
    rows = [[_marked(m.name), m.category, ", ".join(m.sources), _short([_marked(e) for e in m.exports]),
             m.sm90a if m.sm90a in ("yes", "built") else f"{m.sm90a}: {m.sm90a_reason}"] for m in mods]
    print(table.render(["module", "category", "source", "exports", "sm_90a"], rows, align="lllll"))
    if any(registry.is_template(name) for m in mods for name in [m.name, *m.exports]):
        print(f"\n{TEMPLATE_MARK}: a name SGLang builds at run time from the loader's arguments (each {{...}} is a "
              "part it fills in); `astra extract` takes the module's name as listed, without the mark")
    counts: dict[str, int] = {}
    for m in mods:
        counts[m.sm90a] = counts.get(m.sm90a, 0) + 1
    summary = ", ".join(f"{v} {k}" for k, v in sorted(counts.items()))
    print(f"\n{len(mods)} JIT modules in {t.describe()}  [{summary}]")
    for unread in skipped:
        print(f"skipped {unread.file}: {unread.error}")
    if counts.get("yes"):
        print("sm_90a 'yes' is a static judgement (sources, guards, dependencies); 'built' means `astra build` "
              "compiled it here. `astra build --all` turns the first into the second.")
    return 0


TEMPLATE_MARK = "[template]"


def _marked(name: str) -> str:
    """A name with `{...}` parts is a template SGLang fills in at run time, not a module or export name: say so."""
    return f"{name} {TEMPLATE_MARK}" if registry.is_template(name) else name


def _short(items: list[str], keep: int = 2) -> str:
    if not items:
        return "-"
    return ", ".join(items[:keep]) + (f" (+{len(items) - keep})" if len(items) > keep else "")


def _spec_file(name: str, draft: bool) -> Path:
    """The file `spec-check` judges: with --draft, NAME's draft under $ASTRA_HOME/drafts when there is one."""
    if draft and Path(name).suffix not in (".yaml", ".yml") and draft_path(name).exists():
        return draft_path(name)
    return spec_mod.resolve_path(name)


def cmd_spec_check(args) -> int:
    names = args.names or spec_mod.available()
    if not names:
        raise AstraError(f"no specs under {spec_mod.paths.specs_dir()}; write one with `astra extract NAME`")
    failed, unreviewed = 0, {}
    for name in names:
        path = _spec_file(name, args.draft)
        label = f"{name} (draft {path})" if path == draft_path(name) else name
        markers = checks.review_markers(path)
        try:
            spec = spec_mod.load(path if path.exists() else name)
            case_list, variants = jobs.cases(spec)
        except AstraError as err:
            failed += 1
            print(f"FAIL {label}: {err}")
        else:
            excluded = f", {len(spec.excluded)} excluded" if spec.excluded else ""
            print(f"{'ok  ' if not markers or args.draft else 'FAIL'} {label}: {len(case_list)} cases "
                  f"({sum(c.timed for c in case_list)} timed{excluded}), {len(variants)} build variant(s), "
                  f"dtypes {', '.join(spec.dtypes)}")
        for marker in markers if args.draft else []:
            print(f"     note: {marker}")
        if markers and not args.draft:
            unreviewed[path] = markers
    if len(unreviewed) == 1:
        (path, markers), = unreviewed.items()
        raise SpecError(str(path), markers)
    if unreviewed:
        raise SpecError(f"{len(unreviewed)} unreviewed specs", [f"{path}: {m}" for path, ms in unreviewed.items()
                                                                for m in ms])
    return 1 if failed else 0


def cmd_extract(args) -> int:
    check_output_dir(args.out, "--out")
    if wants_llm(args):
        check_llm_config(args)
    if bool(args.names) == bool(args.all):
        raise AstraError("name the modules to draft, or give --all (every single-GPU sm_90a module)")
    if args.out and (args.all or len(args.names) > 1):
        raise AstraError("--out takes one module; drafts of several go to $ASTRA_HOME/drafts/")
    sglang = tree(args)
    if len(args.names) == 1:
        result = extract.extract(sglang, args.names[0], out_dir=Path(args.out) if args.out else None,
                                 export=args.export, build_check=not args.no_build_check)
        print(f"spec draft: {result.draft}")
        print(f"snapshot:   {result.snapshot} ({len(result.files)} files)")
        for note in result.notes:
            print(f"  review: {note}")
        if wants_llm(args):
            propose_drafts(args, sglang, [(args.names[0], result.draft, result.notes)])
        return 0
    names = args.names
    if not names:
        reading = _progress(args, "reading SGLang's loader files")
        names = extract.single_gpu_modules(sglang, progress=reading)
        reading.close()
    progress = _progress(args, "drafting modules")
    results = extract.extract_many(sglang, names, jobs=args.jobs,
                                   build_check=not args.no_build_check, progress=progress)
    progress.close()
    failed = 0
    for name, draft, notes, error in results:
        if error:
            failed += 1
            print(f"FAIL   {name}: {error}")
        else:
            print(f"draft  {name}: {len(notes)} note(s) to review -> {draft}")
    print(f"{len(results) - failed} drafted, {failed} failed; probe them with `astra probe --all` on a GPU machine")
    if wants_llm(args):
        propose_drafts(args, sglang, [(n, d, notes) for n, d, notes, err in results if not err])
    return 1 if failed and failed == len(results) else 0


def cmd_parse_check(args) -> int:
    from astra.sglang import cuda_parse

    t = tree(args)
    progress = _progress(args, "parsing sources")
    results = cuda_parse.parse_buildable(t, progress=progress)
    progress.close()
    bad = [r for r in results if not r.ok]
    if args.json:
        print(json.dumps([asdict(r) for r in results], indent=1))
    else:
        for r in bad:
            print(f"FAIL {r.path}: {r.first_error}")
        rate = 100.0 * (len(results) - len(bad)) / max(1, len(results))
        print(f"{len(results) - len(bad)}/{len(results)} sm_90a-buildable sources of SGLang {t.version} "
              f"parse with no errors ({rate:.1f}%)")
    return 1 if bad else 0


def cmd_build(args) -> int:
    from harness import BuildFailure, format_table, nvcc_path

    bad = [kv for kv in args.set if "=" not in kv or not kv.split("=", 1)[0].strip()]
    if bad:
        raise AstraError(f"--set {bad[0]!r}: give NAME=VALUE, e.g. --set kWarpsPerBlock=8")
    opts = builds.BuildOptions(arch=args.arch, variant=args.variant, jobs=args.jobs,
                               overrides=dict(kv.split("=", 1) for kv in args.set))
    check_output(args.json)
    try:
        nvcc_path()
    except BuildFailure as err:
        raise ToolMissing(str(err)) from None
    arch = builds.arch_of(opts.arch)
    t = tree(args)
    reading = _progress(args, "reading SGLang's loader files")
    found = registry.modules(t, progress=reading)  # found once: planning a build reads them from here
    reading.close()
    mismatch = builds.tvm_ffi_mismatch(t)
    if mismatch:
        print(f"note: {mismatch}")
    if args.all:
        names = [m.name for m in found if m.sm90a in ("yes", "built", "build-failed")]
    elif args.name:
        names = [args.name]
    else:
        raise AstraError("name a module (see `astra list`) or pass --all")
    planned, skipped = [], []
    for name in names:
        try:
            planned += builds.plan(t, name, opts)
        except AstraError as err:
            if not args.all:
                raise
            skipped.append((name, str(err)))
    progress = _progress(args, "building")
    results = builds.build_all(t, planned, opts, progress=progress)
    progress.close()
    summary = [builds.summary(p, res) for p, res in zip(planned, results)]
    if not args.all:
        for p, res in zip(planned, results):
            state = "ok" if res.ok else "FAILED"
            print(f"{p.module} [{p.label}] sm_{arch}: {state} in {res.seconds:.1f}s{' (cached)' if res.cache_hit else ''}")
            for note in p.notes:
                print(f"  note: {note}")
            print(format_table(res.resources) if res.ok else (res.error or res.log[-2000:]))
    failed = sum(not res.ok for res in results)
    if args.all:
        rows = [[s["module"], "ok" if s["ok"] else "FAILED", s["seconds"],
                 max((r["registers"] or 0 for r in s["resources"]), default=0),
                 sum(r.get("spill_stores", 0) + r.get("spill_loads", 0) for r in s["resources"]),
                 (s["error"] or "").splitlines()[0][:70] if s["error"] else ""] for s in summary]
        print(table.render(["module", "build", "s", "max regs", "spill B", "error"], rows))
        print(f"\n{len(summary) - failed}/{len(summary)} modules built for sm_{arch}; "
              f"{len(skipped)} skipped (template arguments unknown)")
    write_text(args.json, json.dumps({"sglang": t.version, "arch": arch, "results": summary,
                                      "skipped": [{"module": n, "reason": r} for n, r in skipped]}, indent=1))
    return 1 if failed else 0
