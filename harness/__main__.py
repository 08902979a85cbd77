"""The GPU worker's command line.

    python -m harness run job.json --out verdict.json    the judge: evaluate one job, write its signed verdict
    python -m harness candidate request.json --work DIR --phase outputs|timing   the candidate process
    python -m harness env [--no-measure]                 GPU, driver, CUDA, torch, tvm-ffi, L2, bandwidth
    python -m harness sanitize job.json [--out report.json] [--tools memcheck,racecheck,initcheck]
    python -m harness probe job.json --out result.json  the ORIGINAL on every case (harness.probe.processes)
    python -m harness probe-cases request.json --results cases.jsonl   the probe's case runner

`run` is what `harness.worker.judge_process.run_job` starts in a fresh process: the judge. It reads its
private config (HMAC key, time budget, sanitizer prefix) from stdin (harness.worker.judge_channel) and signs
the verdict it writes. `candidate` is what the judge starts for candidate code (harness.candidate.process).
Known failures of the evaluation become a verdict written by this process (`known_failure`): CUDA errors and
a lost CUDA context "crashed"; this process out of GPU memory itself "environment_error" (what the device held,
the candidate's process among it, is in the reason; under compute-sanitizer it makes the tool's run
inconclusive). Anything else escapes as a traceback and a non-zero exit, which the parent turns into "crashed"
from stderr. Progress is logged to stderr (INFO), so a timeout's reason names the last
step. The verdict file is the only result channel: nothing here prints results to stdout except `env`.
"""

from __future__ import annotations

import argparse
import faulthandler
import importlib
import importlib.util
import json
import logging
import os
import re
import sys
from dataclasses import asdict, is_dataclass
from pathlib import Path
from typing import Callable

from harness.job import Job
from harness.judge.verdict import Verdict
from harness.worker.judge_channel import read_config, sign
from harness.worker.process_group import EVALUATE_ENV, clip, exit_now, write_json_atomic

_CUDA_FAILURE = re.compile(r"CUDA error|CUDA driver error|cudaError|illegal memory access|illegal instruction"
                           r"|unspecified launch failure|launch timed out|misaligned address|device-side assert"
                           r"|out of memory|CUBLAS_STATUS", re.I)


def load_hook(variable: str) -> Callable | None:
    """The function named by $`variable` (`package.module:function` or `path/to/file.py:function`), or
    None when it is unset. Tests use these hooks to stand in evaluations and kernels that crash or hang."""
    spec = os.environ.get(variable)
    if not spec:
        return None
    target, _, name = spec.rpartition(":")
    if not target or not name:
        raise SystemExit(f"{variable}={spec!r}: expected module:function or file.py:function")
    if target.endswith(".py"):
        module_spec = importlib.util.spec_from_file_location(Path(target).stem, target)
        if module_spec is None or module_spec.loader is None:
            raise SystemExit(f"{variable}: cannot load {target}")
        module = importlib.util.module_from_spec(module_spec)
        module_spec.loader.exec_module(module)
    else:
        module = importlib.import_module(target)
    return getattr(module, name)


def load_evaluate() -> Callable:
    """`harness.judge.evaluate.evaluate`, or the function named by $ASTRA_HARNESS_EVALUATE."""
    hook = load_hook(EVALUATE_ENV)
    if hook is not None:
        return hook
    from harness.judge.evaluate import evaluate

    return evaluate


def verdict_to_dict(verdict) -> dict:
    """A Verdict (its `to_dict`), a dataclass or a plain dict, as a JSON-able dict."""
    if isinstance(verdict, dict):
        return verdict
    if hasattr(verdict, "to_dict"):
        return verdict.to_dict()
    if is_dataclass(verdict):
        return asdict(verdict)
    raise TypeError(f"evaluate returned {type(verdict).__name__}, not a verdict")


