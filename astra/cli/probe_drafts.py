"""`astra probe`: run the original kernel of drafted specs on the GPU, repair the drafts the kernel's messages
show wrong, and record what it does."""

from __future__ import annotations

import json
import time

from astra.cli.common import check_output, tree, tree_for_spec, write_text
from astra.cli.testing import check_llm_config, repairers, wants_llm
from astra.report import table
from astra.verify import probe_repair, probing
from astra.verify.probe_record import coverage, markdown, table_rows


def _say(line: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {line}", flush=True)


def cmd_probe(args) -> int:
    opts = probing.ProbeOptions(device=args.device, per_gpu=args.per_gpu, timeout_case_s=args.timeout_case, sanitizer=not args.no_sanitizer,
                              force=args.force, report_only=args.report_only, sandbox=not args.no_sandbox)
    check_output(args.json)
    check_output(args.report, "--report")
    if wants_llm(args):
        check_llm_config(args)
    targets = probing.select(list(args.names), all_drafts=args.all, reviewed=args.reviewed)
    tree_for = lambda spec: tree_for_spec(args, str(spec.path))  # noqa: E731
    if args.repair_dry_run:
        return _dry_run(args, targets, tree_for)
    results = probe_repair.probe_with_repair(targets, tree_for, opts, repairers(args),
                                             rounds=args.repair_rounds, say=_say)
    write_text(args.json, json.dumps([r.to_dict() for r in results], indent=1))
    text = markdown(results)
    if args.report and args.all and (args.sglang or args.sglang_src):  # the tree the drafts came from
        text += "\n".join(coverage(tree(args), results)) + "\n"
    write_text(args.report, text, "--report")
    print(table.render(["module", "status", "kept/total", "writes", "reason"], table_rows(results), align="lllll",
                       max_width=90))
    if args.report_only:
        return 0
    return 0 if all(r.status == "probed" for r in results) else 1


def _dry_run(args, targets, tree_for) -> int:
    """--repair-dry-run: what the repairers would change in each failed draft; nothing written, no GPU."""
    rows = probe_repair.dry_run(targets, tree_for, repairers(args))
    write_text(args.json, json.dumps(rows, indent=1))
    print(table.render(["module", "repairer", "repair (or why none)", "kernel's message"],
                       [[r["module"], r["repairer"] or "-", r["note"], r["message"]] for r in rows], align="llll",
                       max_width=70))
    print(f"{sum(bool(r['repairer']) for r in rows)} of {len(rows)} failed draft(s) would be repaired")
    return 0
