"""The layout's rules, checked on the source (docs/architecture.md): one package per stage, one
concept per module (no size rule), argparse only at the CLI edge, no library module importing a command module, no cycle."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
ASTRA = ROOT / "astra"


def _modules() -> dict[str, Path]:
    out = {}
    for path in sorted(ASTRA.rglob("*.py")):
        name = ".".join(path.relative_to(ROOT).with_suffix("").parts)
        out[name.removesuffix(".__init__")] = path
    return out


def _imports(path: Path) -> set[str]:
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module:
            found.add(node.module)
            found.update(f"{node.module}.{alias.name}" for alias in node.names)
        elif isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
    return found


def test_top_level_holds_few_modules():
    top = sorted(p.name for p in ASTRA.glob("*.py"))
    assert len(top) <= 6, top


def test_argparse_only_in_the_cli():
    users = [name for name, path in _modules().items() if "argparse" in _imports(path)]
    assert users and all(name.startswith("astra.cli") for name in users), users


def test_no_library_module_imports_the_cli_and_no_cycles():
    modules = _modules()
    deps = {name: {d for d in _imports(path) if d in modules and d != name} for name, path in modules.items()}
    assert not [(m, d) for m, ds in deps.items() for d in ds if d.startswith("astra.cli") and not m.startswith("astra.cli")]

    def reaches(start: str, goal: str, seen: set[str]) -> bool:
        for nxt in deps[start]:
            if nxt == goal or (nxt not in seen and (seen.add(nxt) or reaches(nxt, goal, seen))):
                return True
        return False

    cyclic = [name for name in deps if not name.endswith(("astra", "astra.cli")) and reaches(name, name, set())]
    assert cyclic == []
