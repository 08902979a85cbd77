"""Timed calls must compute what checked calls computed: a candidate may not behave differently when timed.

Correctness is judged in phase `outputs`; times come from phase `timing`, a new candidate process. A kernel
that counts its calls, or notices a graph capture, could do its whole job while checked and part of it
while timed (tests/adversarial: u_half_when_timed, which the floors do not catch when the part it skips
still leaves it above the physical floor). So the timing process, after timing each case, runs one more
call per timing mode the way that mode runs it (graph: captured into a CUDA graph and replayed; cold: a
plain call after all the timed ones) on the inputs of the case's first seed, and records the sha256 of the
outputs (`harness.judge.correctness.determinism_digests`' procedure). The judge compares each with the digest of the
same inputs from phase `outputs`: a case whose timed call differs fails, naming the mode. A candidate
that is not deterministic (the original neither, or it would be incorrect already) cannot be compared
bit for bit; the case gets a note instead.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any, Callable

import torch

from harness.candidate.exchange import Malformed, write_json_atomic
from harness.job import Case, Job
from harness.judge.verdict import CaseResult

log = logging.getLogger(__name__)

TIMED_DIGESTS = "timed_digests.json"
Launch = Callable[[Any], Any]


def graph_launch(launch: Launch) -> Launch:
    """`launch` as graph mode runs it: captured into a CUDA graph (on torch's capture stream), then the
    graph replayed once on the current stream (harness.judge.correctness's checking stream, so the call stays
    stream-ordered)."""
    def run(call_args: Any) -> None:
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            launch(call_args)
        graph.replay()
    return run


def timed_digests(case: Case, launch: Launch, job: Job, device: torch.device, modes: list[str]) -> dict[str, Any]:
    """Candidate side, after a case was timed: {mode: sha256 of the outputs of one call made as `mode`
    times, or {"error": line}}, on the first seed's inputs."""
    from harness.judge.correctness import call, clone_inputs, output_digest, poison_outputs
    from harness.judge.inputs import make_inputs

    seed = job.options.seeds[0] if job.options.seeds else 0
    inputs = make_inputs(case, seed, device)
    digests: dict[str, Any] = {}
    for mode in modes:
        how = graph_launch(launch) if mode == "graph" else launch
        args = poison_outputs(clone_inputs(inputs), case.args)
        error = call(how, args, case, device, f"{case.id}: {mode} timed call")
        if error is not None:
            digests[mode] = {"error": error[:300]}
            continue
        digests[mode] = output_digest(case, args)
    return digests


def write(work: Path, digests: dict[str, dict[str, Any]]) -> None:
    write_json_atomic(work / TIMED_DIGESTS, digests)


def read(work: Path) -> dict[str, Any]:
    try:
        data = json.loads((Path(work) / TIMED_DIGESTS).read_text())
    except (OSError, ValueError) as error:
        raise Malformed(f"unreadable timed-call digests: {error}") from error
    if not isinstance(data, dict):
        raise Malformed("timed-call digests are not an object")
    return data


def judge(work: Path, job: Job, results: list[CaseResult], checked: dict[str, str | None]) -> None:
    """Judge side: fail every timed case whose timed calls' outputs differ from the checked outputs
    (`checked`: case id -> the phase-`outputs` digest of the first seed, None when not comparable)."""
    try:
        data = read(work)
    except Malformed as error:
        for result in (r for r in results if r.timings):
            result.fail(f"timed calls: {error}")
        return
    for result in results:
        modes = [mode for mode in job.options.modes if mode in result.timings]
        if not modes:
            continue
        expected = checked.get(result.id)
        if expected is None or result.deterministic_cand is not True:
            result.notes.append("timed calls not compared with checked ones: the candidate is not deterministic")
            continue
        entry = data.get(result.id)
        for mode in modes:
            got = entry.get(mode) if isinstance(entry, dict) else None
            if isinstance(got, dict) and "error" in got:
                result.fail(f"{mode} timing: a call made as it is timed raised {str(got['error'])[:200]}")
            elif got != expected:
                what = "no digest" if not isinstance(got, str) else "outputs that differ"
                result.fail(f"{mode} timing: a call made as it is timed (after the timed ones, on seed "
                            f"{job.options.seeds[0] if job.options.seeds else 0}'s inputs) gave {what} from the "
                            f"checked call on the same inputs: the candidate behaves differently when timed")
