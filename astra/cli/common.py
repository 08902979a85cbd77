"""What several command groups share: which SGLang tree, and writing an output file."""

from __future__ import annotations

from pathlib import Path

from astra.errors import AstraError
from astra.sglang import tree as sglang_tree
from astra.spec import model as spec_mod
from astra.spec import trees


def check_tree_flags(args) -> None:
    for flag, attr in (("--sglang", "sglang"), ("--sglang-src", "sglang_src")):
        value = getattr(args, attr, None)
        if value is not None and not value.strip():
            raise AstraError(f"{flag}: empty; give {'a release such as 0.5.23' if attr == 'sglang' else 'the path of an SGLang checkout or unpacked package'}, or leave it out")


def tree(args) -> sglang_tree.SglangTree:
    """--sglang VERSION, --sglang-src PATH, else the installed package, else the pinned default wheel."""
    check_tree_flags(args)
    return sglang_tree.locate(version=getattr(args, "sglang", None), src=getattr(args, "sglang_src", None))


def tree_for_spec(args, name: str) -> sglang_tree.SglangTree:
    """The spec's own SGLang version unless the user names another tree (astra.spec.trees)."""
    check_tree_flags(args)
    version, src = getattr(args, "sglang", None), getattr(args, "sglang_src", None)
    if version or src:
        return tree(args)
    return trees.tree_for(spec_mod.load(name), None, None)


def check_output(path: str | None, flag: str = "--json") -> None:
    """Refuse an output path before the work is done: empty, a directory, or in a folder that does not exist."""
    if path is None:
        return
    if not path.strip():
        raise AstraError(f"{flag}: empty; give a file name such as out.json, or leave it out")
    target = Path(path)
    if target.is_dir():
        raise AstraError(f"{flag} {path}: is a directory; give a file name such as {target / 'out.json'}")
    if not target.parent.is_dir():
        raise AstraError(f"{flag} {path}: the folder {target.parent} does not exist")


def check_output_dir(path: str | None, flag: str) -> None:
    """An output folder the command fills: it may not exist yet, but it may not be a file."""
    if path is None:
        return
    if not path.strip():
        raise AstraError(f"{flag}: empty; give a folder, or leave it out")
    if Path(path).exists() and not Path(path).is_dir():
        raise AstraError(f"{flag} {path}: is a file, not a folder")


def write_text(path: str | None, text: str, flag: str = "--json") -> None:
    """Write an output file the user named; a directory or an unwritable place is a one-line error."""
    if path is None:
        return
    check_output(path, flag)
    try:
        Path(path).write_text(text)
    except OSError as err:
        raise AstraError(f"{flag} {path}: cannot write ({err.strerror or err})") from None
