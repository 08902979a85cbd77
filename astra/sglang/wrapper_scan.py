"""Reading a JIT module's Python wrapper files with `ast`: functions, their local assignments, and the
places where they use the module that a `load_jit` loader returns (`module.<export>`,
`getattr(module, ...)`, `module["x"]`, helpers returning it). `wrapper_facts` builds on this.
"""

from __future__ import annotations

import ast
import copy
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

from astra.sglang.discovery import CallSite, _params
from astra.sglang.tree import SglangTree

ALLOCATORS = frozenset({"empty", "empty_like", "zeros", "zeros_like", "ones", "ones_like", "full", "full_like",
                        "new_empty", "new_zeros", "new_ones", "new_full", "empty_strided", "rand", "randn"})
_TENSOR_ATTRS = ("shape", "size", "dtype", "element_size", "numel", "stride", "device", "ndim", "dim")


@dataclass
class Value:
    """An expression in the calling function's terms: `expr` follows its local assignments."""

    expr: str
    tensor: str | None = None  # the tensor it is read from (`q` in `q.shape[-1]`)
    dim: int | None = None
    attr: str | None = None  # "dtype" | "shape" | "size" | "element_size" | "numel" | "stride" | ...
    written: str = ""  # as written at the call ("<default>": not passed, the loader's default)
    param: str | None = None  # the calling function's parameter it is (or falls back to)
    default: str | None = None  # that parameter's default
    allocated: bool = False  # a tensor the wrapper allocates


@lru_cache(maxsize=256)
def _parse(path: str, mtime: float) -> ast.Module:
    return ast.parse(Path(path).read_text(encoding="utf-8", errors="replace"))


def parse(path: Path) -> ast.Module | None:
    try:
        return _parse(str(path), path.stat().st_mtime)
    except (OSError, SyntaxError, ValueError, RecursionError):
        return None


def dotted(package_path: str) -> str:
    return package_path.removesuffix(".py").removesuffix("/__init__").replace("/", ".")


def own_nodes(fn: ast.AST):
    """Nodes of a function body, not descending into nested functions, lambdas or classes."""
    stack = list(ast.iter_child_nodes(fn))
    while stack:
        node = stack.pop()
        yield node
        if not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda, ast.ClassDef)):
            stack.extend(ast.iter_child_nodes(node))


def callee(node: ast.AST) -> str | None:
    if isinstance(node, ast.Call):
        f = node.func
        return f.id if isinstance(f, ast.Name) else f.attr if isinstance(f, ast.Attribute) else None
    return None


def _int(node: ast.AST | None) -> int | None:
    if isinstance(node, ast.Constant) and isinstance(node.value, int) and not isinstance(node.value, bool):
        return node.value
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub):
        inner = _int(node.operand)
        return -inner if inner is not None else None
    return None


