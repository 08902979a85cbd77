"""Baselines kept across runs: the original timed against itself, reused while nothing that decides it changed.

Timing the original against itself takes 98 to 128 s per kernel on an H200 (rmsnorm, qknorm,
fused_add_rmsnorm, silu_and_mul of SGLang 0.5.23), at the start of every run. A run takes a stored baseline
instead when its key matches, so the same original on the same GPU model under the same judge is timed
once a week, not once a run.

    $ASTRA_HOME/baselines/<key>.json    {"key", "kernel", "gpu", "harness", "timed_at", "timed_by", "verdict"}

The key is a sha256 over the identity the evaluator gives (`Evaluator.baseline_identity`: the job it builds
for the original, serialised without what is drawn per evaluation, with digests of its sources, tools and
reference, and the name of the GPU it runs on), the original's text (the loop adds it) and the digest of
the harness's own `.py` files (a changed judge times again). A stored baseline is not reused when it is
older than `MAX_AGE_S`, unreadable or malformed (a miss; the new one replaces it), or under `rebaseline`
(`--rebaseline`: time again and replace). Only a timed self-check is stored: status "timed" (or "correct"
where its outputs were checked too) with timed cases, measured on the GPU its key names.
"""

from __future__ import annotations

import hashlib
import json
import os
import tempfile
import time
from dataclasses import asdict, dataclass
from functools import lru_cache
from pathlib import Path

from astra import input_files, paths
from astra.text import one_line
from harness import BuildFailure, Job, Verdict, nvcc_path, tvm_ffi_version

MAX_AGE_S = 7 * 24 * 3600.0  # a week: a GPU's clocks, driver or neighbours drift; time it again
STORED_STATUSES = ("timed", "correct")  # the original against itself, nothing failed
PER_EVALUATION = ("digest_key", "timing_gate", "cache_dir")  # job options that do not decide a baseline


@dataclass
class Stored:
    """A stored baseline found for a key."""

    verdict: Verdict
    path: Path
    timed_at: float  # seconds since the epoch
    timed_by: str  # the run that timed it
    gpu: str

    def origin(self) -> dict:
        """What the run records of its baseline (RunState.baseline_origin)."""
        return {"how": "reused", "file": str(self.path), "timed_at": self.timed_at, "timed_by": self.timed_by,
                "gpu": self.gpu}


class BaselineStore:
    """The stored baselines under `root` ($ASTRA_HOME/baselines by `default`). `harness`: the judge's digest
    (default: `harness_digest()` of the package this process imports)."""

    def __init__(self, root: Path, *, rebaseline: bool = False, max_age_s: float = MAX_AGE_S,
                 harness: str | None = None):
        self.root, self.rebaseline, self.max_age_s = Path(root), rebaseline, max_age_s
        self.harness = harness if harness is not None else harness_digest()

    @classmethod
    def default(cls, *, rebaseline: bool = False) -> "BaselineStore":
        return cls(paths.sub("baselines"), rebaseline=rebaseline)

    def key(self, identity: dict) -> str:
        payload = json.dumps({"identity": identity, "harness": self.harness}, sort_keys=True, default=str)
        return hashlib.sha256(payload.encode()).hexdigest()

    def path(self, identity: dict) -> Path:
        return self.root / f"{self.key(identity)}.json"

    def lookup(self, identity: dict) -> tuple[Stored | None, str]:
        """(the stored baseline of `identity`, "") or (None, why none is reused). Never raises for the file:
        an unreadable or malformed one is a miss, replaced by the next `save`."""
        if self.rebaseline:
            return None, "--rebaseline: the stored baseline is timed again"
        path = self.path(identity)
        if not path.exists():
            return None, "no stored baseline of this original, GPU and judge"
        try:
            record = json.loads(input_files.read_text(path, input_files.RECORD_BYTES, what="a stored baseline"))
            if not isinstance(record, dict) or record.get("key") != self.key(identity):
                raise ValueError("not this key's record")
            timed_at = record["timed_at"]
            if isinstance(timed_at, bool) or not isinstance(timed_at, (int, float)):
                raise ValueError("`timed_at` is not a time")
            verdict = Verdict.from_dict(record["verdict"])
            stored = Stored(verdict, path, float(timed_at), str(record.get("timed_by") or ""),
                            str(record.get("gpu") or verdict.gpu))
        except (OSError, UnicodeDecodeError, ValueError, TypeError, KeyError, AttributeError, RecursionError,
                input_files.Refused) as err:
            from astra.optimize.rundir import unreadable_reason

            return None, f"the stored baseline {path.name} is unreadable ({unreadable_reason(err)}): timed again"
        why = storable(verdict)
        if why:
            return None, f"the stored baseline {path.name} is not a timed self-check ({why}): timed again"
        age = time.time() - stored.timed_at
        if not -600.0 <= age <= self.max_age_s:  # a clock ten minutes apart is tolerated, a future date not
            return None, (f"the stored baseline was timed {when(stored.timed_at)}, more than "
                          f"{self.max_age_s / 86400:g} days ago: timed again")
        return stored, ""

    def save(self, identity: dict, verdict: Verdict, run_id: str, kernel: str = "") -> tuple[Path | None, str]:
        """Store `verdict` as the baseline of `identity` (replacing any); (its file, "") or (None, why it is
        not stored): not a timed self-check, measured on another GPU than the key names, or a file that
        could not be written (a cache: the run goes on)."""
        why = storable(verdict)
        if not why and verdict.env.get("gpu") != identity.get("gpu"):
            why = f"measured on {verdict.gpu}, not on {identity.get('gpu') or 'a named GPU'}"
        if why:
            return None, why
        record = {"key": self.key(identity), "kernel": kernel or verdict.name, "gpu": verdict.gpu,
                  "harness": self.harness, "timed_at": time.time(), "timed_by": run_id, "verdict": verdict.to_dict()}
        path = self.path(identity)
        try:
            self.root.mkdir(parents=True, exist_ok=True)
            fd, tmp = tempfile.mkstemp(dir=self.root, prefix=f".{path.stem[:16]}-", suffix=".tmp")
            with os.fdopen(fd, "w") as out:
                out.write(json.dumps(record, indent=1, allow_nan=False))
            os.replace(tmp, path)
        except (OSError, ValueError) as err:
            return None, f"could not write {path}: {one_line(err, 200)}"
        return path, ""


