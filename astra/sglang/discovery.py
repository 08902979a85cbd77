"""Discovery of SGLang's JIT modules from the Python call sites of `load_jit(...)`, parsed with `ast`.

For every call site we record what SGLang passes: module-name arguments, CUDA and C++ files, the
wrappers (export name -> C++ entry, template arguments kept symbolic where they come from
`make_cpp_args`), extra flags, include paths, dependencies, header_only, the Python functions that
call the loader, and their `register_custom_op(mutates_args=...)`.

Values that cannot be read statically stay as source text in braces (`{expr}`), never guessed here.
"""

from __future__ import annotations

import ast
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

from astra.input_files import Refused, depth
from astra.sglang.py_constants import int_constants
from astra.sglang.tree import SglangTree, read_tree_text

LIST_KWARGS = ("cuda_files", "cpp_files", "extra_cuda_cflags", "extra_cflags", "extra_ldflags",
               "extra_include_paths", "extra_dependencies")


@dataclass
class Wrapper:
    export: str
    entry: str  # C++ entry, e.g. "FusedAddRMSNormKernel<{args}>::run"
    lang: str  # "cuda" | "cpp"


@dataclass
class Caller:
    name: str
    line: int
    params: list[str]
    mutates_args: list[str] | None  # from @register_custom_op(mutates_args=...); None: not registered
    defaults: dict[str, str] = field(default_factory=dict)


@dataclass
class CallSite:
    file: str  # package path, e.g. sglang/kernels/ops/layernorm/norm.py
    line: int
    loader: str  # the function holding the load_jit call ("<module>" at top level)
    loader_params: list[str]
    loader_defaults: dict[str, str]
    module_name: str
    name_args: list[str]  # the remaining *args, as source text
    template_args: dict[str, list[str]]  # variable -> make_cpp_args(...) arguments, as source text
    cuda_files: list[str] = field(default_factory=list)
    cpp_files: list[str] = field(default_factory=list)
    wrappers: list[Wrapper] = field(default_factory=list)
    extra_cuda_cflags: list[str] = field(default_factory=list)
    extra_cflags: list[str] = field(default_factory=list)
    extra_ldflags: list[str] = field(default_factory=list)
    extra_include_paths: list[str] = field(default_factory=list)
    extra_dependencies: list[str] = field(default_factory=list)
    header_only: bool = True
    guards: list[str] = field(default_factory=list)  # enclosing `if` tests, as source text
    callers: list[Caller] = field(default_factory=list)
    # integer constants of the loader's module (`_WARPS = 8`, `TMA_STAGE_BYTES = 32 * 1024`), as C++ text
    module_constants: dict[str, str] = field(default_factory=dict)


def _src(node: ast.AST, text: str) -> str:
    return ast.get_source_segment(text, node) or ast.unparse(node)


class _Scope:
    """Name resolution inside one function (or the module): the last assignment before a line."""

    def __init__(self, body: list[ast.stmt], module_scope: "_Scope | None" = None):
        self.assigns: dict[str, list[tuple[int, ast.expr]]] = {}
        self.parent = module_scope
        for node in body:
            for sub in ast.walk(node) if not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) else []:
                if isinstance(sub, ast.Assign) and len(sub.targets) == 1 and isinstance(sub.targets[0], ast.Name):
                    self.assigns.setdefault(sub.targets[0].id, []).append((sub.lineno, sub.value))
                elif isinstance(sub, ast.AnnAssign) and isinstance(sub.target, ast.Name) and sub.value:
                    self.assigns.setdefault(sub.target.id, []).append((sub.lineno, sub.value))

    def lookup(self, name: str, line: int) -> ast.expr | None:
        found = [value for at, value in self.assigns.get(name, []) if at < line]
        if found:
            return found[-1]
        return self.parent.lookup(name, 10**9) if self.parent else None


