"""Commands that run a spec'd kernel on the GPU: check (a candidate) and bench (the original)."""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

from astra import input_files
from astra.cli.common import check_output, check_output_dir, tree_for_spec, write_text
from astra.errors import AstraError, SandboxMissing
from astra.report import text
from astra.spec.resolve import resolve
from astra.spec.source_check import require_same_source
from astra.verify import runner


def _modes(value: str) -> list[str]:
    return [m.strip() for m in value.split(",") if m.strip()]


def cmd_check(args) -> int:
    spec = resolve(args.name)
    path = Path(args.candidate)
    if not path.exists():  # a FIFO or device gets its own refusal from read_source
        raise AstraError(f"--candidate {path}: no such file (give your version of {spec.kernel_file})")
    source = read_source(path, "--candidate")
    opts = runner.CheckOptions(modes=_modes(args.modes), sanitizer=not args.no_sanitizer, quick=args.quick,
                               sandbox=not args.no_sandbox)
    check_output(args.json)
    start = time.monotonic()
    verdict = runner.check_candidate(spec, tree_for_spec(args, str(spec.path)), source, path.name, opts,
                                     progress=lambda line: print(f"check [{time.monotonic() - start:6.1f} s] {line}",
                                                                 file=sys.stderr, flush=True))
    write_text(args.json, verdict.to_json())
    print(text.format_check(verdict))
    if verdict.status == "sandbox_unavailable":
        return SandboxMissing.exit_code
    return 0 if verdict.correct and verdict.status == "correct" else 1


def cmd_bench(args) -> int:
    specs = [resolve(name) for name in args.names]
    opts = runner.CheckOptions(modes=_modes(args.modes), sanitizer=False, budget_ms=args.budget_ms, ncu=args.ncu,
                               outputs_checked=not getattr(args, "time_only", False), sandbox=not args.no_sandbox)
    check_output(args.json)
    check_output_dir(args.report, "--report")
    trees = {spec.name: tree_for_spec(args, str(spec.path)) for spec in specs}
    for spec in specs:
        require_same_source(spec, trees[spec.name])
    runner.require_gpu()
    if len(specs) > 1:  # every module built at once, one nvcc per core; each bench then finds its build
        from astra.survey.bench import BenchTask, prebuild

        prebuild([BenchTask(spec.name, str(spec.path), args.sglang, args.sglang_src) for spec in specs],
                 lambda line: print(line, flush=True))
    verdicts, ok = {}, True
    for spec in specs:
        verdict = runner.bench_original(spec, trees[spec.name], opts)
        verdicts[spec.name] = verdict
        ok = ok and verdict.status in ("correct", "timed")
        print(f"== {spec.name}", flush=True)
        print(text.format_bench(verdict), flush=True)
        if verdict.ncu:
            print(text.format_ncu(verdict.ncu), flush=True)
        _save(args, verdicts, final=False)  # a run cut short keeps what it measured
    _save(args, verdicts, final=True)
    return 0 if ok else 1


def _save(args, verdicts: dict, *, final: bool) -> None:
    write_text(args.json, json.dumps({name: v.to_dict() for name, v in verdicts.items()}, indent=1))
    if args.report:
        from astra.report import baseline

        for path in baseline.write(verdicts, Path(args.report)):
            if final:
                print(f"wrote {path}")


MAX_SOURCE = input_files.SOURCE_BYTES  # 8 MiB: SGLang's largest kernel file is well under 1 MiB


def read_source(path: Path, flag: str) -> str:
    """A candidate source file as text: a regular file of at most MAX_SOURCE bytes (astra.input_files), not
    binary, UTF-8; anything else is a one-line error."""
    label = f"{flag} {path}"
    data = input_files.read_bytes(path, MAX_SOURCE, what="a kernel source", label=label)
    if b"\0" in data:
        raise AstraError(f"{label}: a binary file, not CUDA source")
    return input_files.decode(data, label)
