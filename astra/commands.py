"""The CLI's commands: thin glue between arguments, the library modules and the terminal."""

from __future__ import annotations

import json
from dataclasses import asdict
from pathlib import Path

from astra import registry, sglang_tree, spec as spec_mod, table
from astra.errors import AstraError


def _tree(args) -> sglang_tree.SglangTree:
    return sglang_tree.locate(version=getattr(args, "sglang", None), src=getattr(args, "sglang_src", None))


def cmd_list(args) -> int:
    tree = _tree(args)
    mods = registry.modules(tree)
    if args.buildable:
        mods = [m for m in mods if m.sm90a in ("yes", "built")]
    if args.json:
        print(json.dumps({
            "sglang": {"version": tree.version, "origin": tree.origin, "root": str(tree.root),
                       "layout": tree.layout},
            "modules": [{**{k: v for k, v in asdict(m).items() if k != "call_sites"},
                         "files": _source_hashes(tree, m)} for m in mods],
        }, indent=1))
        return 0
    rows = [[m.name, m.category, ", ".join(m.sources), _short(m.exports),
             m.sm90a if m.sm90a in ("yes", "built") else f"{m.sm90a}: {m.sm90a_reason}"] for m in mods]
    print(table.render(["module", "category", "source", "exports", "sm_90a"], rows, align="lllll"))
    counts = {}
    for m in mods:
        counts[m.sm90a] = counts.get(m.sm90a, 0) + 1
    summary = ", ".join(f"{v} {k}" for k, v in sorted(counts.items()))
    print(f"\n{len(mods)} JIT modules in {tree.describe()}  [{summary}]")
    if counts.get("yes"):
        print("sm_90a 'yes' is a static judgement (sources, guards, dependencies); 'built' means `astra build` "
              "compiled it here. `astra build --all` turns the first into the second.")
    return 0


def _source_hashes(tree: sglang_tree.SglangTree, module: registry.JitModule) -> dict[str, str]:
    """sha256 of each of the module's own source files, by its path in the SGLang repository layout."""
    site = module.call_sites[0]
    found = [registry.resolve_source(tree, f) for f in site.cuda_files + site.cpp_files]
    return registry.file_hashes(tree, [p for p in found if p is not None])


def _short(items: list[str], keep: int = 2) -> str:
    if not items:
        return "-"
    return ", ".join(items[:keep]) + (f" (+{len(items) - keep})" if len(items) > keep else "")


def cmd_spec_check(args) -> int:
    names = args.names or spec_mod.available()
    if not names:
        raise AstraError(f"no specs under {spec_mod.paths.specs_dir()}; write one with `astra extract NAME`")
    failed = 0
    for name in names:
        try:
            spec = spec_mod.load(name)
        except AstraError as err:
            failed += 1
            print(f"FAIL {name}: {err}")
            continue
        from astra.jobs import cases

        case_list, variants = cases(spec)
        print(f"ok   {name}: {len(case_list)} cases ({sum(c.timed for c in case_list)} timed), "
              f"{len(variants)} build variant(s), dtypes {', '.join(spec.dtypes)}")
    return 1 if failed else 0


def cmd_build(args) -> int:
    from astra import build_cmd

    return build_cmd.run(args, _tree(args))


def cmd_extract(args) -> int:
    from astra import extract

    tree = _tree(args)
    result = extract.extract(tree, args.name, out_dir=Path(args.out) if args.out else None)
    print(f"spec draft: {result.draft}")
    print(f"snapshot:   {result.snapshot} ({len(result.files)} files)")
    for note in result.notes:
        print(f"  review: {note}")
    return 0


def cmd_parse_check(args) -> int:
    from astra import cuda_parse

    tree = _tree(args)
    mods = [m for m in registry.modules(tree) if m.sm90a in ("yes", "built")]
    # Each file is parsed with the -D flags its call site passes (values guessed where symbolic).
    by_defines: dict[tuple, set[str]] = {}
    for m in mods:
        key = tuple(sorted(_defines(m).items()))
        by_defines.setdefault(key, set()).update(s for s in m.sources if not s.startswith("/"))
    results, seen = [], set()
    for key, files in sorted(by_defines.items(), key=lambda kv: len(kv[0])):
        todo = sorted(files - seen)
        seen |= files
        if todo:
            results += cuda_parse.parse_tree_report(tree, todo, defines=dict(key) or None)
    results.sort(key=lambda r: r.path)
    bad = [r for r in results if not r.ok]
    if args.json:
        print(json.dumps([asdict(r) for r in results], indent=1))
    else:
        for r in bad:
            print(f"FAIL {r.path}: {r.first_error}")
        rate = 100.0 * (len(results) - len(bad)) / max(1, len(results))
        print(f"{len(results) - len(bad)}/{len(results)} sm_90a-buildable sources of SGLang {tree.version} "
              f"parse with no errors ({rate:.1f}%)")
    return 0 if len(bad) <= 0.05 * len(results) else 1