class _Evaluator:
    """Turns call-site expressions into strings or lists of strings, keeping the unknown symbolic.

    `assume` maps the source text of an `if` test to the branch taken, so that the module name
    `"activation" if fast_math else "rounded_activation"` pairs with the flags chosen by the same test.
    """

    def __init__(self, text: str, scope: _Scope, line: int, assume: dict[str, bool],
                 functions: dict[str, ast.FunctionDef] | None = None):
        self.text, self.scope, self.line, self.assume = text, scope, line, assume
        self.functions = functions or {}

    def string(self, node: ast.expr, depth: int = 0) -> str:
        if depth > 8:
            return "{" + _src(node, self.text) + "}"
        if isinstance(node, ast.Constant):
            return str(node.value)
        if isinstance(node, ast.JoinedStr):
            out = []
            for part in node.values:
                if isinstance(part, ast.Constant):
                    out.append(str(part.value))
                elif isinstance(part.value, ast.Name) and isinstance(
                        self.scope.lookup(part.value.id, self.line), ast.Constant):
                    out.append(str(self.scope.lookup(part.value.id, self.line).value))
                else:
                    out.append("{" + _src(part.value, self.text) + "}")
            return "".join(out)
        if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Add):
            return self.string(node.left, depth + 1) + self.string(node.right, depth + 1)
        if isinstance(node, ast.IfExp):
            return self.string(self._branch(node), depth + 1)
        if isinstance(node, ast.Call) and len(node.args) == 1 and not node.keywords:
            return self.string(node.args[0], depth + 1)  # make_name("x"), str(x)
        if isinstance(node, ast.Name):
            value = self.scope.lookup(node.id, self.line)
            if value is not None:
                return self.string(value, depth + 1)
        return "{" + _src(node, self.text) + "}"

    def strings(self, node: ast.expr, depth: int = 0) -> list[str]:
        if depth > 8:
            return ["{" + _src(node, self.text) + "}"]
        if isinstance(node, (ast.List, ast.Tuple)):
            out: list[str] = []
            for elt in node.elts:
                if isinstance(elt, ast.Starred):
                    out += self.strings(elt.value, depth + 1)
                else:
                    out.append(self.string(elt, depth + 1))
            return out
        if isinstance(node, ast.Constant) and node.value is None:
            return []
        if isinstance(node, ast.IfExp):
            return self.strings(self._branch(node), depth + 1)
        if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Add):
            return self.strings(node.left, depth + 1) + self.strings(node.right, depth + 1)
        if isinstance(node, ast.BoolOp) and isinstance(node.op, ast.Or):
            return self.strings(node.values[0], depth + 1)  # `flags or []`
        if isinstance(node, ast.Name):
            value = self.scope.lookup(node.id, self.line)
            if value is not None:
                return self.strings(value, depth + 1)
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in self.functions:
            returned = _first_list_return(self.functions[node.func.id])
            if returned is not None:  # e.g. get_activation_cuda_cflags(): the CUDA branch comes first
                return [str(v) for v in returned]
        return ["{" + _src(node, self.text) + "}"]

    def wrappers(self, node: ast.expr, lang: str) -> list[Wrapper]:
        if isinstance(node, ast.Name):
            value = self.scope.lookup(node.id, self.line)
            return self.wrappers(value, lang) if value is not None else []
        if isinstance(node, ast.IfExp):
            return self.wrappers(self._branch(node), lang)
        if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Add):
            return self.wrappers(node.left, lang) + self.wrappers(node.right, lang)
        out = []
        if isinstance(node, (ast.List, ast.Tuple)):
            for elt in node.elts:
                if isinstance(elt, ast.Tuple) and len(elt.elts) == 2:
                    out.append(Wrapper(self.string(elt.elts[0]), self.string(elt.elts[1]), lang))
        elif isinstance(node, ast.ListComp) and isinstance(node.elt, ast.Tuple) and len(node.elt.elts) == 2:
            out.append(Wrapper(self.string(node.elt.elts[0]), self.string(node.elt.elts[1]), lang))
        return out

    def _branch(self, node: ast.IfExp) -> ast.expr:
        test = _src(node.test, self.text)
        return node.body if self.assume.get(test, True) else node.orelse


def _first_list_return(fn: ast.FunctionDef) -> list | None:
    """The first `return [literal, ...]` of a helper function that builds flags."""
    returns = sorted((n for n in ast.walk(fn) if isinstance(n, ast.Return)), key=lambda n: n.lineno)
    for node in returns:
        if isinstance(node.value, ast.List):
            try:
                return ast.literal_eval(node.value)
            except ValueError:
                return None
    return None


def _name_variants(node: ast.expr, text: str) -> list[tuple[ast.expr, dict[str, bool]]]:
    """Each module name a call site can produce, with the `if` assumptions that produce it."""
    if isinstance(node, ast.IfExp):
        test = _src(node.test, text)
        return [(n, {**a, test: True}) for n, a in _name_variants(node.body, text)] + [
            (n, {**a, test: False}) for n, a in _name_variants(node.orelse, text)
        ]
    return [(node, {})]


