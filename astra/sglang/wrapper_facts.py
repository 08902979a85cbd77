"""What the Python wrapper of a JIT module does around the kernel, read with `ast`.

For one `load_jit` call site: every function that calls an export of the loaded module
(`module.<export>(...)`, `getattr(module, ...)`, `module["x"]`, an export handed to an in-file helper),
each export argument in terms of the calling function's parameters, what the loader's arguments
(which feed `make_cpp_args`) are computed from (`q.shape[-1]`, `x.dtype`), the tensors the wrapper
allocates, parameter defaults, mutated arguments and dtypes named in docstrings. Also the names
through which SGLang reaches the exports (`entry_points`), which `srt_gates` looks up in sglang/srt.
"""

from __future__ import annotations

import ast
import re
from dataclasses import dataclass, field

from astra.sglang.conditions import negate
from astra.sglang.discovery import CallSite
from astra.sglang.tree import SglangTree
from astra.sglang.wrapper_scan import (
    ALLOCATORS,
    File,
    Fn,
    Value,
    callee,
    dotted,
    export_calls,
    handed_to_helpers,
    import_source,
    kernel_texts,
    own_nodes,
    parse,
    wrapper_files,
)

_DTYPE_DOC = re.compile(r"supported\s+dtypes?\s*:?(.*)", re.I)


@dataclass
class Allocation:
    name: str
    call: str  # "torch.empty_like(seq_lens)"
    shape: str | None
    dtype: str | None
    like: str | None  # the tensor it copies shape/dtype/device from
    line: int
    condition: str | None  # allocated only when this holds (`out is None`)
    returned: bool
    feeds: list[str] = field(default_factory=list)  # "clamp_position[0]": export and argument index


@dataclass
class ExportCall:
    export: str
    function: str  # the function holding the call
    file: str
    line: int
    args: list[Value]
    kwargs: dict[str, Value]
    loader_args: dict[str, Value]  # loader parameter -> what the caller passes into `_jit_x_module(...)`


@dataclass
class FunctionFacts:
    name: str
    file: str
    line: int
    public: bool
    params: list[str]
    defaults: dict[str, str]
    mutates_args: list[str] | None  # register_custom_op / custom_op(mutates_args=...); None: not registered
    registered_as: list[str]  # names bound to register_custom_op(f)/register_fused_op(...) of it
    dtypes: list[str]  # "Supported dtypes: torch.int32, torch.int64" -> ["int32", "int64"]
    allocations: list[Allocation]
    returns: list[str]
    calls: list[ExportCall]


@dataclass
class WrapperFacts:
    module: str
    file: str
    loader: str
    loader_params: list[str]
    loader_defaults: dict[str, str]
    template_args: dict[str, list[str]]
    functions: list[FunctionFacts]

    def by_export(self) -> dict[str, list[ExportCall]]:
        out: dict[str, list[ExportCall]] = {}
        for fn in self.functions:
            for call in fn.calls:
                out.setdefault(call.export, []).append(call)
        return out


@dataclass
class EntryPoint:
    """A name of a wrapper file that ends up calling an export (the runtime imports these)."""

    module: str  # dotted, e.g. sglang.kernels.ops.attention.clamp_position
    name: str
    kind: str  # "function" | "class" | "alias" (register_custom_op/register_fused_op/...) | "loader"
    file: str
    line: int
    public: bool


def _loader_args(site: CallSite, call: ast.Call | None, holder: Fn) -> dict[str, Value]:
    if call is None:
        return {}
    out: dict[str, Value] = {}
    positional = [a for a in call.args if not isinstance(a, ast.Starred)]
    for name, arg in zip(site.loader_params, positional):
        out[name] = holder.value(arg, call.lineno)
    for kw in call.keywords:
        if kw.arg:
            out[kw.arg] = holder.value(kw.value, call.lineno)
    for name in site.loader_params:
        if name not in out and name in site.loader_defaults:
            out[name] = Value(site.loader_defaults[name], written="<default>")
    return out


def _export_call(site: CallSite, export: str, node: ast.Call, loader_call, holder: Fn, fn: Fn) -> ExportCall:
    args = [Value("*" + ast.unparse(a.value), written=ast.unparse(a)) if isinstance(a, ast.Starred)
            else fn.value(a, node.lineno) for a in node.args]
    kwargs = {kw.arg: fn.value(kw.value, node.lineno) for kw in node.keywords if kw.arg}
    return ExportCall(export, fn.name, fn.file, node.lineno, args, kwargs, _loader_args(site, loader_call, holder))


