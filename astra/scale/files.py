"""Small files that travel with a task's result: read on the worker, written on the driver.

On a Ray cluster a task's working files live on another machine; a task that wants some of them on
the driver returns `Artifacts(value, collect_files(folder, patterns))`, and the driver calls
`Outcome.write_artifacts(dest)` (or `write_files`). Paths are relative and POSIX-style; nothing is
written outside `dest`. Meant for reports, logs and verdict files, not for build trees: the total is
capped (`MAX_BYTES` by default).
"""

from __future__ import annotations

import os
from pathlib import Path, PurePosixPath

from astra.errors import BadInput

MAX_BYTES = 32 * 1024 * 1024


def collect_files(root: str | Path, patterns: tuple[str, ...] = ("**/*",), max_bytes: int = MAX_BYTES
                  ) -> dict[str, bytes]:
    """Every regular file under `root` matching one of the glob `patterns`, as {relative path: bytes}.
    Raises BadInput when they add up to more than `max_bytes` (inside a task that is its error)."""
    root = Path(root)
    out: dict[str, bytes] = {}
    total = 0
    for pattern in patterns:
        for path in sorted(root.glob(pattern)):
            rel = path.relative_to(root).as_posix()
            if rel in out or path.is_symlink() or not path.is_file():
                continue
            data = path.read_bytes()
            total += len(data)
            if total > max_bytes:
                raise BadInput(f"artifacts under {root} exceed {max_bytes} bytes (at {rel}); collect fewer files")
            out[rel] = data
    return out


def safe_relative(rel: str) -> PurePosixPath:
    """`rel` as a relative path that stays inside its folder, or BadInput."""
    path = PurePosixPath(rel)
    if not rel or path.is_absolute() or ".." in path.parts or "\\" in rel:
        raise BadInput(f"artifact path {rel!r} is not a plain relative path")
    return path


def write_files(files: dict[str, bytes], dest: str | Path) -> list[Path]:
    """Write {relative path: bytes} under `dest` (each file atomically); returns the paths written."""
    dest = Path(dest)
    written = []
    for rel, data in sorted(files.items()):
        target = dest.joinpath(*safe_relative(rel).parts)
        target.parent.mkdir(parents=True, exist_ok=True)
        tmp = target.with_name(f".{target.name}.{os.getpid()}.tmp")
        tmp.write_bytes(data)
        os.replace(tmp, target)
        written.append(target)
    return written
