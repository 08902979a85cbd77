"""What several command groups share: which SGLang tree, and writing an output file."""

from __future__ import annotations

from pathlib import Path

from astra.errors import AstraError
from astra.sglang import tree as sglang_tree
from astra.spec import model as spec_mod


def tree(args) -> sglang_tree.SglangTree:
    """--sglang VERSION, --sglang-src PATH, else the installed package, else the pinned default wheel."""
    return sglang_tree.locate(version=getattr(args, "sglang", None), src=getattr(args, "sglang_src", None))


def tree_for_spec(args, name: str) -> sglang_tree.SglangTree:
    """The spec's own SGLang version unless the user names another tree."""
    if getattr(args, "sglang", None) or getattr(args, "sglang_src", None):
        return tree(args)
    spec = spec_mod.load(name)
    version = str(spec.raw["source"]["sglang_version"])
    installed = sglang_tree.find_installed()
    if installed is not None and installed.version == version:
        return installed  # the user's own install of that very version: no download
    return sglang_tree.from_wheel(version)


def write_text(path: str | None, text: str, flag: str = "--json") -> None:
    """Write an output file the user named; a directory or an unwritable place is a one-line error."""
    if not path:
        return
    target = Path(path)
    if target.is_dir():
        raise AstraError(f"{flag} {path}: is a directory; give a file name such as {target / 'out.json'}")
    try:
        target.write_text(text)
    except OSError as err:
        raise AstraError(f"{flag} {path}: cannot write ({err.strerror or err})") from None