def _allocations(fn: Fn, calls: list[ExportCall], parents: dict) -> list[Allocation]:
    returned = {n.id for r in own_nodes(fn.node) if isinstance(r, ast.Return) and r.value is not None
                for n in ast.walk(r.value) if isinstance(n, ast.Name)}
    out = []
    for name, bindings in fn.assigns.items():
        for line, value in bindings:
            condition = None
            if isinstance(value, ast.IfExp):
                alloc_body = callee(value.body) in ALLOCATORS
                value, condition = (value.body, ast.unparse(value.test)) if alloc_body else (
                    value.orelse, negate(value.test))
            if callee(value) not in ALLOCATORS:
                continue
            kind = callee(value)
            like = ast.unparse(value.args[0]) if kind.endswith("_like") and value.args else (
                ast.unparse(value.func.value) if kind.startswith("new_") else None)
            kw = {k.arg: ast.unparse(k.value) for k in value.keywords if k.arg}
            shape_args = value.args if not kind.endswith("_like") else []
            if kind.endswith("full") and shape_args:  # (shape, fill_value)
                shape_args = shape_args[:1]
            shape = kw.get("size") or (", ".join(ast.unparse(a) for a in shape_args) if shape_args else None)
            if shape is None and like:
                shape = f"{like}.shape"
            dtype = kw.get("dtype") or (f"{like}.dtype" if like else None)
            condition = condition or _enclosing_if(fn, value, parents)
            feeds = [f"{c.export}[{i}]" for c in calls for i, a in enumerate(c.args) if a.written == name]
            out.append(Allocation(name, ast.unparse(value), shape, dtype, like, line, condition,
                                  name in returned, feeds))
    return sorted(out, key=lambda a: a.line)


def _enclosing_if(fn: Fn, node: ast.AST, parents: dict) -> str | None:
    child, parent = node, parents.get(node)
    while parent is not None and parent is not fn.node:
        if isinstance(parent, ast.If):
            return ast.unparse(parent.test) if child in parent.body else negate(parent.test)
        child, parent = parent, parents.get(parent)
    return None


def _registrations(module: ast.Module) -> tuple[dict[str, list[str]], dict[str, list[str]]]:
    """Function name -> names bound to its registration, and -> mutates_args of module-level registrations."""
    bound: dict[str, list[str]] = {}
    mutates: dict[str, list[str]] = {}
    for node in module.body:
        call = node.value if isinstance(node, (ast.Assign, ast.Expr)) else None
        if not isinstance(call, ast.Call) or not re.search(r"register|custom_op", callee(call) or ""):
            continue
        names = {n.id for a in call.args for n in ast.walk(a) if isinstance(n, ast.Name)}
        names |= {k.value.id for k in call.keywords if k.arg in ("op_func", "fn", "func") and isinstance(k.value, ast.Name)}
        targets = [t.id for t in getattr(node, "targets", []) if isinstance(t, ast.Name)]
        for name in names:
            bound.setdefault(name, []).extend(targets)
            for kw in call.keywords:
                if kw.arg == "mutates_args":
                    mutates[name] = _literal_names(kw.value)
    return bound, mutates


def _literal_names(node: ast.expr) -> list[str]:
    try:
        return [str(v) for v in ast.literal_eval(node)]
    except ValueError:
        return ["{" + ast.unparse(node) + "}"]


def _decorator_mutates(fn: ast.FunctionDef) -> list[str] | None:
    for dec in fn.decorator_list:
        if isinstance(dec, ast.Call):
            for kw in dec.keywords:
                if kw.arg == "mutates_args":
                    return _literal_names(kw.value)
            if re.search(r"custom_op", callee(dec) or ""):
                return []
    return None


def _dtypes(fn: ast.FunctionDef) -> list[str]:
    out: list[str] = []
    for line in (ast.get_docstring(fn) or "").splitlines():
        m = _DTYPE_DOC.search(line)
        if m:
            out += [d for d in re.findall(r"torch\.(\w+)", m.group(1)) if d not in out]
    return out


def facts(tree: SglangTree, site: CallSite) -> WrapperFacts:
    """The wrapper facts of one `load_jit` call site (the module's loader file and its importers)."""
    exports = {w.export for w in site.wrappers if "{" not in w.export}
    functions: list[FunctionFacts] = []
    for rel, module, loader in wrapper_files(tree, site):
        file = File(module, rel, loader, exports)
        parents = {c: n for n in ast.walk(module) for c in ast.iter_child_nodes(n)}
        bound, mutates = _registrations(module)
        for name, fn in file.fns.items():
            if name == loader:
                continue
            calls = [_export_call(site, e, node, lc, holder, fn) for e, node, lc, holder in export_calls(file, fn)]
            calls += [_export_call(site, e, node, lc, holder, helper)
                      for e, node, lc, holder, helper in handed_to_helpers(file, fn)]
            if not calls:
                continue
            short = name.split(".")[-1]
            decorated = _decorator_mutates(fn.node)
            functions.append(FunctionFacts(
                name, rel, fn.node.lineno, not short.startswith("_"), fn.params, fn.defaults,
                decorated if decorated is not None else mutates.get(name),
                bound.get(name, []), _dtypes(fn.node), _allocations(fn, calls, parents),
                [ast.unparse(r.value) for r in sorted((r for r in own_nodes(fn.node) if isinstance(r, ast.Return)
                                                       and r.value), key=lambda r: r.lineno)], calls))
    return WrapperFacts(site.module_name, site.file, site.loader, site.loader_params, site.loader_defaults,
                        site.template_args, functions)