def _is_load_jit(call: ast.Call) -> bool:
    func = call.func
    return (isinstance(func, ast.Name) and func.id == "load_jit") or (
        isinstance(func, ast.Attribute) and func.attr == "load_jit"
    )


def _mutates_args(fn: ast.FunctionDef | ast.AsyncFunctionDef) -> list[str] | None:
    for dec in fn.decorator_list:
        if isinstance(dec, ast.Call):
            name = dec.func.attr if isinstance(dec.func, ast.Attribute) else getattr(dec.func, "id", "")
            if name == "register_custom_op":
                for kw in dec.keywords:
                    if kw.arg == "mutates_args":
                        try:
                            return [str(v) for v in ast.literal_eval(kw.value)]
                        except ValueError:
                            return ["{" + ast.unparse(kw.value) + "}"]
                return []
    return None


def _params(fn: ast.FunctionDef | ast.AsyncFunctionDef) -> tuple[list[str], dict[str, str]]:
    args = fn.args
    positional = args.posonlyargs + args.args
    names = [a.arg for a in positional + args.kwonlyargs]
    defaults = {}
    for arg, default in zip(positional[len(positional) - len(args.defaults):], args.defaults):
        defaults[arg.arg] = ast.unparse(default)
    for arg, default in zip(args.kwonlyargs, args.kw_defaults):
        if default is not None:
            defaults[arg.arg] = ast.unparse(default)
    return names, defaults


def _functions(tree: ast.Module) -> list[ast.FunctionDef | ast.AsyncFunctionDef]:
    return [n for n in ast.walk(tree) if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))]


def _callers(tree: ast.Module, loader: str) -> list[Caller]:
    out = []
    for fn in _functions(tree):
        if fn.name == loader:
            continue
        calls = any(isinstance(n, ast.Call) and (
            (isinstance(n.func, ast.Name) and n.func.id == loader)
            or (isinstance(n.func, ast.Attribute) and n.func.attr == loader)) for n in ast.walk(fn))
        if calls:
            params, defaults = _params(fn)
            out.append(Caller(fn.name, fn.lineno, params, _mutates_args(fn), defaults))
    return out


def _guards(parents: dict[ast.AST, ast.AST], node: ast.AST, text: str) -> list[str]:
    out = []
    while node in parents:
        parent = parents[node]
        if isinstance(parent, ast.If) and node in parent.body:
            out.append(_src(parent.test, text))
        elif isinstance(parent, ast.If) and node in parent.orelse:
            out.append("not (" + _src(parent.test, text) + ")")
        node = parent
    return out


MAX_SYNTAX_DEPTH = 100  # levels of a loader file's syntax tree Astra walks (SGLang's own stay under 40)


def parse_loader(path: Path) -> tuple[str, ast.Module | None, str | None]:
    """(text, syntax tree, None), or (text, None, why it cannot be read) for a Python file of a tree: a regular
    file of bounded size (astra.sglang.tree.read_tree_text) that parses, nested at most MAX_SYNTAX_DEPTH
    levels (the walks over it recurse: a deeper tree, such as one expression of 100,000 terms, is refused
    here instead of failing there)."""
    try:
        text = read_tree_text(path)
    except Refused as err:
        return "", None, err.why
    try:
        module = ast.parse(text)
    except SyntaxError as err:
        return text, None, f"{type(err).__name__} at line {err.lineno}"
    except (ValueError, RecursionError, MemoryError) as err:
        return text, None, f"{type(err).__name__}: {str(err)[:80]}"
    if depth(module, ast.iter_child_nodes, MAX_SYNTAX_DEPTH) > MAX_SYNTAX_DEPTH:
        return text, None, f"nested more than {MAX_SYNTAX_DEPTH} levels deep"
    return text, module, None


def _in_tree(path: Path, root: Path) -> str:
    """`path` relative to the tree's root, as found there (a link in the tree may point anywhere)."""
    if path.is_relative_to(root):
        return path.relative_to(root).as_posix()
    try:
        return path.resolve().relative_to(root.resolve()).as_posix()
    except (ValueError, RuntimeError, OSError):
        return path.as_posix()


