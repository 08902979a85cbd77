"""compute-sanitizer over a job's smallest cases of every band and build variant: out-of-bounds accesses
(memcheck), shared-memory races (racecheck), reads of uninitialised device memory (initcheck), each found by
running the real kernels under the tool.

`sanitize(job)` runs, once per tool and the tools at the same time, the judge (`python -m harness run small-job.json`, in its own
process group, killed past `timeout_s`) with the prefix

    compute-sanitizer --tool T --error-exitcode 99 --print-limit 20 --log-file LOG ...

in its private config (harness.worker.judge_channel), so the judge starts its CANDIDATE process under the tool:
the candidate's code is what runs under it (the original runs in the judge, outside it). The small job
(`sanitizer_cases`) keeps the `options.sanitizer_max_cases` smallest cases by footprint, and the smallest
case of every band (decode, middle, prefill: harness.job.band_of) and of every build variant that these
leave out, so an access that only a larger shape or another variant makes (tests/adversarial:
zb_oob_from_128_rows) is run under the tools; one seed, no timing (`modes=[]`) and no nested sanitizer.
Time stays bounded: the smallest case per band, the extra trials only while every kept case is small
(`TRIALS_MAX_BYTES`), `timeout_s` per tool, and racecheck watching the candidate's kernels alone (below).

What each tool can see:
- memcheck: invalid global/shared/local accesses, misaligned accesses, hardware exceptions. torch's
  caching allocator is switched off (PYTORCH_NO_CUDA_MEMORY_CACHING=1) and every allocation gets
  `PADDING_BYTES` of guard, so reading one element past a tensor is caught rather than landing in a
  neighbour inside the same cached block. CUDA API errors are not reported (torch makes some on
  purpose); a fault still shows as the invalid access that caused it.
- racecheck watches the candidate's own kernels alone where their names are known: its judge, told so by
  its private config (`watch_own_kernels`), names every entry function ptxas reported for the candidate's
  builds (`kernel_filter`: `--kernel-name kne=NAME` each) in the prefix its candidate process starts under
  (harness.candidate.run.candidate_prefix); torch's kernels in the candidate process (inputs drawn, outputs
  poisoned, copies) then run unwatched by it, which shortens its run (docs/results.md). Since the names come
  from its own judge's builds, the tools can start before the judge they serve has built anything. memcheck watches every kernel: a kernel the candidate loads at run time (PTX or a
  cubin handed to the driver) has no name ptxas reported, and an out-of-bounds access must not hide in one
  (the static scan refuses such loading too: harness.scan). initcheck watches every kernel: a write by an
  unwatched kernel would not count as initialising memory, so what torch's kernels write would read as
  uninitialised.
- racecheck: hazards on SHARED memory only (RAW/WAR/WAW between threads of a block without a
  barrier). Races on global memory, across blocks, or between streams are invisible to it (two launches
  racing each other are checked by value instead: harness.back_to_back).
- initcheck: device memory read before anything wrote it. It applies to the candidate process because
  the harness writes every byte of every argument before a call (inputs drawn, outputs poisoned, strided
  views' gaps drawn), so what it finds is memory the candidate allocated and read unwritten.

`sanitize_command(command)` instead runs a whole harness command under one tool: the probe's case
runner (harness.probe.processes), which runs the ORIGINAL kernel in-process, so the original is what the
tool watches there (under `sanitize` with `candidate_source=None`, the original runs in the judge, outside
the tool, and only the candidate process's copy of it runs under it).

Findings come from the tool's log file (its "=========" lines), never from the worker's stdout.
`ok` means "no findings"; `skipped` says why nothing (or not everything) could be checked:
compute-sanitizer missing, a tool that ran out of time, or a worker that failed under a tool without
any access error (each inconclusive, not a finding). `unavailable` repeats `skipped` when it is set:
`harness.worker.judge_process.verify_job` turns it into "sanitizer_unavailable" (fail closed, never a pass).
"""

from __future__ import annotations

import copy
import math
import re
import sys
import tempfile
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from harness.job import Job
from harness.worker.judge_channel import run_judge, verify
from harness.worker.process_group import (
    ProcessOutcome,
    clip,
    describe_exit,
    harness_env,
    read_json_object,
    read_text,
    run_isolated,
    tail,
    telling_line,
)

