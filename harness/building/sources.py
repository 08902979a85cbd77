"""Source-side inputs of a build: the generated wrapper, content digests, and the candidate overlay.

An overlay is a mirror of one root (csrc or an include dir) as real directories of symlinked files, in
which the overridden files are real files holding the candidate's text (and every directory on the way to
one is a real directory of the overlay: nothing is written through a symlink into a source tree). Quoted includes resolve relative
to the including file's path as written (not its symlink target), so a candidate's siblings resolve to
the originals and an original that includes the overridden file gets the candidate.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import threading
import uuid
from pathlib import Path

from harness.building.toolchain import BuildFailure

FFI_INCLUDES = (
    "tvm/ffi/container/tensor.h",
    "tvm/ffi/dtype.h",
    "tvm/ffi/error.h",
    "tvm/ffi/extra/c_env_api.h",
    "tvm/ffi/function.h",
)
SOURCE_SUFFIXES = frozenset({".cuh", ".h", ".cu", ".hpp", ".cpp", ".cc", ".cxx", ".hh", ".inl", ".inc"})


def wrapper_source(files: list[str], wrappers: list[tuple[str, str]]) -> str:
    """The translation unit SGLang generates: tvm-ffi includes, the kernel files, the exports."""
    lines = [f"#include <{header}>" for header in FFI_INCLUDES]
    lines += [f'#include "{path}"' for path in files]
    lines.append("namespace sglang {")
    lines += [f"TVM_FFI_DLL_EXPORT_TYPED_FUNC({export}, ({entry}));" for export, entry in wrappers]
    lines.append("}  // namespace sglang")
    return "\n".join(lines) + "\n"


_DIGESTS: dict[tuple[str, int, int], str] = {}
_DIGESTS_LOCK = threading.Lock()


def file_digest(path: str) -> str:
    """sha256 of a file's bytes, memoised by (path, mtime, size); "missing" if it does not exist."""
    try:
        stat = os.stat(path)
    except FileNotFoundError:
        return "missing"
    memo_key = (path, stat.st_mtime_ns, stat.st_size)
    with _DIGESTS_LOCK:
        if memo_key in _DIGESTS:
            return _DIGESTS[memo_key]
    digest = hashlib.sha256(Path(path).read_bytes()).hexdigest()
    with _DIGESTS_LOCK:
        _DIGESTS[memo_key] = digest
    return digest


def tree_digest(roots: list[str]) -> str:
    """One hash over every C/C++/CUDA source under each root (path relative to its root + content)."""
    hasher = hashlib.sha256()
    for index, root in enumerate(roots):
        for dirpath, dirnames, filenames in os.walk(root):
            dirnames.sort()
            for filename in sorted(filenames):
                if Path(filename).suffix in SOURCE_SUFFIXES:
                    path = os.path.join(dirpath, filename)
                    hasher.update(f"{index}:{os.path.relpath(path, root)}:{file_digest(path)}\n".encode())
    return hasher.hexdigest()


def override_targets(overrides: dict[str, str], roots: list[str]) -> dict[int, dict[str, str]]:
    """Group overrides by the root whose file they replace: {root index: {relative path: text}}.

    A relative path goes to the first root that has that file (roots[0], the source root, when none
    does: a new file); an absolute one to the root it lies under.
    """
    roots = [os.path.abspath(root) for root in roots]
    targets: dict[int, dict[str, str]] = {}
    for path, text in sorted(overrides.items()):
        index, rel = 0, path
        if os.path.isabs(path):
            owners = [i for i, root in enumerate(roots) if os.path.abspath(path).startswith(root + os.sep)]
            if not owners:
                raise BuildFailure(f"override {path} is outside source_root and include_dirs")
            index, rel = owners[0], os.path.relpath(os.path.abspath(path), roots[owners[0]])
        elif ".." in Path(path).parts:
            raise BuildFailure(f"override path {path!r} must not contain '..'")
        else:
            index = next((i for i, root in enumerate(roots) if os.path.isfile(os.path.join(root, path))), 0)
        targets.setdefault(index, {})[rel] = text
    return targets


def _link_entries(source_dir: str, target_dir: Path) -> None:
    """Symlink every entry of `source_dir` (files and directories alike) into the real `target_dir`."""
    for name in sorted(os.listdir(source_dir)):
        os.symlink(os.path.join(source_dir, name), target_dir / name)


def _materialise_parents(dest: Path, rel: str) -> Path:
    """Make every directory on the way to `dest/rel` a real directory of `dest` (a symlinked directory
    becomes a real one holding symlinks to its entries) and return the file's path in `dest`."""
    current = dest
    for part in Path(rel).parts[:-1]:
        current = current / part
        if current.is_symlink():
            source = os.readlink(current)
            current.unlink()
            current.mkdir()
            if os.path.isdir(source):
                _link_entries(source, current)
        elif not current.exists():
            current.mkdir()
    return current / Path(rel).name


def _inside(path: Path, root: Path) -> bool:
    real, base = os.path.realpath(path), os.path.realpath(root)
    return real == base or real.startswith(base + os.sep)


def _mirror(root: Path, dest: Path, replacements: dict[str, str]) -> None:
    """Recreate `root` under `dest` as real directories of symlinked files, then write replacements.

    Contract: nothing is ever written through a symlink. Every directory on the path to a replaced file
    is materialised as a real directory of the overlay, the file's own symlink is removed, and the path
    is checked (os.path.realpath) to lie inside the overlay before the text is written.
    """
    for dirpath, dirnames, filenames in os.walk(root):
        target_dir = dest / os.path.relpath(dirpath, root)
        target_dir.mkdir(parents=True, exist_ok=True)
        linked_dirs = [name for name in dirnames if os.path.islink(os.path.join(dirpath, name))]
        for name in filenames + linked_dirs:  # os.walk does not descend into symlinked directories
            os.symlink(os.path.join(dirpath, name), target_dir / name)
    for rel, text in replacements.items():
        if os.path.isabs(rel) or ".." in Path(rel).parts:
            raise BuildFailure(f"override path {rel!r} must be relative and stay inside its root")
        path = _materialise_parents(dest, rel)
        if path.is_symlink():
            path.unlink()
        if not _inside(path.parent, dest) or (path.exists() and not _inside(path, dest)):
            raise BuildFailure(f"override {rel!r} would be written outside the overlay")
        path.write_text(text)


def materialise_overlay(overlay: Path, roots: list[str], targets: dict[int, dict[str, str]]) -> None:
    """Create `overlay/root<i>` for each targeted root once: staged, then renamed into place.

    Safe under concurrency: a builder that loses the rename race drops its copy.
    """
    if (overlay / ".done").exists():
        return
    overlay.parent.mkdir(parents=True, exist_ok=True)
    staging = overlay.parent / f".staging-{uuid.uuid4().hex}"
    try:
        for index, replacements in targets.items():
            _mirror(Path(roots[index]).resolve(), staging / f"root{index}", replacements)
        (staging / ".done").touch()
        try:
            os.rename(staging, overlay)
        except OSError:
            if not (overlay / ".done").exists():
                raise  # not a lost race with another builder: a real error
    finally:
        shutil.rmtree(staging, ignore_errors=True)
