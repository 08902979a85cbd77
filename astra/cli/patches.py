"""Commands that turn verified candidates into patches and keep them honest: patch, apply, recheck,
diff-versions (exit codes: docs/exit-codes.md)."""

from __future__ import annotations

import json
from pathlib import Path

from astra import input_files
from astra.cli.common import tree, tree_for_spec, write_text
from astra.cli.verify import read_source
from astra.errors import AstraError
from astra.patches import apply as apply_mod
from astra.patches import recheck, versions
from astra.patches.emit import check_threshold, emit_patch
from astra.report import recheck_md
from astra.sglang import tree as sglang_tree
from astra.spec.resolve import resolve
from harness import Verdict


def read_verdict(path: Path) -> Verdict:
    """A verdict written by `astra check --json`; anything else is a one-line error saying how to make one."""
    try:  # a regular file of bounded size, JSON of bounded nesting (astra.input_files)
        data = input_files.read_json(path, what="a verdict", label=f"--verdict {path}")
    except input_files.Refused as err:
        raise AstraError(f"{err}; write it with `astra check --json OUT`") from None
    if not isinstance(data, dict) or "status" not in data:
        raise AstraError(f"--verdict {path}: not a verdict (no `status`); write one with `astra check --json OUT`")
    try:
        return Verdict.from_dict(data)
    except (TypeError, ValueError, KeyError, AttributeError) as err:
        raise AstraError(f"--verdict {path}: not a verdict Astra wrote ({err}); write one with "
                         "`astra check --json OUT`") from None


def cmd_patch(args) -> int:
    check_threshold(args.threshold)
    spec = resolve(args.name)  # a reviewed spec, or a probed draft (as check and optimize take them)
    candidate = Path(args.candidate)
    if not candidate.exists():  # a FIFO or device gets its own refusal from read_source
        raise AstraError(f"--candidate {candidate}: no such file")
    source = read_source(candidate, "--candidate")
    verdict = read_verdict(Path(args.verdict))
    result = emit_patch(spec, tree_for_spec(args, str(spec.path)), source, verdict, Path(args.out),
                        slowdown_threshold=args.threshold, why=args.why, sanitizer_required=not args.no_sanitizer)
    if result.refused:
        print(f"no patch: {result.refused}")
        return 1
    print(f"wrote {result.repo_patch}  (SGLang repository: git am / git apply)")
    print(f"wrote {result.package_patch}  (installed package: astra apply --installed)")
    return 0


def cmd_apply(args) -> int:
    t = apply_mod.tree_for(args.sglang_src, args.installed)
    result = apply_mod.apply(Path(args.patch), t, force=args.force, check_only=args.check)
    print(result.message)
    return 0


def _same_file(a: Path, b: Path) -> bool:
    try:
        return a.resolve() == b.resolve() or (a.exists() and b.exists() and a.samefile(b))
    except (OSError, RuntimeError):  # a symlink loop: reading the patch will say so
        return False


def _check_report_paths(args) -> None:
    """--json and --markdown never overwrite a patch being rechecked (nor each other)."""
    outputs = [(flag, Path(value)) for flag, value in (("--json", args.json), ("--markdown", args.markdown)) if value]
    for flag, out in outputs:
        hit = next((p for p in args.patches if _same_file(out, Path(p))), None)
        if hit is not None:
            raise AstraError(f"{flag} {out}: is the patch {hit} being rechecked; write the report to another file")
    if len(outputs) == 2 and _same_file(outputs[0][1], outputs[1][1]):
        raise AstraError(f"--json and --markdown both name {outputs[0][1]}; give each report its own file")


def cmd_recheck(args) -> int:
    _check_report_paths(args)
    result = recheck.recheck([Path(p) for p in args.patches], tree(args), no_gpu=args.no_gpu)
    markdown = recheck_md.markdown(result)
    write_text(args.json, json.dumps(result, indent=1))
    write_text(args.markdown, markdown, "--markdown")
    print(markdown, end="")
    return result["exit_code"]


def cmd_diff_versions(args) -> int:
    spec = resolve(args.name)
    old, new = sglang_tree.from_wheel(args.from_version), sglang_tree.from_wheel(args.to_version)
    result = versions.diff_versions(spec, old, new)
    write_text(args.json, json.dumps(result, indent=1))
    print(recheck_md.diff_versions_markdown(result), end="")
    return 0