ERROR_EXITCODE = 99
PRINT_LIMIT = 20
PADDING_BYTES = 256
DEFAULT_TOOLS = ("memcheck", "racecheck", "initcheck")
# The tools that watch the candidate's own kernels alone when their names are known (see the module docstring).
WATCHED_ONLY = ("racecheck",)
WATCHED_KERNELS = "watched_kernels"  # the count a sanitized judge reports among its verdict's phases
TRIALS_MAX_BYTES = 64 << 20  # above this, the sanitizer runs one seed per case and no extra trials
_PREFIX = "========="
_SKIP_HEADERS = re.compile(r"^(COMPUTE-SANITIZER|ERROR SUMMARY|RACECHECK SUMMARY|LEAK SUMMARY|Saved host backtrace)")
_KINDS = (
    (re.compile(r"Invalid (__\w+__|\w+) (read|write|atomic)", re.I),
     lambda m: f"invalid_{m.group(1).strip('_').lower()}_{m.group(2).lower()}"),
    (re.compile(r"^Warning\b.*(Race reported|hazard)", re.I), lambda m: "race_warning"),
    (re.compile(r"Race reported|hazard", re.I), lambda m: "race"),
    (re.compile(r"misaligned", re.I), lambda m: "misaligned"),
    (re.compile(r"Out-of-range", re.I), lambda m: "out_of_range"),
    (re.compile(r"Uninitialized", re.I), lambda m: "uninitialized_read"),
    (re.compile(r"barrier", re.I), lambda m: "barrier"),
    (re.compile(r"Leaked", re.I), lambda m: "leak"),
    (re.compile(r"Target application returned an error|didn't terminate successfully", re.I),
     lambda m: "target_error"),
    (re.compile(r"Program hit (\w+)", re.I), lambda m: "api_error"),
    (re.compile(r"^(Warning|Note|Info)\b", re.I), lambda m: "note"),
)
# Reported under "warnings", never a reason to reject: a worker that fails under the tool without an
# access error (e.g. the harness itself breaking without torch's caching allocator) is inconclusive.
NOT_FINDINGS = frozenset({"race_warning", "note", "target_error"})
_KERNEL_AT = re.compile(r"\bat (.+?)\+0x[0-9a-f]+")


def sanitizer_path() -> str | None:
    """compute-sanitizer on PATH, else under $CUDA_HOME/bin (or /usr/local/cuda/bin), else None."""
    from harness.building.toolchain import cuda_tool

    return cuda_tool("compute-sanitizer")


def footprint(case) -> int:
    """Bytes a case allocates (every present tensor's storage, strided views whole), not the traffic its
    spec counts: a 4 GiB pool looked up at 8 tokens moves little but is large under the tools."""
    from harness.job import dtype_size

    total = 0
    for a in case.tensors():
        rows = int(a.shape[0]) if a.shape else 1
        row = math.prod(int(d) for d in a.shape[1:]) if a.shape else 1
        total += rows * max(row, a.row_stride or 0) * dtype_size(a.dtype)
    return total


def sanitizer_cases(cases: list, keep: int) -> list:
    """The `keep` smallest cases by footprint, then the smallest case of each band and of each build variant
    not among them yet; in order of footprint."""
    order = sorted(cases, key=lambda case: (footprint(case), case.bytes, case.id))
    chosen = order[:max(1, keep)]
    for key in (lambda case: case.band, lambda case: case.variant):
        covered = {key(case) for case in chosen}
        for case in order:
            if key(case) not in covered:
                chosen.append(case)
                covered.add(key(case))
    ids = {case.id for case in chosen}
    return [case for case in order if case.id in ids]


def small_job(job: Job) -> Job:
    """`job` cut down for the sanitizer: `sanitizer_cases`, one seed, no timing, no nested run. The
    large/small/extreme trials stay only while the kept cases are small (`TRIALS_MAX_BYTES`): the tools
    look for bad accesses, which follow shapes, not values, and under them every trial of a large case
    costs minutes (on an H100, a 512 MiB relayout ran past 4 min under memcheck and racecheck with them)."""
    small = copy.deepcopy(job)
    small.cases = sanitizer_cases(small.cases, job.options.sanitizer_max_cases)
    small.options.seeds = small.options.seeds[:1] or [0]
    small.options.extra_trials = job.options.extra_trials and max(
        (footprint(c) for c in small.cases), default=0) <= TRIALS_MAX_BYTES
    small.options.modes = []
    small.options.sanitizer = False
    small.options.timing_gate = None
    return small


def parse_report(text: str, tool: str) -> list[dict]:
    """The findings in a compute-sanitizer log: one per header line among the "=========" lines.

    Each is {tool, kind, message, kernel}; `message` joins the header with its first detail lines
    (where, which thread, which address).
    """
    findings: list[dict] = []
    current: dict | None = None
    for raw in text.splitlines():
        if not raw.startswith(_PREFIX):
            continue
        body = raw[len(_PREFIX):]
        if not body.strip():
            current = None
            continue
        if body.startswith("  "):  # detail line of the current finding
            if current is not None:
                _add_detail(current, body.strip())
            continue
        header = body.strip()
        if _SKIP_HEADERS.match(header):
            current = None
            continue
        current = {"tool": tool, "kind": classify(header), "message": header, "kernel": kernel_name(header),
                   "_details": 0}
        findings.append(current)
    for finding in findings:
        finding.pop("_details")
        finding["message"] = clip(finding["message"], 300)
    return findings