def scan_file(path: Path, tree_root: Path, functions: dict[str, ast.FunctionDef] | None = None) -> list[CallSite]:
    """Every `load_jit` call site of one Python file (one entry per module name it can produce)."""
    text, module, _ = parse_loader(path)
    if module is None or "load_jit" not in text:
        return []  # one that cannot be read is reported by `unparsable` (astra list prints one line per file)
    parents = {child: node for node in ast.walk(module) for child in ast.iter_child_nodes(node)}
    module_scope = _Scope(module.body)
    constants = int_constants(module_scope.assigns)
    rel = _in_tree(path, tree_root)
    sites: list[CallSite] = []
    for call in (n for n in ast.walk(module) if isinstance(n, ast.Call) and _is_load_jit(n)):
        fn = parents.get(call)
        while fn is not None and not isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef)):
            fn = parents.get(fn)
        scope = _Scope(fn.body, module_scope) if fn else module_scope
        params, defaults = _params(fn) if fn else ([], {})
        loader = fn.name if fn else "<module>"
        positional = [a for a in call.args if not isinstance(a, ast.Starred)]
        if not positional:
            continue
        for name_node, assume in _name_variants(positional[0], text):
            ev = _Evaluator(text, scope, call.lineno, assume, functions)
            site = CallSite(
                file=rel, line=call.lineno, loader=loader, loader_params=params, loader_defaults=defaults,
                module_name=ev.string(name_node),
                name_args=[_src(a, text) for a in call.args[1:]],
                template_args=_template_args(call, scope, text),
                guards=_guards(parents, call, text),
                callers=_callers(module, loader) if fn else [],
                module_constants=constants,
            )
            for kw in call.keywords:
                if kw.arg in LIST_KWARGS:
                    setattr(site, kw.arg, ev.strings(kw.value))
                elif kw.arg == "cuda_wrappers":
                    site.wrappers += ev.wrappers(kw.value, "cuda")
                elif kw.arg == "cpp_wrappers":
                    site.wrappers += ev.wrappers(kw.value, "cpp")
                elif kw.arg == "header_only" and isinstance(kw.value, ast.Constant):
                    site.header_only = bool(kw.value.value)
            sites.append(site)
    return sites


def _template_args(call: ast.Call, scope: _Scope, text: str) -> dict[str, list[str]]:
    """`args = make_cpp_args(a, b, c)` for each `*args` passed to load_jit (symbolic, as source text)."""
    out: dict[str, list[str]] = {}
    for arg in call.args:
        if isinstance(arg, ast.Starred) and isinstance(arg.value, ast.Name):
            value = scope.lookup(arg.value.id, call.lineno)
            if isinstance(value, ast.Call) and getattr(value.func, "id", getattr(value.func, "attr", "")) == "make_cpp_args":
                out[arg.value.id] = [_src(a, text) for a in value.args]
    return out


def function_index(files: list[Path], on_file: Callable[[], None] = lambda: None) -> dict[str, ast.FunctionDef]:
    """Top-level functions of the given files by name (helpers that compute flags live there); `on_file` is
    called as each file is read."""
    index: dict[str, ast.FunctionDef] = {}
    for path in files:
        on_file()
        module = parse_loader(path)[1]
        for node in module.body if module is not None else []:
            if isinstance(node, ast.FunctionDef):
                index.setdefault(node.name, node)
    return index


@dataclass
class Unparsable:
    """A loader file that mentions load_jit but is not valid Python: its modules are missing from `list`."""

    file: str  # path inside the tree, e.g. sglang/kernels/ops/demo/scale.py
    error: str  # "SyntaxError at line 3"


def unparsable(tree: SglangTree, progress: Callable[[int, int], None] | None = None) -> list[Unparsable]:
    """Every loader file of `tree` that mentions `load_jit` and does not parse (skipped by `scan_tree`);
    `progress(done, total)` counts the files read."""
    out = []
    files = tree.python_files()
    for done, path in enumerate(files, 1):
        if progress is not None:
            progress(done, len(files))
        text, module, why = parse_loader(path)
        if module is None and ("load_jit" in text or not text):  # unread, or a loader that does not parse
            out.append(Unparsable(_in_tree(path, tree.root), why))
    return out


def scan_tree(tree: SglangTree, progress: Callable[[int, int], None] | None = None) -> list[CallSite]:
    """Every `load_jit` call site of the tree's Python files; `progress(done, total)` counts the files read
    (each twice: for the helper functions, then for the call sites)."""
    files = tree.python_files()
    utils = sorted((tree.jit_dir / "utils").rglob("*.py")) + sorted(tree.jit_dir.glob("utils.py"))
    total, done = len(utils) + 2 * len(files), 0

    def read() -> None:
        nonlocal done
        done += 1
        if progress is not None:
            progress(done, total)

    functions = function_index(utils + files, on_file=read)
    sites: list[CallSite] = []
    for path in files:
        sites += scan_file(path, tree.root, functions)
        read()
    return sites