def _reaching(module: ast.Module, direct: set[str]) -> dict[str, tuple[str, int]]:
    """Top-level names of a file that reach one of the `direct` functions (qualified names), in-file:
    functions calling or naming them, classes with such a method, module-level names bound to them."""
    tops: dict[str, tuple[str, ast.AST]] = {}
    methods: dict[str, dict[str, ast.AST]] = {}
    for node in module.body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            tops[node.name] = ("function", node)
        elif isinstance(node, ast.ClassDef):
            tops[node.name] = ("class", node)
            methods[node.name] = {m.name: m for m in node.body if isinstance(m, (ast.FunctionDef, ast.AsyncFunctionDef))}
        elif isinstance(node, (ast.Assign, ast.AnnAssign)) and isinstance(node.value, ast.Call):
            for t in (node.targets if isinstance(node, ast.Assign) else [node.target]):
                if isinstance(t, ast.Name):
                    tops[t.id] = ("alias", node.value)
    names = {k: {n.id for n in ast.walk(v[1]) if isinstance(n, ast.Name)} for k, v in tops.items()}
    reached_methods = {q for q in direct if "." in q}
    reached = {q for q in direct if "." not in q and q in tops}
    changed = True
    while changed:
        changed = False
        for cls, ms in methods.items():
            for m, node in ms.items():
                selfs = {n.attr for n in ast.walk(node) if isinstance(n, ast.Attribute)
                         and isinstance(n.value, ast.Name) and n.value.id in ("self", "cls")}
                used = {n.id for n in ast.walk(node) if isinstance(n, ast.Name)}
                if f"{cls}.{m}" not in reached_methods and (used & reached or {f"{cls}.{s}" for s in selfs} & reached_methods):
                    reached_methods.add(f"{cls}.{m}")
                    changed = True
            if cls not in reached and any(q.startswith(cls + ".") for q in reached_methods):
                reached.add(cls)
                changed = True
        for name, used in names.items():
            if name not in reached and tops[name][0] != "class" and used & reached - {name}:
                reached.add(name)
                changed = True
    return {n: (tops[n][0], getattr(tops[n][1], "lineno", 0)) for n in reached}


def entry_points(tree: SglangTree, site: CallSite) -> list[EntryPoint]:
    """Every name through which SGLang reaches this call site's exports: the loader, the wrapper files'
    functions/classes/registered names that call an export (in-file closure), and one level of kernel
    files that import those names from the wrapper file."""
    exports = {w.export for w in site.wrappers if "{" not in w.export}
    out: list[EntryPoint] = []
    for rel, module, loader in wrapper_files(tree, site):
        file = File(module, rel, loader, exports)
        direct = {name for name, fn in file.fns.items() if name != loader and (export_calls(file, fn) or any(
            file.refs(fn, n, getattr(n, "lineno", 0)) for n in own_nodes(fn.node)
            if isinstance(n, (ast.Attribute, ast.Subscript, ast.Call))))}
        for name, (kind, line) in sorted(_reaching(module, direct).items()):
            out.append(EntryPoint(dotted(rel), name, kind, rel, line, not name.startswith("_")))
    if site.loader != "<module>":
        out.append(EntryPoint(dotted(site.file), site.loader, "loader", site.file, site.line, False))
    by_module: dict[str, set[str]] = {}
    for ep in out:
        by_module.setdefault(ep.module, set()).add(ep.name)
    for path, text in kernel_texts(str(tree.root)).items():  # one level: kernel files importing them
        mods = [m for m, names in by_module.items() if dotted(path) != m and m.rsplit(".", 1)[-1] in text
                and any(n in text for n in names)]
        module = parse(tree.root / path) if mods else None
        aliases = {a.asname or a.name for node in (ast.walk(module) if module else [])
                   if isinstance(node, ast.ImportFrom) and import_source(node, path) in mods
                   for a in node.names if a.name in by_module[import_source(node, path)]}
        if aliases:
            fns = File(module, path, "", set()).fns
            direct = {q for q, fn in fns.items() if aliases & {n.id for n in own_nodes(fn.node) if isinstance(n, ast.Name)}}
            for name, (kind, line) in sorted(_reaching(module, direct).items()):
                out.append(EntryPoint(dotted(path), name, kind, path, line, not name.startswith("_")))
    return out
