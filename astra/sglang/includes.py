"""`#include` lines of CUDA/C++ sources, and the closure of SGLang files a source pulls in."""

from __future__ import annotations

import re
from pathlib import Path

from astra.sglang.tree import SglangTree

INCLUDE_RE = re.compile(r'^\s*#\s*include\s*[<"]([^>"]+)[>"]', re.M)


def includes_of(text: str) -> list[str]:
    """The names in a source's `#include <...>` / `#include "..."` lines, in order."""
    return INCLUDE_RE.findall(text)


def include_closure(tree: SglangTree, sources: list[Path]) -> list[Path]:
    """The sources and every file of the SGLang tree they include, transitively (system headers skipped)."""
    seen: dict[Path, None] = {}
    stack = list(sources)
    roots = [tree.include_dir, tree.csrc_dir]
    while stack:
        path = stack.pop()
        if path in seen or not path.is_file():
            continue
        seen[path] = None
        for inc in includes_of(path.read_text(errors="replace")):
            for base in [path.parent, *roots]:
                candidate = (base / inc).resolve()
                if candidate.is_file() and candidate.is_relative_to(tree.root.resolve()):
                    stack.append(candidate)
                    break
    return list(seen)
