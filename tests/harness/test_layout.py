"""The harness's layout rules, checked on the source: it runs on a bare GPU box, so its modules import only
torch, apache-tvm-ffi, the standard library and the harness itself (never astra), and no module takes part
in an import cycle. Every import counts, the ones inside functions (lazy) and under TYPE_CHECKING too: a
cycle hidden in a function body still breaks whichever import happens to run first."""

from __future__ import annotations

import ast
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
HARNESS = ROOT / "harness"
ALLOWED = {"torch", "tvm_ffi", "pyseccomp", "harness"}  # pyseccomp: the OS sandbox's seccomp filters (harness.sandbox)
OPTIONAL = {"pynvml"}  # imported only inside a try/except ImportError (harness.timing.perf_model): never required


def _modules() -> dict[str, Path]:
    out = {}
    for path in sorted(HARNESS.rglob("*.py")):
        name = ".".join(path.relative_to(ROOT).with_suffix("").parts)
        out[name.removesuffix(".__init__")] = path
    return out


def _imported(path: Path) -> list[tuple[str, list[str]]]:
    """(module, names imported from it) for every import statement anywhere in the file."""
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom):
            assert node.level == 0 and node.module, f"{path}: relative import"
            found.append((node.module, [alias.name for alias in node.names]))
        elif isinstance(node, ast.Import):
            found.extend((alias.name, []) for alias in node.names)
    return found


def _dependencies(modules: dict[str, Path]) -> dict[str, set[str]]:
    """The harness modules each module imports (`from harness.x import y` counts as harness.x.y when y is
    a module itself)."""
    deps: dict[str, set[str]] = {}
    for name, path in modules.items():
        targets = set()
        for module, names in _imported(path):
            if module.split(".")[0] != "harness":
                continue
            submodules = {f"{module}.{n}" for n in names} & modules.keys()
            targets |= submodules if submodules else {module}
        deps[name] = {t for t in targets if t != name}
    return deps


def test_harness_imports_only_torch_tvm_ffi_and_the_standard_library():
    stray = sorted({(name, module) for name, path in _modules().items() for module, _ in _imported(path)
                    if (top := module.split(".")[0]) not in ALLOWED | OPTIONAL and top not in sys.stdlib_module_names})
    assert stray == []


def test_every_harness_import_names_a_harness_module():
    modules = _modules()
    unknown = sorted({(name, target) for name, targets in _dependencies(modules).items() for target in targets
                      if target not in modules})
    assert unknown == []


def test_no_import_cycle_in_the_harness():
    deps = _dependencies(_modules())
    cycles: list[list[str]] = []
    state: dict[str, str] = {}  # "open" while on the path, "done" after

    def visit(name: str, path: list[str]) -> None:
        state[name] = "open"
        for nxt in sorted(deps.get(name, ())):
            if state.get(nxt) == "open":
                cycles.append(path[path.index(nxt):] + [nxt])
            elif nxt not in state:
                visit(nxt, path + [nxt])
        state[name] = "done"

    for name in sorted(deps):
        if name not in state:
            visit(name, [name])
    assert cycles == []


def test_the_test_tree_mirrors_the_rooms():
    """tests/harness holds one folder per room of the harness (a package), and no test outside them but this one."""
    rooms = {p.name for p in HARNESS.iterdir() if (p / "__init__.py").exists()}
    tests = ROOT / "tests" / "harness"
    folders = {p.name for p in tests.iterdir() if p.is_dir() and p.name != "__pycache__"}
    assert folders <= rooms, folders - rooms
    assert all((tests / folder / "__init__.py").exists() for folder in folders)
    assert sorted(p.name for p in tests.glob("test_*.py")) == ["test_layout.py"]
