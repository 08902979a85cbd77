"""Where Astra keeps its files.

Everything Astra writes outside the repository lives under one user directory, `ASTRA_HOME`
(default `~/.cache/astra`), so tests can point it at a temporary folder and never touch the
real one.

    $ASTRA_HOME/sglang/<version>/       unpacked SGLang wheels (only the kernel sources)
    $ASTRA_HOME/snapshots/<name>/<hash>/ source snapshots written by `astra extract`
    $ASTRA_HOME/builds/                  content-hashed build cache (harness)
    $ASTRA_HOME/runs/                    optimize runs
    $ASTRA_HOME/baselines/<key>.json     the original timed against itself, reused across runs (astra.optimize.baseline_store)
    $ASTRA_HOME/drafts/<name>/           spec drafts written by `astra extract` (unreviewed)

Reviewed specs live in the repository's `extracted_kernels/` (or `$ASTRA_SPECS`); drafts never do.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

from astra.errors import BadInput

REPO_ROOT = Path(__file__).resolve().parent.parent
DATA_DIR = Path(__file__).resolve().parent / "data"  # package data: models.yaml, prices.yaml, clang/
SPECS_DIR = REPO_ROOT / "extracted_kernels"


def astra_home() -> Path:
    root = os.environ.get("ASTRA_HOME")
    try:
        path = Path(root).expanduser() if root else Path.home() / ".cache" / "astra"
    except RuntimeError:  # `~nosuchuser/...`, or no home directory at all
        raise BadInput(f"ASTRA_HOME {root or '(unset)'}: the home directory it names cannot be found; set "
                       "ASTRA_HOME to a folder Astra may write, e.g. ASTRA_HOME=/tmp/astra") from None
    path.mkdir(parents=True, exist_ok=True)
    return path


def safe_name(text: str, limit: int = 120) -> str:
    """`text` as one path component that stays where it is put: letters, digits and `_.+-` kept, anything
    else (`/`, `{`, spaces) as `_`, no leading dot (so never `.` or `..`), at most `limit` characters.
    Names from an SGLang tree (module names, versions) pass through here before they name a folder."""
    name = re.sub(r"[^A-Za-z0-9_.+-]", "_", str(text)).lstrip(".")[:limit]
    return name or "_"


def sub(name: str) -> Path:
    path = astra_home() / name
    path.mkdir(parents=True, exist_ok=True)
    return path


def specs_dir() -> Path:
    """Committed, reviewed specs; `ASTRA_SPECS` may point elsewhere (tests, user specs)."""
    root = os.environ.get("ASTRA_SPECS")
    return Path(root) if root else SPECS_DIR


def drafts_dir() -> Path:
    """Unreviewed spec drafts (`astra extract`): $ASTRA_HOME/drafts, never the repository."""
    return sub("drafts")
