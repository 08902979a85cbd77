"""Which spec a command may use: a reviewed spec, or a draft whose probe on a GPU passed for its exact bytes.

`resolve(name)` looks in `extracted_kernels/<name>/` (reviewed, `paths.specs_dir()`) first, then at
`$ASTRA_HOME/drafts/<name>/kernel.yaml`, which it accepts only when `probe.json` beside it says "probed"
and records the sha256 of the draft's current bytes (`astra probe` writes both; any later edit of the
draft invalidates the probe). check, bench and optimize load their specs through it.
"""

from __future__ import annotations

import hashlib
from pathlib import Path

from astra import input_files, paths
from astra.errors import UnknownKernel
from astra.spec import model as spec_mod
from astra.spec.model import KernelSpec

PROBE_FILE = "probe.json"


def spec_sha256(path: Path) -> str:
    """sha256 of a spec file's bytes (what a probe record is bound to); a file that is no regular spec-sized
    file is a one-line error (astra.input_files)."""
    return hashlib.sha256(input_files.read_bytes(path, input_files.SPEC_BYTES, what="a kernel spec")).hexdigest()


def draft_path(name: str) -> Path:
    """$ASTRA_HOME/drafts/<name>/kernel.yaml (it may not exist)."""
    return paths.drafts_dir() / name / "kernel.yaml"


def read_record(path: Path) -> dict | None:
    """A probe record (probe.json) as a dict, or None when it is missing or unreadable."""
    try:
        data = input_files.read_json(path, what="a probe record")
    except input_files.Refused:
        return None
    return data if isinstance(data, dict) else None


def draft_problem(spec_file: Path) -> str | None:
    """Why the draft at `spec_file` may not be used yet (None: probed, and unchanged since)."""
    record = read_record(spec_file.parent / PROBE_FILE)
    if record is None:
        return "is an unprobed draft"
    if record.get("spec_sha256") != spec_sha256(spec_file):
        return "is a draft edited since its probe (its sha256 differs from probe.json)"
    if record.get("status") != "probed":
        return f"is a draft whose probe failed ({record.get('reason') or 'no reason recorded'})"
    return None


def _in_drafts(path: Path) -> bool:
    try:
        path.resolve().relative_to(paths.drafts_dir().resolve())
    except ValueError:
        return False
    return True


def resolve(name: str) -> KernelSpec:
    """The spec `name` (or a kernel.yaml path): reviewed first, else a probed, unedited draft; an unprobed
    or edited draft is refused with what to do next (UnknownKernel, exit 4)."""
    given = Path(name)
    if given.suffix in (".yaml", ".yml"):
        if _in_drafts(given) and given.exists():
            _refuse_unprobed(given.parent.name, given)
        return spec_mod.load(given)
    reviewed = spec_mod.spec_path(name)
    if reviewed.exists() or "/" in name or name.startswith("."):
        return spec_mod.load(name)
    draft = draft_path(name)
    if draft.exists():
        _refuse_unprobed(name, draft)
        return spec_mod.load(draft)
    return spec_mod.load(name)


def _refuse_unprobed(name: str, draft: Path) -> None:
    problem = draft_problem(draft)
    if problem is not None:
        raise UnknownKernel(f"spec {name} {problem} ({draft}); run `astra probe {name}` on a GPU machine first "
                            f"(or review it and move it to extracted_kernels/{name})")
