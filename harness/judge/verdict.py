"""The verdict a worker gives back (JSON out), and the pure aggregation that decides it.

A `Verdict` holds one `CaseResult` per case of the job plus what applies to the whole candidate: a
status from `STATUSES`, a one-line reason, band speedups per timing mode (never mixed), the slower
shapes, the environment the numbers were measured in, build summaries and where the time went.
"""

from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass, field, fields
from typing import Any

from harness.job import BANDS
from harness.timing.stats import Stats, geomean

STATUSES = (
    "correct", "incorrect", "build_failed", "missing_export", "signature_mismatch", "crashed", "timeout",
    "sanitizer", "suspect",
    "rejected_source",  # the static scan of the candidate's host code refused it (line named in the reason)
    "sanitizer_unavailable",  # compute-sanitizer was asked for but missing or timed out: not a pass
    "reference_error",  # the spec's reference.py does not load or raises: the spec is broken, not the candidate
    "original_failed",  # the ORIGINAL raised or failed to build on a case of the suite: nothing to compare with
    "incomplete",  # a timing mode could not be measured (e.g. out of memory): the speed claim is unproven
    "interferes",  # GPU work of the candidate ran on while it was stopped for the original's timing
    "environment_error",  # the machine failed (disk full, ...), not the candidate
    "built",  # compiled only, never run (a dry run)
    "timed",  # the original timed against itself with no outputs compared (`astra survey`, `bench --time-only`)
    "sandbox_unavailable",  # the OS sandbox was required and this kernel cannot provide it: nothing was run
)


@dataclass
class ModeTiming:
    """Both sides of one case in one timing mode, measured interleaved: the original in the judge, the
    candidate in its own process (harness.paired_timing)."""

    orig: Stats
    cand: Stats
    speedup: float | None  # orig median / cand median
    ratio_rel_stderr: float = 0.0  # relative standard error of the speedup
    info: dict[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict:
        return {"orig": self.orig.to_dict(), "cand": self.cand.to_dict(), "speedup": self.speedup,
                "ratio_rel_stderr": self.ratio_rel_stderr, "info": self.info}

    @classmethod
    def from_dict(cls, data: dict) -> "ModeTiming":
        return cls(orig=Stats.from_dict(data["orig"]), cand=Stats.from_dict(data["cand"]),
                   speedup=data.get("speedup"), ratio_rel_stderr=float(data.get("ratio_rel_stderr") or 0.0),
                   info=dict(data.get("info") or {}))


@dataclass
class CaseResult:
    """Correctness and timing of one case. `timings[mode]` is a ModeTiming; `floors[mode]` =
    roofline.floor_entry(...): {physical_us, practical_us, orig_us, cand_us, orig_x_practical,
    cand_x_practical, dram_bytes, dram_us, launch_us, peak_Bps}; `roofline[mode]` = roofline.roofline_entry
    (...), the older record, against the practical floor. `bytes_read` + `bytes_written` = `bytes`."""

    id: str
    band: str
    label: str
    dtype: str
    dims: dict[str, int]
    timed: bool
    bytes: int
    correct: bool = True
    reasons: list[str] = field(default_factory=list)  # why the case failed
    notes: list[str] = field(default_factory=list)  # worth reading, not failures
    trials: int = 0
    checks: dict[str, dict] = field(default_factory=dict)  # output -> OutputCheck dict (worst trial)
    reference: dict[str, dict] = field(default_factory=dict)  # output -> {orig, cand, limit, ...}
    deterministic_orig: bool | None = None
    deterministic_cand: bool | None = None
    timings: dict[str, ModeTiming] = field(default_factory=dict)
    roofline: dict[str, dict] = field(default_factory=dict)
    copy_us: float | None = None  # torch copy of the same bytes, graph mode (a reference, not a floor)
    suspect: list[str] = field(default_factory=list)
    floors: dict[str, dict] = field(default_factory=dict)
    bytes_read: int | None = None  # None: not recorded (a verdict from before the floors)
    bytes_written: int | None = None
    bytes_split: str = ""  # how bytes was split into read and written (harness.job.split_bytes)

    def fail(self, reason: str) -> None:
        """Mark the case incorrect with `reason`."""
        self.correct = False
        self.reasons.append(reason)

    def speedup(self, mode: str) -> float | None:
        entry = self.timings.get(mode)
        return None if entry is None else entry.speedup

    def median_us(self, mode: str, side: str) -> float | None:
        """The median of `side` ("orig" or "cand") in `mode`, or None where not timed."""
        entry = self.timings.get(mode)
        return None if entry is None else getattr(entry, side).median_us

    def to_dict(self) -> dict:
        data = asdict(self)
        data["timings"] = {mode: entry.to_dict() for mode, entry in self.timings.items()}
        return data

    @classmethod
    def from_dict(cls, data: dict) -> "CaseResult":
        data = {k: v for k, v in data.items() if k in _names(cls)}
        data["timings"] = {mode: ModeTiming.from_dict(entry) for mode, entry in (data.get("timings") or {}).items()}
        return cls(**data)


@dataclass
class Verdict:
    """What one worker says about one candidate (see the module docstring)."""

    status: str
    reason: str
    correct: bool
    faster: bool | None = None
    name: str = ""
    candidate_label: str = ""
    slower_shapes: list[dict] = field(default_factory=list)  # {id, mode, speedup}
    band_speedups: dict[str, dict[str, float]] = field(default_factory=dict)  # mode -> band/"all" -> geomean
    cases: list[CaseResult] = field(default_factory=list)
    env: dict[str, Any] = field(default_factory=dict)
    builds: list[dict] = field(default_factory=list)
    signatures: dict[str, dict] = field(default_factory=dict)  # variant -> export -> {orig, cand}
    phases: dict[str, float] = field(default_factory=dict)  # build_s, env_s, check_s, time_s, total_s
    notes: list[str] = field(default_factory=list)
    worker: dict[str, Any] = field(default_factory=dict)  # filled in by harness.worker.judge_process
    sanitizer: dict[str, Any] = field(default_factory=dict)  # compute-sanitizer report (worker.judge_process.verify_job)
    ncu: dict[str, Any] = field(default_factory=dict)  # Nsight Compute cross-check (astra bench --ncu)
    sandbox: str = ""  # "enforced" | "off (why)" | "unavailable (why)": the OS sandbox of the candidate process

    def __post_init__(self) -> None:
        if self.status not in STATUSES:
            raise ValueError(f"unknown verdict status {self.status!r}")

    def to_dict(self) -> dict:
        data = asdict(self)
        data["cases"] = [case.to_dict() for case in self.cases]
        return _json_safe(data)

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), indent=1, allow_nan=False)

    @classmethod
    def from_dict(cls, data: dict) -> "Verdict":
        data = {k: v for k, v in data.items() if k in _names(cls)}
        data["cases"] = [CaseResult.from_dict(c) for c in data.get("cases", [])]
        return cls(**data)

    @classmethod
    def from_json(cls, text: str) -> "Verdict":
        return cls.from_dict(json.loads(text))

    def modes(self) -> list[str]:
        """Timing modes present in the cases, graph first."""
        found = {m for case in self.cases for m in case.timings}
        return [m for m in ("graph", "cold") if m in found] + sorted(found - {"graph", "cold"})

    def timed_cases(self) -> list[CaseResult]:
        return [case for case in self.cases if case.timed]

    @property
    def gpu(self) -> str:
        return str(self.env.get("gpu") or "unknown GPU")