class Fn:
    """One function: its parameters and local assignments (the last one before a line wins)."""

    def __init__(self, node, name: str, file: str):
        self.node, self.name, self.file = node, name, file
        self.params, self.defaults = _params(node)
        self.assigns: dict[str, list[tuple[int, ast.expr]]] = {}
        top = {id(stmt) for stmt in node.body}
        conditional: set[str] = set()
        for sub in own_nodes(node):
            if isinstance(sub, (ast.Assign, ast.AnnAssign)) and sub.value is not None:
                for target in (sub.targets if isinstance(sub, ast.Assign) else [sub.target]):
                    self._bind(target, sub.value, sub.lineno)
                    if id(sub) not in top:
                        conditional |= {n.id for n in ast.walk(target) if isinstance(n, ast.Name)}
        # assigned more than once, in a branch: which value holds depends on the path, so the name stays
        self.ambiguous = {n for n in conditional if len(self.assigns.get(n, [])) > 1}

    def _bind(self, target: ast.expr, value: ast.expr, line: int) -> None:
        if isinstance(target, ast.Name):
            self.assigns.setdefault(target.id, []).append((line, value))
        elif isinstance(target, ast.Tuple) and not any(isinstance(t, ast.Starred) for t in target.elts):
            for i, elt in enumerate(target.elts):
                src = value.elts[i] if isinstance(value, ast.Tuple) and len(value.elts) == len(target.elts) else \
                    ast.Subscript(value=value, slice=ast.Constant(i), ctx=ast.Load())
                self._bind(elt, src, line)

    def binding(self, name: str, line: int) -> tuple[int, ast.expr] | None:
        found = [(at, v) for at, v in self.assigns.get(name, []) if at < line]
        return max(found, key=lambda b: b[0]) if found else None

    def resolve(self, node: ast.expr, line: int, depth: int = 0, keep_allocations: bool = False) -> ast.expr:
        """`node` with local names replaced by what they were last assigned before `line`."""
        fn = self

        class Sub(ast.NodeTransformer):
            def visit_Name(self, n):
                bound = fn.binding(n.id, line) if depth < 4 and isinstance(n.ctx, ast.Load) and \
                    n.id not in fn.ambiguous else None
                if bound is None or (keep_allocations and _allocates(bound[1])):
                    return n
                return fn.resolve(bound[1], bound[0], depth + 1, keep_allocations)

        return Sub().visit(copy.deepcopy(node))

    def value(self, node: ast.expr, line: int) -> Value:
        """What `node` is at `line`: a wrapper allocation is spelled out only when it is the value itself
        (`out` -> `torch.empty_like(x)`); inside a larger expression it stays a name (`out.dtype`)."""
        resolved = self.resolve(node, line)
        if not _allocates(resolved):
            resolved = self.resolve(node, line, keep_allocations=True)
        text = ast.unparse(resolved)
        if len(text) > 300:
            resolved, text = node, ast.unparse(node)
        attr, tensor, dim = _access(resolved)
        param = None
        for cand in [node, resolved] + (resolved.values if isinstance(resolved, ast.BoolOp) else []):
            if isinstance(cand, ast.Name) and cand.id in self.params:
                param = cand.id
                break
        return Value(text, tensor, dim, attr, ast.unparse(node), param, self.defaults.get(param), _allocates(resolved))


def _allocates(node: ast.expr) -> bool:
    branches = (node.body, node.orelse) if isinstance(node, ast.IfExp) else (node,)
    return any(callee(b) in ALLOCATORS for b in branches)


def _access(node: ast.expr) -> tuple[str | None, str | None, int | None]:
    """The tensor property an expression reads: (attr, tensor, dim); the expression itself first, then
    the first one with a dimension (`x.shape[-1] * x.element_size()` -> shape of x, dim -1)."""
    found: list[tuple[str, str, int | None]] = []
    seen: set[int] = set()
    for sub in ast.walk(node):
        if id(sub) in seen:
            continue
        if isinstance(sub, ast.Subscript) and isinstance(sub.value, ast.Attribute) and sub.value.attr == "shape":
            seen.add(id(sub.value))
            found.append(("shape", ast.unparse(sub.value.value), _int(sub.slice)))
        elif isinstance(sub, ast.Call) and isinstance(sub.func, ast.Attribute) and sub.func.attr in _TENSOR_ATTRS:
            seen.add(id(sub.func))
            arg = sub.args[0] if sub.args else next((k.value for k in sub.keywords if k.arg == "dim"), None)
            found.append((sub.func.attr, ast.unparse(sub.func.value), _int(arg)))
        elif isinstance(sub, ast.Attribute) and sub.attr in _TENSOR_ATTRS:
            found.append((sub.attr, ast.unparse(sub.value), None))
    found = [f for f in found if f[1] != "torch" and not f[1].startswith("torch.")]
    if not found:
        return None, None, None
    if isinstance(node, (ast.Subscript, ast.Call, ast.Attribute)) and found[0]:  # the expression is one read
        first = found[0]
        if ast.unparse(node).startswith(first[1] + "."):
            return first
    best = next((f for f in found if f[2] is not None), None) or next(
        (f for f in found if f[0] in ("shape", "size")), None) or found[0]
    return best


