"""The spec's kernel file is the tree's: `source.sha256` against the file `check`, `bench` and `optimize`
actually build. A spec reviewed for one SGLang version says nothing about another version's kernel (its
arguments, shapes and in-place contract may have changed), so a mismatch is refused, not warned about."""

from __future__ import annotations

from astra.errors import SpecError
from astra.sglang.tree import sha256_file
from astra.spec.model import KernelSpec


def require_same_source(spec: KernelSpec, tree) -> None:
    """Raise SpecError (exit 5) unless `tree`'s copy of the spec's kernel file has the spec's sha256."""
    source = spec.raw["source"]
    version, expected = source["sglang_version"], str(source["sha256"])
    path = tree.csrc_dir / spec.kernel_file
    where = tree.describe() if hasattr(tree, "describe") else f"SGLang {tree.version} at {tree.csrc_dir}"
    fixes = (f"use the spec's tree (`--sglang {version}`), or re-run `astra extract {spec.name}` with the same "
             f"--sglang/--sglang-src and review the draft before it replaces {spec.path}")
    if not path.is_file():
        raise SpecError(str(spec.path), [f"the kernel file {spec.kernel_file} is not in {where} ({path}); {fixes}"])
    actual = sha256_file(path)
    if actual != expected:
        raise SpecError(str(spec.path), [
            f"source.sha256 is {expected} (SGLang {version}), but {spec.kernel_file} in {where} has sha256 "
            f"{actual}: the spec was reviewed for another kernel; {fixes}"])