def known_failure(error: BaseException) -> tuple[str, str] | None:
    """(status, one-line reason) when `error` is a CUDA failure of the evaluation, else None: this process out
    of GPU memory is "environment_error" (`judge_out_of_memory`), a fault or a lost context "crashed"."""
    try:
        import torch
    except ImportError:
        return None
    from harness.judge.correctness import ContextLost

    message = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
    if isinstance(error, torch.cuda.OutOfMemoryError):
        return "environment_error", judge_out_of_memory(f"CUDA out of memory: {message}")
    if isinstance(error, ContextLost) or (isinstance(error, RuntimeError) and _CUDA_FAILURE.search(str(error))):
        return "crashed", clip(message)
    return None


def caught_verdict(job: Job, status: str, reason: str) -> dict:
    """The verdict this process writes for a known failure it caught."""
    return Verdict(status=status, reason=reason, correct=False, faster=False, name=job.name,
                   candidate_label=job.candidate_label).to_dict()


def judge_out_of_memory(reason: str) -> str:
    """The reason of an "environment_error" verdict for this process's own out-of-memory error: what the device
    held (torch's message names each process), and what to do."""
    return clip("the judge ran out of GPU memory beside the candidate's process, whose own memory counts (free the "
                "GPU of other processes and check again; where the suite's largest shape does not fit beside the "
                f"candidate's process, lower it in the spec): {reason}")


def cmd_run(args: argparse.Namespace) -> int:
    """Evaluate one job and write its verdict; exit 0 whenever a verdict was written."""
    faulthandler.enable()  # a segfault prints the Python stack on stderr before the process dies
    logging.basicConfig(level=logging.INFO, stream=sys.stderr, format="%(levelname)s %(name)s: %(message)s")
    config = read_config()
    job = Job.from_json(Path(args.job).read_text())
    if load_hook(EVALUATE_ENV) is None:  # the real judge: its builds start before torch loads
        from harness.judge import early_build

        early_build.start(job)
    evaluate = load_evaluate()
    try:
        verdict = verdict_to_dict(evaluate(job))
    except RuntimeError as error:
        known = known_failure(error)
        if known is None:
            raise
        logging.getLogger("harness").exception("the evaluation failed")  # where, in the verdict's stderr tail
        verdict = caught_verdict(job, *known)
    if config.key is not None:
        verdict = sign(verdict, config.key)
    write_json_atomic(args.out, verdict)
    # the interpreter's teardown (torch, its CUDA context and cached allocations, every module's finalisers)
    # decides nothing once the verdict is written; the judge's candidate processes are gone by then (each is
    # killed when its run closes, and dies with its parent), their folders removed
    exit_now(0)
    return 0


def cmd_candidate(args: argparse.Namespace) -> int:
    """The candidate process (harness.candidate.process): results into --work, nothing on stdout."""
    faulthandler.enable()
    from harness.candidate.process import main as candidate_main

    return candidate_main(args.request, args.work, args.phase)


def cmd_env(args: argparse.Namespace) -> int:
    """Print the environment report as JSON."""
    from harness.environment.report import environment_report

    json.dump(environment_report(measure=not args.no_measure), sys.stdout, indent=1)
    sys.stdout.write("\n")
    return 0


def cmd_sanitize(args: argparse.Namespace) -> int:
    """Run compute-sanitizer on a job's smallest cases; exit 1 when there are findings."""
    from harness.worker.sanitizer import sanitize

    job = Job.from_json(Path(args.job).read_text())
    report = sanitize(job, tools=tuple(t for t in args.tools.split(",") if t), timeout_s=args.timeout)
    if args.out:
        write_json_atomic(args.out, report)
    else:
        json.dump(report, sys.stdout, indent=1)
        sys.stdout.write("\n")
    return 1 if report["findings"] else 0


def cmd_ncu_launch(args: argparse.Namespace) -> int:
    """The side Nsight Compute profiles: one marked launch of the original per timed case."""
    from harness.timing.ncu_cross_check import launch_cases

    launch_cases(Job.from_json(Path(args.job).read_text()), Path(args.manifest))
    return 0


