"""The survey store: one directory per survey, one JSON record per kernel, written when that kernel is done.

    $ASTRA_HOME/surveys/<label>/<kernel>.json     label: sglang-<version>-<gpu slug>-<date> (or --out DIR)

A record (`RECORD_FORMAT`):

    {"format": "astra-survey-record/1", "name": "rmsnorm", "kind": "reviewed" | "draft",
     "spec_file": ".../kernel.yaml", "spec_sha256": "<sha256 of the spec's bytes>", "module": "rmsnorm",
     "token_dim": "tokens", "sglang_version": "0.5.23", "gpu": "NVIDIA H100 80GB HBM3",
     "wall_s": 41.2, "finished_at": "2026-11-22T10:31:02+00:00",
     "reach": {"status": "warm" | "gated" | "cold" | "unknown", "verdict": "...", "gates": [...], ...},
     "verdict": {<harness Verdict.to_dict() of `astra bench`>} | null,
     "guesses": <TODO(review) markers in the spec when benched> | null (records from before the count, added 2026-11-24),
     "error": null | "<one line: why the bench did not give a verdict>"}

Records are written atomically (a temporary file, then a rename), so a survey killed halfway leaves
only whole records; a re-run skips every kernel whose record is current (`is_current`: a verdict, the
same spec sha256, the same SGLang version and the same GPU) and benches the rest.
"""

from __future__ import annotations

import datetime as _dt
import json
import os
import re
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

from astra import input_files, paths
from astra.errors import BadInput

RECORD_FORMAT = "astra-survey-record/1"
_SAFE_NAME = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.+-]*$")


def slug(text: str | None) -> str:
    """Lower case, runs of anything but letters and digits made one '-': "NVIDIA H100 80GB HBM3" -> "nvidia-h100-80gb-hbm3"."""
    out = re.sub(r"[^a-z0-9.]+", "-", str(text or "unknown").lower()).strip("-.")
    return out or "unknown"


def default_label(sglang_version: str, gpu: str | None, today: _dt.date | None = None) -> str:
    """sglang-<version>-<gpu slug>-<YYYY-MM-DD>."""
    return f"sglang-{slug(sglang_version)}-{slug(gpu)}-{(today or _dt.date.today()).isoformat()}"


def surveys_dir() -> Path:
    return paths.sub("surveys")


def latest(prefix: str = "") -> Path | None:
    """The most recently changed survey directory whose name starts with `prefix` (None: there is none)."""
    root = surveys_dir()
    found = [p for p in root.iterdir() if p.is_dir() and p.name.startswith(prefix)]
    return max(found, key=lambda p: p.stat().st_mtime, default=None)


@dataclass
class Store:
    """A survey directory. `problems`: files `records()` could not read, each with why."""

    root: Path
    problems: list[str] = field(default_factory=list)

    def path(self, name: str) -> Path:
        if not _SAFE_NAME.match(name):
            raise BadInput(f"kernel name {name!r} cannot name a survey record (letters, digits, _ . + - only)")
        return self.root / f"{name}.json"

    def read(self, name: str) -> dict | None:
        """The record of `name`, or None when it is missing or unreadable."""
        return _read(self.path(name))

    def records(self) -> dict[str, dict]:
        """Every readable record by kernel name, in name order."""
        out: dict[str, dict] = {}
        self.problems = []
        if not self.root.is_dir():
            return out
        for path in sorted(self.root.glob("*.json")):
            record, why = _read_why(path)
            if record is None:
                self.problems.append(f"{path.name}: not a survey record ({why})")
            else:
                out[str(record["name"])] = record
        return out

    def write(self, record: dict) -> Path:
        """Write one record atomically (temporary file in the same directory, then rename)."""
        target = self.path(str(record["name"]))
        self.root.mkdir(parents=True, exist_ok=True)
        text = json.dumps(record, indent=1, allow_nan=False)
        fd, tmp = tempfile.mkstemp(prefix=f".{target.stem}.", suffix=".tmp", dir=self.root)
        try:
            with os.fdopen(fd, "w") as fh:
                fh.write(text)
                fh.flush()
                os.fsync(fh.fileno())
            os.replace(tmp, target)
        except BaseException:
            Path(tmp).unlink(missing_ok=True)
            raise
        return target


def _read(path: Path) -> dict | None:
    return _read_why(path)[0]


def _read_why(path: Path) -> tuple[dict | None, str | None]:
    """(the record, None), or (None, why it is none): a bounded regular file of JSON (astra.input_files) in
    RECORD_FORMAT."""
    try:
        data = input_files.read_json(path, what="a survey record")
    except input_files.Refused as err:
        return None, err.why
    if not isinstance(data, dict) or data.get("format") != RECORD_FORMAT or not isinstance(data.get("name"), str):
        return None, f"another format, not {RECORD_FORMAT}"
    return data, None


def make_record(*, name: str, kind: str, spec_file: str, spec_sha256: str, module: str, token_dim: str,
                sglang_version: str, gpu: str | None, wall_s: float | None, verdict: dict | None,
                error: str | None, reach: dict | None, guesses: int | None = None) -> dict:
    """A record in RECORD_FORMAT; the GPU is the verdict's (where it ran) when there is one. `guesses`: the
    spec's `TODO(review)` markers when benched (a draft ranks on values `astra extract` guessed)."""
    env_gpu = ((verdict or {}).get("env") or {}).get("gpu")
    return {"format": RECORD_FORMAT, "name": name, "kind": kind, "spec_file": spec_file,
            "spec_sha256": spec_sha256, "module": module, "token_dim": token_dim,
            "sglang_version": sglang_version, "gpu": env_gpu or gpu,
            "wall_s": None if wall_s is None else round(float(wall_s), 3),
            "finished_at": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
            "reach": reach, "verdict": verdict, "error": error, "guesses": guesses}


def stale_reason(record: dict | None, *, spec_sha256: str, sglang_version: str | None,
                 gpu: str | None, views: tuple[str, ...] = ()) -> str | None:
    """Why `record` must be redone (None: it is current and the kernel is skipped). `views`: the timing
    views asked for now; a record timed in fewer (an earlier `--modes graph`) is redone."""
    if record is None:
        return "not surveyed yet"
    if record.get("verdict") is None:
        return f"the last attempt gave no verdict ({record.get('error') or 'no reason recorded'})"
    if record.get("spec_sha256") != spec_sha256:
        return "the spec changed since (sha256 differs)"
    if sglang_version and record.get("sglang_version") not in (None, sglang_version):
        return f"surveyed on SGLang {record.get('sglang_version')}, not {sglang_version}"
    if gpu and record.get("gpu") not in (None, gpu):
        return f"surveyed on {record.get('gpu')}, not {gpu}"
    timed = {view for case in record["verdict"].get("cases") or [] for view in case.get("timings") or {}}
    missing = [view for view in views if view not in timed]
    if missing and timed:
        return f"not timed in the {' and '.join(missing)} view (surveyed with fewer --modes)"
    return None
