"""Which SGLang tree a spec is run on: the one the user names (--sglang VERSION, --sglang-src PATH), else
the spec's own SGLang version (the installed package when it is that version, else its wheel). Every
command that runs a spec (bench, check, optimize, eval, survey, the MCP tools) and every worker that runs
one for them (astra.scale) chooses it here, so a kernel benched or optimized on a worker runs on the tree
the command line would have given."""

from __future__ import annotations

from pathlib import Path

from astra.sglang import tree as sglang_tree
from astra.spec.model import KernelSpec


def tree_for(spec: KernelSpec, version: str | None, src: str | None) -> sglang_tree.SglangTree:
    """The tree `spec` runs on (see the module docstring); a download happens once, then is reused."""
    if version or src:
        return sglang_tree.locate(version=version, src=src)
    own = spec_version(spec)
    installed = sglang_tree.find_installed()
    if installed is not None and installed.version == own:
        return installed  # the user's own install of that very version: no download
    return sglang_tree.from_wheel(own)


def tree_version(spec: KernelSpec | None, version: str | None, src: str | None) -> str:
    """The SGLang version `tree_for` would give, without downloading anything."""
    if src:
        return sglang_tree.from_source(Path(src)).version
    return version or spec_version(spec)


def spec_version(spec: KernelSpec) -> str:
    """The SGLang version the spec was extracted from."""
    return str(spec.raw["source"]["sglang_version"])