class File:
    """A wrapper file: its functions (qualified names), the loader and the helpers returning it."""

    def __init__(self, module: ast.Module, rel: str, loader: str, exports: set[str]):
        self.module, self.rel, self.exports = module, rel, exports
        self.fns: dict[str, Fn] = {}
        for node in module.body:
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                self.fns[node.name] = Fn(node, node.name, rel)
            elif isinstance(node, ast.ClassDef):
                for sub in node.body:
                    if isinstance(sub, (ast.FunctionDef, ast.AsyncFunctionDef)):
                        self.fns[f"{node.name}.{sub.name}"] = Fn(sub, f"{node.name}.{sub.name}", rel)
        self.loaders = {loader}
        self.returned_export: str | None = None
        self.globals: dict[str, ast.Call] = {}  # module-level `_module = load_jit(...)`
        if loader == "<module>":
            for node in module.body:
                if isinstance(node, ast.Assign) and callee(node.value) == "load_jit":
                    self.globals.update({t.id: node.value for t in node.targets if isinstance(t, ast.Name)})
        elif loader in self.fns:
            for ret in (n for n in own_nodes(self.fns[loader].node) if isinstance(n, ast.Return)):
                if isinstance(ret.value, ast.Attribute):  # `return load_jit(...).export`
                    self.returned_export = ret.value.attr
        for name, fn in self.fns.items():  # one level of in-file helpers returning the loaded module
            rets = [n.value for n in own_nodes(fn.node) if isinstance(n, ast.Return) and n.value is not None]
            if name != loader and rets and all(callee(r) == loader for r in rets):
                self.loaders.add(name)

    def _wanted(self, name: str) -> bool:
        return not name.startswith("__") and (not self.exports or name in self.exports)

    def refs(self, fn: Fn, node: ast.expr, line: int, depth: int = 0) -> list[tuple[str, ast.Call | None, Fn]]:
        """Exports an expression denotes: (export, the loader call that produced the module, its function)."""
        if depth > 8:
            return []
        if isinstance(node, ast.Subscript) and isinstance(node.slice, ast.Constant) and isinstance(node.slice.value, int):
            return self._element(fn, node.value, node.slice.value, line, depth + 1)
        if isinstance(node, (ast.Attribute, ast.Subscript)) or (callee(node) == "getattr" and node.args):
            base = node.args[0] if isinstance(node, ast.Call) else node.value
            origin = self._module_of(fn, base, line)
            if origin is None:
                return []
            if isinstance(node, ast.Attribute):
                name = node.attr
            elif isinstance(node, ast.Subscript):
                name = node.slice.value if isinstance(node.slice, ast.Constant) else "{" + ast.unparse(node.slice) + "}"
            else:
                arg = node.args[1] if len(node.args) > 1 else None
                name = arg.value if isinstance(arg, ast.Constant) else "{" + (ast.unparse(arg) if arg else "?") + "}"
            return [(str(name), *origin)] if self._wanted(str(name)) or "{" in str(name) else []
        if isinstance(node, ast.IfExp):
            return self.refs(fn, node.body, line, depth + 1) + self.refs(fn, node.orelse, line, depth + 1)
        if isinstance(node, ast.Name):
            if self.returned_export and self._module_of(fn, node, line):
                return [(self.returned_export, *self._module_of(fn, node, line))]
            bound = fn.binding(node.id, line)
            return self.refs(fn, bound[1], bound[0], depth + 1) if bound else []
        if isinstance(node, ast.Call) and callee(node) in self.loaders:
            return [(self.returned_export, node, fn)] if self.returned_export else []
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in self.fns:
            helper = self.fns[node.func.id]
            rets = [n for n in own_nodes(helper.node) if isinstance(n, ast.Return) and n.value is not None]
            return [r for ret in rets for r in self.refs(helper, ret.value, ret.lineno, depth + 1)]
        if isinstance(node, ast.Tuple):
            return [r for elt in node.elts for r in self.refs(fn, elt, line, depth + 1)]
        return []

    def _element(self, fn: Fn, node: ast.expr, i: int, line: int, depth: int) -> list:
        """Exports denoted by element `i` of a tuple: `a, b = _get_entries()` where it returns `(m["a"], m["b"])`."""
        if depth > 8:
            return []
        if isinstance(node, ast.Tuple):
            return self.refs(fn, node.elts[i], line, depth + 1) if i < len(node.elts) else []
        if isinstance(node, ast.Name) and fn.binding(node.id, line):
            at, value = fn.binding(node.id, line)
            return self._element(fn, value, i, at, depth + 1)
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in self.fns:
            helper = self.fns[node.func.id]
            rets = [n for n in own_nodes(helper.node) if isinstance(n, ast.Return) and n.value is not None]
            return [r for ret in rets for r in self._element(helper, ret.value, i, ret.lineno, depth + 1)]
        return []

    def _module_of(self, fn: Fn, node: ast.expr, line: int, depth: int = 0) -> tuple[ast.Call | None, Fn] | None:
        if isinstance(node, ast.Call) and callee(node) in self.loaders:
            return node, fn
        if isinstance(node, ast.Name):
            if node.id in self.globals and fn.binding(node.id, line) is None:
                return None, fn
            bound = fn.binding(node.id, line)
            if bound and depth < 4:
                value = bound[1]
                for branch in ((value.body, value.orelse) if isinstance(value, ast.IfExp) else (value,)):
                    found = self._module_of(fn, branch, bound[0], depth + 1)
                    if found:
                        return found
        return None