def _names(cls: type) -> set[str]:
    return {f.name for f in fields(cls)}


def _json_safe(value: Any) -> Any:
    """Replace non-finite floats by None (JSON has no inf/NaN), recursively."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {k: _json_safe(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_json_safe(v) for v in value]
    return value


# ---------------------------------------------------------------- aggregation (pure)


def band_speedups(cases: list[CaseResult], modes: list[str]) -> dict[str, dict[str, float]]:
    """Geometric mean of per-shape speedups per mode and band, plus "all" over every timed shape."""
    result: dict[str, dict[str, float]] = {}
    for mode in modes:
        by_band: dict[str, list[float]] = {}
        for case in cases:
            value = case.speedup(mode)
            if case.timed and value is not None and value > 0:
                by_band.setdefault(case.band, []).append(value)
                by_band.setdefault("all", []).append(value)
        if by_band:
            order = [b for b in (*BANDS, "all") if b in by_band] + sorted(set(by_band) - {*BANDS, "all"})
            result[mode] = {band: geomean(by_band[band]) for band in order}
    return result


def decide(cases: list[CaseResult], modes: list[str], threshold: float) -> Verdict:
    """The verdict of a candidate that built and loaded: incorrect, suspect or correct; `faster` by the
    one acceptance rule (harness.judge.acceptance.verified_faster), None without timings."""
    from harness.judge.acceptance import slower_shapes, verified_faster

    bands = band_speedups(cases, modes)
    slower = slower_shapes(cases, threshold)
    failing = [c for c in cases if not c.correct]
    suspects = [c for c in cases if c.suspect]
    if failing:
        first = failing[0]
        more = f" (and {len(failing) - 1} more cases)" if len(failing) > 1 else ""
        status, reason = "incorrect", f"{first.id}: {first.reasons[0] if first.reasons else 'failed'}{more}"
    elif suspects:
        status, reason = "suspect", f"{suspects[0].id}: {suspects[0].suspect[0]}"
    else:
        status = "correct"
        summary = "; ".join(f"{mode} " + ", ".join(f"{band} {value:.3f}x" for band, value in b.items())
                            for mode, b in bands.items())
        reason = f"correct on {len(cases)} cases" + (f"; {summary}" if summary else "")
    verdict = Verdict(status=status, reason=reason, correct=not failing, slower_shapes=slower,
                      band_speedups=bands, cases=cases)
    verdict.faster = False if failing else (verified_faster(verdict, threshold=threshold).ok if bands else None)
    return verdict