def cmd_probe(args: argparse.Namespace) -> int:
    """Probe the original kernel of a job on its cases; write the result (exit 0 whenever one was written)."""
    faulthandler.enable()
    logging.basicConfig(level=logging.INFO, stream=sys.stderr, format="%(levelname)s %(name)s: %(message)s")
    from harness.probe.processes import probe_job, write_result

    job = Job.from_json(Path(args.job).read_text())
    result = probe_job(job, device=args.device, timeout_case_s=args.timeout_case, sanitizer=not args.no_sanitizer,
                       sanitizer_timeout_s=args.sanitizer_timeout)
    write_result(args.out, result)
    return 0


def cmd_probe_cases(args: argparse.Namespace) -> int:
    """(started by `probe`) the case runner: one JSON line per event into --results."""
    faulthandler.enable()
    logging.basicConfig(level=logging.INFO, stream=sys.stderr, format="%(levelname)s %(name)s: %(message)s")
    from harness.probe.processes import PROBE_LAUNCH_ENV, run_cases

    return run_cases(args.request, args.results, load_hook(PROBE_LAUNCH_ENV))


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m harness", description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    p = sub.add_parser("run", help="evaluate one job (JSON) and write its verdict (JSON)")
    p.add_argument("job")
    p.add_argument("--out", required=True, help="where the verdict goes (written atomically)")
    p.set_defaults(handler=cmd_run)
    p = sub.add_parser("candidate", help="(started by the judge) run candidate code, write raw results")
    p.add_argument("request")
    p.add_argument("--work", required=True, help="the directory the judge reads results from")
    p.add_argument("--phase", required=True, choices=("outputs", "timing"))
    p.set_defaults(handler=cmd_candidate)
    p = sub.add_parser("env", help="print GPU, driver, CUDA, torch and tvm-ffi versions, L2, bandwidth")
    p.add_argument("--no-measure", action="store_true", help="skip the measurements (copy bandwidth, launch floor)")
    p.set_defaults(handler=cmd_env)
    p = sub.add_parser("sanitize", help="compute-sanitizer on a job's smallest cases")
    p.add_argument("job")
    p.add_argument("--tools", default="memcheck,racecheck,initcheck")
    p.add_argument("--timeout", type=float, default=900.0, help="seconds per tool")
    p.add_argument("--out", help="write the report here instead of stdout")
    p.set_defaults(handler=cmd_sanitize)
    p = sub.add_parser("probe", help="run the ORIGINAL on a job's cases: accepted? writes what? deterministic? memcheck")
    p.add_argument("job")
    p.add_argument("--out", required=True, help="where the probe result goes (written atomically)")
    p.add_argument("--device", default="cuda", help="cuda (default) or cpu (host-only test kernels)")
    p.add_argument("--timeout-case", type=float, default=120.0, help="seconds per case before it counts as hung")
    p.add_argument("--sanitizer-timeout", type=float, default=900.0, help="seconds for the memcheck run")
    p.add_argument("--no-sanitizer", action="store_true", help="skip compute-sanitizer memcheck")
    p.set_defaults(handler=cmd_probe)
    p = sub.add_parser("probe-cases", help="(started by `probe`) probe cases, one JSON line per event")
    p.add_argument("request")
    p.add_argument("--results", required=True, help="the JSON-lines file the events are appended to")
    p.set_defaults(handler=cmd_probe_cases)
    p = sub.add_parser("ncu-launch", help="(run under ncu) launch the original once per timed case, marked")
    p.add_argument("job")
    p.add_argument("--manifest", required=True, help="where the case ids go, in launch order")
    p.set_defaults(handler=cmd_ncu_launch)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    return args.handler(args)


if __name__ == "__main__":
    sys.exit(main())
