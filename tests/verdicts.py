"""Verdicts for CPU tests, built through the harness's own aggregation (`harness.judge.verdict.decide`), so the
acceptance rule sees exactly what a worker would give it. The numbers are SYNTHETIC: no GPU ran."""

from __future__ import annotations

from harness.judge.verdict import CaseResult, ModeTiming, decide
from harness.timing.stats import Stats


def timed_case(case_id: str, band: str, speedup: float, rel_stderr: float = 0.001, mode: str = "graph",
               orig_us: float = 10.0) -> CaseResult:
    case = CaseResult(id=case_id, band=band, label="test", dtype="bfloat16", dims={"tokens": 1}, timed=True,
                      bytes=1 << 20, trials=4)
    case.timings[mode] = ModeTiming(orig=Stats(orig_us, orig_us, orig_us, 100, rel_stderr / 2 ** 0.5),
                                    cand=Stats(orig_us / speedup, orig_us / speedup, orig_us / speedup, 100,
                                               rel_stderr / 2 ** 0.5),
                                    speedup=speedup, ratio_rel_stderr=rel_stderr)
    case.roofline[mode] = {"cand_fraction": 0.5 * speedup, "orig_fraction": 0.5}
    return case


def make_verdict(speedups: dict[str, float | list[float]], *, status: str = "correct", rel_stderr: float = 0.001,
                 name: str = "demo"):
    """One timed graph-mode case per listed speedup, in its band; `status` "incorrect" or "suspect" marks
    the first case so the harness decides that status."""
    cases = []
    for band, values in speedups.items():
        for i, value in enumerate(values if isinstance(values, list) else [values]):
            cases.append(timed_case(f"{band}{i}", band, value, rel_stderr))
    if status == "incorrect":
        cases[0].fail("out: 12 of 4096 elements differ")
    elif status == "suspect":
        cases[0].suspect.append("graph: under the physical floor")
    verdict = decide(cases, ["graph"], 0.02)
    verdict.name = name
    return verdict