def _add_detail(finding: dict, detail: str) -> None:
    """Append one of the first three detail lines (location, thread, address) to a finding."""
    if finding["_details"] >= 3 or detail.startswith(("Saved host backtrace", "Host Frame", "#", "Device Frame")):
        return
    finding["_details"] += 1
    finding["message"] += " | " + detail
    if finding["kernel"] is None:
        finding["kernel"] = kernel_name(detail)


def kernel_name(text: str) -> str | None:
    """The kernel in "... at <kernel>+0x1c0 ..." (a finding's location), else None."""
    match = _KERNEL_AT.search(text)
    return match.group(1) if match else None


def classify(header: str) -> str:
    """A short kind for a finding's header line ("invalid_global_read", "race", ...; "other")."""
    for pattern, kind in _KINDS:
        match = pattern.search(header)
        if match:
            return kind(match)
    return "other"


def error_count(text: str) -> int | None:
    """N of the log's "ERROR SUMMARY: N errors" line (None when absent)."""
    match = re.search(r"ERROR SUMMARY: (\d+) error", text)
    return int(match.group(1)) if match else None


def sanitizer_prefix(exe: str, tool: str, log: Path) -> list[str]:
    """The compute-sanitizer command prefix for one tool (the candidate command follows it; for a tool of
    `WATCHED_ONLY`, its judge adds `kernel_filter` of the candidate's kernels once built)."""
    command = [exe, "--tool", tool, "--error-exitcode", str(ERROR_EXITCODE), "--print-limit", str(PRINT_LIMIT),
               "--log-file", str(log), "--launch-timeout", "0"]
    if tool == "memcheck":
        command += ["--padding", str(PADDING_BYTES), "--report-api-errors", "no"]
    return command


def kernel_filter(kernels: list[str]) -> list[str]:
    """compute-sanitizer's arguments that make a tool watch these kernels (mangled names) alone."""
    return [arg for name in kernels for arg in ("--kernel-name", f"kne={name}")]


def run_tool(exe: str, tool: str, job: Job, *, timeout_s: float, python: str, env: dict[str, str],
             cancel=None) -> dict:
    """One tool over the small job's candidate process: {tool, returncode, seconds, timed_out, inconclusive,
    findings, warnings, errors, verdict_status, verdict_reason, stderr_tail}."""
    with tempfile.TemporaryDirectory(prefix=f"astra-{tool}-") as tmp:
        log = Path(tmp) / "sanitizer.log"
        outcome, out_path, key = run_judge(job.to_json(), tmp, timeout_s=timeout_s, python=python, env=env,
                                           wrap=sanitizer_prefix(exe, tool, log), wrap_exitcode=ERROR_EXITCODE,
                                           watch_own_kernels=tool in WATCHED_ONLY, cancel=cancel)
        text = read_text(log)
        verdict = read_json_object(out_path) or {}
    if verdict and not verify(verdict, key):
        verdict = {"status": "crashed", "reason": "verdict signature invalid"}
    parsed = parse_report(text, tool)
    findings = [f for f in parsed if f["kind"] not in NOT_FINDINGS]
    if not parsed and (outcome.returncode == ERROR_EXITCODE or "exited with status 99" in str(verdict.get("reason"))):
        findings.append({"tool": tool, "kind": "other", "kernel": None,  # errors, but no line we could read
                         "message": f"{tool} reported errors (exit {ERROR_EXITCODE}) that could not be parsed: "
                                    + clip(tail(text, 5), 200)})
    timed_out = outcome.timed_out or (verdict.get("status") == "timeout" and not findings)
    watched = (verdict.get("phases") or {}).get(WATCHED_KERNELS) or "all"
    return {"tool": tool, "returncode": outcome.returncode, "seconds": round(outcome.seconds, 3), "kernels": watched,
            "timed_out": timed_out, "inconclusive": _inconclusive(tool, findings, verdict, outcome),
            "findings": findings, "warnings": [f for f in parsed if f["kind"] in NOT_FINDINGS],
            "errors": error_count(text), "verdict_status": verdict.get("status"),
            "verdict_reason": verdict.get("reason"), "stderr_tail": tail(outcome.stderr, 10)}


def _inconclusive(tool: str, findings: list[dict], verdict: dict, outcome: ProcessOutcome) -> str | None:
    """Why a run without findings proves nothing: the worker failed under the tool, or the machine did (the judge
    out of GPU memory: `environment_error`; the tool may never have run the candidate's kernels); None otherwise."""
    if findings or outcome.timed_out or verdict.get("status") not in (None, "crashed", "environment_error"):
        return None
    why = verdict.get("reason") or telling_line(outcome.stderr) or describe_exit(outcome.returncode or 0)
    return f"{tool}: the worker failed under the tool without an access error: {clip(why, 200)}"


