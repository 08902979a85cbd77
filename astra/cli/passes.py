"""`astra passes`: the rewrite passes over every buildable module, each candidate built with nvcc."""

from __future__ import annotations

import json

from astra.cli.common import check_output, tree, write_text
from astra.errors import AstraError, ToolMissing
from astra.report import table
from astra.report.progress import Progress, on_terminal


def cmd_passes(args) -> int:
    from astra.optimize.passes import survey

    if args.jobs < 1:
        raise AstraError(f"--jobs {args.jobs}: give a positive number of parallel builds")
    check_output(args.json)
    if not args.no_build:
        from harness import BuildFailure, nvcc_path

        try:
            nvcc_path()
        except BuildFailure as err:
            raise ToolMissing(f"{err} (or pass --no-build)") from None
    t = tree(args)
    opts = survey.SurveyOptions(passes=tuple(args.names), build=not args.no_build, jobs=args.jobs,
                                modules=tuple(args.module))
    applying = Progress("astra passes: applying to modules", enabled=on_terminal(quiet=args.quiet))
    building = Progress("astra passes: building candidates", enabled=on_terminal(quiet=args.quiet))
    result = survey.run(t, opts, progress=applying, build_progress=building)
    applying.close()
    building.close()
    data = result.as_json()
    write_text(args.json, json.dumps(data, indent=1))
    for name, skipped in sorted(result.skipped.items()):
        print(f"skipped {name}: {skipped}")
    rows = []
    for name, o in result.passes.items():
        reasons: dict[str, int] = {}
        for why in o.refused.values():
            reasons[why] = reasons.get(why, 0) + 1
        common = max(reasons, key=reasons.get) if reasons else ""
        rows.append([name, len(o.applies), len(o.builds) if result.built else "-",
                     len(o.build_failed) if result.built else "-", len(o.refused), common[:70]])
    reach = len(data["reach"])
    print(table.render(["pass", "applies", "builds", "build failed", "refused", "most common refusal"], rows))
    print(f"\n{len(result.modules)} sm_90a-buildable modules of SGLang {result.sglang}; "
          f"{reach} {'built' if result.built else 'rewritten'} by at least one pass")
    return 0