def _defines(module) -> dict[str, str]:
    from astra import variants

    flags = variants.guess(module.call_sites[0]).extra_cuda_cflags
    out = {}
    for flag in flags:
        if flag.startswith("-D") and "{" not in flag:
            name, _, value = flag[2:].partition("=")
            out[name] = value or "1"
    return out


def cmd_check(args) -> int:
    from astra import check_cmd

    return check_cmd.check(args, _tree_for_spec(args))


def cmd_bench(args) -> int:
    from astra import check_cmd

    return check_cmd.bench(args, lambda name: _tree_for_spec(args, name))


def _tree_for_spec(args, name: str | None = None) -> sglang_tree.SglangTree:
    """The spec's own SGLang version unless the user names another tree."""
    if getattr(args, "sglang", None) or getattr(args, "sglang_src", None):
        return _tree(args)
    spec = spec_mod.load(name or args.name)
    version = str(spec.raw["source"]["sglang_version"])
    installed = sglang_tree.find_installed()
    if installed is not None and installed.version == version:
        return installed  # the user's own install of that very version: no download
    return sglang_tree.from_wheel(version)


def cmd_optimize(args) -> int:
    from astra import optimize_cmd

    return optimize_cmd.optimize(args, _tree_for_spec(args))


def cmd_runs(args) -> int:
    from astra import optimize_cmd

    return optimize_cmd.runs(args)


def cmd_show(args) -> int:
    from astra import optimize_cmd

    return optimize_cmd.show(args)


# ---- patches: patch / apply / recheck / diff-versions


def cmd_patch(args) -> int:
    from astra.patch import emit_patch

    spec = spec_mod.load(args.name)
    candidate, verdict_path = Path(args.candidate), Path(args.verdict)
    for path, what in ((candidate, "--candidate"), (verdict_path, "--verdict")):
        if not path.is_file():
            raise AstraError(f"{what} {path}: no such file")
    try:
        verdict = json.loads(verdict_path.read_text())
    except json.JSONDecodeError as err:
        raise AstraError(f"--verdict {verdict_path}: not JSON ({err}); write it with `astra check --json OUT`") \
            from None
    if not isinstance(verdict, dict) or "status" not in verdict:
        raise AstraError(f"--verdict {verdict_path}: not a verdict (no `status`); "
                         "write one with `astra check --json OUT`")
    result = emit_patch(spec, _tree_for_spec(args), candidate.read_text(), verdict, Path(args.out),
                        slowdown_threshold=args.threshold, why=args.why)
    if result.refused:
        print(f"no patch: {result.refused}")
        return 1
    print(f"wrote {result.repo_patch}  (SGLang repository: git am / git apply)")
    print(f"wrote {result.package_patch}  (installed package: astra apply --installed)")
    return 0


def cmd_apply(args) -> int:
    from astra import apply_cmd

    return apply_cmd.run(args)


def cmd_recheck(args) -> int:
    from astra import recheck, recheck_report

    tree = _tree(args)
    result = recheck.recheck([Path(p) for p in args.patches], tree)
    text = recheck_report.markdown(result)
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=1))
    if args.markdown:
        Path(args.markdown).write_text(text)
    print(text, end="")
    return result["exit_code"]


def cmd_diff_versions(args) -> int:
    from astra import recheck_report, versions

    spec = spec_mod.load(args.name)
    old, new = sglang_tree.from_wheel(args.from_version), sglang_tree.from_wheel(args.to_version)
    result = versions.diff_versions(spec, old, new)
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=1))
    print(recheck_report.diff_versions_markdown(result), end="")
    return 0


def cmd_eval(args) -> int:
    from astra import eval_cmd

    return eval_cmd.run(args, lambda name: _tree_for_spec(args, name))