def _tool_setup(env: dict[str, str] | None) -> tuple[str | None, dict[str, str], dict]:
    """(compute-sanitizer, the environment its runs get, the report to return when it is missing)."""
    exe = sanitizer_path()
    missing = "compute-sanitizer not found on PATH or in $CUDA_HOME/bin"
    run_env = harness_env(env)
    run_env["PYTORCH_NO_CUDA_MEMORY_CACHING"] = "1"  # every allocation its own, padded: one past the end is caught
    return exe, run_env, {"findings": [], "ok": True, "skipped": missing, "unavailable": missing, "runs": []}


def sanitize(job: Job, tools: tuple[str, ...] = DEFAULT_TOOLS, timeout_s: float = 900.0,
             python: str = sys.executable, env: dict[str, str] | None = None, cancel=None) -> dict:
    """Run each tool over `small_job(job)`; returns {findings, ok, skipped, runs}. Each run's `kernels`: how
    many kernels the tool watched (racecheck: the candidate's own, as its judge reported), or "all".

    `timeout_s` bounds each tool's run (sanitized runs are 10-100x slower than plain ones).
    Racecheck only checks shared-memory races (see the module docstring). `cancel` (a threading.Event):
    once set, every tool's run is killed and the report, marked `cancelled`, proves nothing.
    """
    exe, run_env, missing = _tool_setup(env)
    if exe is None:
        return missing
    small = small_job(job)
    with ThreadPoolExecutor(max_workers=max(1, len(tools))) as pool:  # the tools at once: each its own processes
        runs = list(pool.map(lambda tool: run_tool(exe, tool, small, timeout_s=timeout_s, python=python,
                                                   env=run_env, cancel=cancel), tools))
    if cancel is not None and cancel.is_set():
        why = "cancelled: the judge's verdict came first"
        return {"findings": [], "ok": False, "skipped": why, "unavailable": why, "runs": runs, "cancelled": True}
    findings = [finding for run in runs for finding in run["findings"]]
    timed_out = [run["tool"] for run in runs if run["timed_out"]]
    notes = [f"{', '.join(timed_out)} did not finish within {timeout_s:g} s (inconclusive)"] if timed_out else []
    notes += [run["inconclusive"] for run in runs if run["inconclusive"]]
    skipped = "; ".join(notes) or None
    return {"findings": findings, "ok": not findings, "skipped": skipped, "unavailable": skipped, "runs": runs}


def sanitize_command(command: list[str], *, tool: str = "memcheck", timeout_s: float = 900.0,
                     env: dict[str, str] | None = None, cwd: str | Path) -> dict:
    """Run `command` wholly under one tool (in `cwd`, which gets the tool's log and the command's
    stdout/stderr); returns what `sanitize` does: {findings, ok, skipped, unavailable, runs}. A command that
    fails under the tool without an access error, or runs out of time, is inconclusive (`skipped`)."""
    exe, run_env, missing = _tool_setup(env)
    if exe is None:
        return missing
    log = Path(cwd) / f"{tool}.log"
    outcome = run_isolated([*sanitizer_prefix(exe, tool, log), *command], timeout_s=timeout_s, env=run_env, cwd=cwd)
    text = read_text(log)
    parsed = parse_report(text, tool)
    findings = [f for f in parsed if f["kind"] not in NOT_FINDINGS]
    if not parsed and outcome.returncode == ERROR_EXITCODE:
        findings.append({"tool": tool, "kind": "other", "kernel": None,
                         "message": f"{tool} reported errors (exit {ERROR_EXITCODE}) that could not be parsed: "
                                    + clip(tail(text, 5), 200)})
    skipped = None
    if not findings and outcome.timed_out:
        skipped = f"{tool} did not finish within {timeout_s:g} s (inconclusive)"
    elif not findings and outcome.returncode != 0:
        why = telling_line(outcome.stderr) or describe_exit(outcome.returncode or 0)
        skipped = f"{tool}: the command failed under the tool without an access error: {clip(why, 200)}"
    run = {"tool": tool, "returncode": outcome.returncode, "seconds": round(outcome.seconds, 3),
           "timed_out": outcome.timed_out, "inconclusive": skipped, "findings": findings,
           "warnings": [f for f in parsed if f["kind"] in NOT_FINDINGS], "errors": error_count(text),
           "stderr_tail": tail(outcome.stderr, 10)}
    return {"findings": findings, "ok": not findings, "skipped": skipped, "unavailable": skipped, "runs": [run]}