def storable(verdict: Verdict) -> str:
    """Why `verdict` cannot be a stored baseline ("" when it can): a timed self-check of the original."""
    if verdict.status not in STORED_STATUSES:
        return f"status {verdict.status}"
    if not any(c.timed and c.timings for c in verdict.cases):
        return "no timed case"
    if not verdict.env.get("gpu"):
        return "the GPU it ran on is not named"
    return ""


def job_identity(job: Job) -> dict:
    """What of `job` decides its timings: the job serialised without what the judge draws per evaluation
    (`PER_EVALUATION`), with digests of every source its builds read (the trees they include from, files
    outside them, the reference) and the tools that build it."""
    from harness.building.sources import file_digest, tree_digest

    data = asdict(job)
    for name in PER_EVALUATION:
        data["options"].pop(name, None)
    roots = [job.build.source_root, *job.build.include_dirs]
    outside = [f for f in job.build.cuda_files + job.build.cpp_files if os.path.isabs(f)]
    data["sources"] = {"trees": tree_digest(roots), "files": {f: file_digest(f) for f in outside},
                       "reference": file_digest(job.reference) if job.reference else None}
    data["toolchain"] = {"nvcc": nvcc_version(), "tvm_ffi": tvm_ffi_version()}
    return data


def nvcc_version() -> str | None:
    """`nvcc --version` of the nvcc a build runs; None without one."""
    from harness.building.toolchain import tool_version

    try:
        return tool_version(nvcc_path())
    except (BuildFailure, OSError):
        return None


@lru_cache(maxsize=1)
def harness_digest() -> str:
    """sha256 over the harness package's `.py` files (relative path and bytes): the judge's own source."""
    import harness

    root = Path(harness.__file__).resolve().parent
    hasher = hashlib.sha256()
    for path in sorted(root.rglob("*.py")):
        hasher.update(f"{path.relative_to(root).as_posix()}\n".encode())
        hasher.update(path.read_bytes())
    return hasher.hexdigest()


def when(timestamp: float) -> str:
    return time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime(timestamp))


def origin_text(origin: dict) -> str:
    """One line on where a run's baseline came from (`RunState.baseline_origin`); "" for a run without one."""
    if not origin:
        return ""
    gpu = origin.get("gpu") or "an unnamed GPU"
    timed_at = origin.get("timed_at")
    date = when(timed_at) if isinstance(timed_at, (int, float)) and not isinstance(timed_at, bool) else "an unknown date"
    if origin.get("how") == "reused":
        by = f" by run {origin['timed_by']}" if origin.get("timed_by") else ""
        return (f"baseline reused from {date} (same original, GPU and judge; timed{by} on {gpu}): "
                f"{origin.get('file')}; --rebaseline times it again")
    stored = (f"stored for later runs: {origin['file']}" if origin.get("file")
              else f"not stored: {origin.get('note') or 'the store is off'}")
    why = f" ({origin['why']})" if origin.get("why") else ""
    return f"baseline timed by this run on {date} on {gpu}{why}; {stored}"