def export_calls(file: File, fn: Fn) -> list[tuple[str, ast.Call, ast.Call | None, Fn]]:
    """(export, call node, loader call, function holding the loader call) for each export call of `fn`."""
    out = []
    for node in own_nodes(fn.node):
        if isinstance(node, ast.Call):
            for export, loader_call, holder in file.refs(fn, node.func, node.lineno):
                out.append((export, node, loader_call, holder))
    return sorted(out, key=lambda c: c[1].lineno)


def handed_to_helpers(file: File, fn: Fn) -> list[tuple[str, ast.Call, ast.Call | None, Fn, Fn]]:
    """Exports passed as an argument to an in-file function and called there through its parameter."""
    out = []
    for node in own_nodes(fn.node):
        if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in file.fns):
            continue
        helper = file.fns[node.func.id]
        for i, arg in enumerate(node.args):
            refs = file.refs(fn, arg, node.lineno)
            if not refs or i >= len(helper.params):
                continue
            param = helper.params[i]
            for inner in own_nodes(helper.node):
                if isinstance(inner, ast.Call) and isinstance(inner.func, ast.Name) and inner.func.id == param:
                    out += [(export, inner, loader_call, holder, helper) for export, loader_call, holder in refs]
    return out


def wrapper_files(tree: SglangTree, site: CallSite) -> list[tuple[str, ast.Module, str]]:
    """The loader's file, then kernel files importing the loader from it: (package path, ast, loader name)."""
    own = parse(tree.root / site.file)
    out = [(site.file, own, site.loader)] if own is not None else []
    if site.loader == "<module>":
        return out
    mod = dotted(site.file)
    for path, text in kernel_texts(str(tree.root)).items():
        if path == site.file or mod.rsplit(".", 1)[-1] not in text or site.loader not in text:
            continue
        module = parse(tree.root / path)
        for node in ast.walk(module) if module else []:
            if isinstance(node, ast.ImportFrom) and import_source(node, path) == mod:
                out += [(path, module, a.asname or a.name) for a in node.names if a.name == site.loader]
    return out


@lru_cache(maxsize=4)
def kernel_texts(root: str) -> dict[str, str]:
    base = Path(root) / "sglang"
    out = {}
    for sub in ("kernels", "jit_kernel"):
        for path in sorted((base / sub).rglob("*.py")):
            rel = path.relative_to(root).as_posix()
            if "/tests/" not in rel and "/benchmark" not in rel:
                out[rel] = path.read_text(encoding="utf-8", errors="replace")
    return out


def import_source(node: ast.ImportFrom, rel: str) -> str:
    """The absolute module of `from X import ...` written in the file at package path `rel`."""
    if not node.level:
        return node.module or ""
    parts = dotted(rel).split(".")
    base = parts[: len(parts) - node.level + (1 if rel.endswith("__init__.py") else 0)]
    return ".".join(base + ([node.module] if node.module else []))
