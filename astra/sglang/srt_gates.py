"""Where SGLang's runtime (`sglang/srt`) reaches a JIT module, and under which conditions.

A module is reached through its entry points (`wrapper_facts.entry_points`: the loader and the
wrapper functions, classes and registered names that end up calling an export). Every use of those
names in sglang/srt (imports resolved, package re-exports followed) is a site; each site carries the
chain of conditions that hold where it runs (enclosing `if`/`elif`/`else`, ternaries, `and`/`or`,
`while`, earlier `if ...: return` guards and asserts), outermost first, as source text. The gates
are the conditions about the model, its configuration, dimensions or platform (`head_size not in
(64, 128)`, `attn_tp_size == 1`, `_is_cuda`); numeric tests on dimension names become constraints.

Parsing sglang/srt (~2,000 files) is done once per tree into a JSON index under $ASTRA_HOME/srt-index.
"""

from __future__ import annotations

import ast
import hashlib
import json
import os
import re
from concurrent.futures import ProcessPoolExecutor
from dataclasses import asdict, dataclass, field
from pathlib import Path

from astra import paths
from astra.input_files import SOURCE_BYTES, Refused, read_bytes
from astra.sglang import registry
from astra.sglang.conditions import Constraint, chain, constraints, module_constants, requirements
from astra.sglang.tree import SglangTree, ensure_srt
from astra.sglang.wrapper_facts import EntryPoint, entry_points
from astra.sglang.wrapper_scan import dotted, import_source, kernel_texts, parse
from harness.worker import children

INDEX_VERSION = 6
_KERNEL_PACKAGES = ("sglang.kernels", "sglang.jit_kernel")
_GATE = re.compile(
    r"head|_dim\b|\bdim\b|hidden|expert|topk|top_k|rotary|rope|tp_size|tp_rank|attn_tp|world_size|dtype|config"
    r"|arch|quant|fp8|fp4|mxfp|int8|\b_is_[a-z]|\bis_(cuda|hip|npu|xpu|cpu|musa|mps|sm\d+|blackwell|hopper)"
    r"|\bsm\d|capability|num_|page_size|block_size|lora|moe|vocab"
    r"|layer|model|backend|envs\.|SGLANG_|use_|enable_|server_args|platform|device", re.I)


@dataclass
class Site:
    file: str  # sglang/srt/...
    line: int
    name: str  # as written: "clamp_position", "ops.rmsnorm"
    target: str  # "sglang.kernels.ops.attention.clamp_position:clamp_position"
    kind: str  # "call" | "reference" (passed or stored, called later)
    function: str | None  # enclosing function, qualified ("ForwardBatch.init_new"); None at module level
    chain: list[str]  # conditions that hold where it runs, outermost first
    import_chain: list[str]  # conditions under which its import runs (those not already in `chain`)
    gates: list[str] = field(default_factory=list)  # the chain's model/config/dims/platform conditions
    constraints: list[Constraint] = field(default_factory=list)
    helpers: list[list] = field(default_factory=list)  # [target, call] of kernels predicates in the chain
    requires: list[str] = field(default_factory=list)  # what those predicates test, in this site's terms


@dataclass
class Reach:
    module: str
    loaders: list[str]  # "file:loader"
    entry_points: list[EntryPoint]
    sites: list[Site]
    gates: list[str]  # distinct gates over all sites
    constraints: list[Constraint]
    srt: bool  # whether this tree has sglang/srt
    reached: bool
    verdict: str


def _qualname(node: ast.AST, parents: dict) -> str | None:
    names = []
    while node is not None:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.append(node.name)
        node = parents.get(node)
    return ".".join(reversed(names)) if names else None


_KERNEL_MODULES: frozenset[str] = frozenset()  # dotted modules of sglang/kernels (jit_kernel)
_REEXPORTED: frozenset[str] = frozenset()  # "package:name" a package binds (wins over a submodule `name`)


def _init_worker(kernel_modules: frozenset[str], reexported: frozenset[str], parent: int | None = None) -> None:
    """A scanning worker's state; in a pool's worker (`parent`: the pool's process) it dies with the pool's process."""
    global _KERNEL_MODULES, _REEXPORTED
    if parent is not None:
        children.die_with_parent(parent)
    _KERNEL_MODULES, _REEXPORTED = kernel_modules, reexported


def _srt_text(path: Path) -> str:
    """A runtime file's text (bounded as any source, astra.input_files; undecodable bytes replaced)."""
    return read_bytes(path, SOURCE_BYTES, what="a Python source").decode("utf-8", errors="replace")


def _scan_file(job: tuple[str, str]) -> list[dict]:
    """Every use in one srt file of a name imported from sglang.kernels / sglang.jit_kernel."""
    rel, path = job
    try:
        module = ast.parse(_srt_text(Path(path)))
    except (SyntaxError, ValueError, RecursionError, Refused):  # unreadable, too large or not Python: no site
        return []
    parents: dict[ast.AST, ast.AST] = {}
    imports: list[ast.AST] = []
    candidates: list[ast.AST] = []
    stack: list[ast.AST] = [module]
    while stack:  # one pass: parents, imports, and the names that may use an import
        node = stack.pop()
        for child in ast.iter_child_nodes(node):
            parents[child] = node
            stack.append(child)
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            imports.append(node)
        elif isinstance(node, (ast.Name, ast.Attribute)):
            candidates.append(node)
    names: dict[str, tuple[str, ast.AST]] = {}  # local name -> (target "mod:name" or "mod", import node)
    for node in sorted(imports, key=lambda n: n.lineno):
        if isinstance(node, ast.ImportFrom) and import_source(node, rel).startswith(_KERNEL_PACKAGES):
            source = import_source(node, rel)
            for a in node.names:
                full = f"{source}.{a.name}"
                name = f"{source}:{a.name}"
                names[a.asname or a.name] = (full if full in _KERNEL_MODULES and name not in _REEXPORTED else name, node)
        elif isinstance(node, ast.Import):
            for a in node.names:
                if a.name.startswith(_KERNEL_PACKAGES):
                    names[a.asname or a.name] = (a.name, node)
    if not names:
        return []
    consts = module_constants(module)
    heads = {local.split(".")[0] for local in names}
    out = []
    for node in sorted(candidates, key=lambda n: (n.lineno, n.col_offset)):
        parent = parents.get(node)
        if isinstance(parent, ast.Attribute) and parent.value is node:
            continue  # the outermost of a dotted name decides
        written = _dotted_name(node)
        if not written or written.split(".")[0] not in heads or not isinstance(node.ctx, ast.Load):
            continue
        target, imported = _target(written, names)
        if target is None:
            continue
        conditions = chain(node, parents)
        texts = [ast.unparse(c) for c in conditions]
        out.append(asdict(Site(
            rel, node.lineno, written, target,
            "call" if isinstance(parent, ast.Call) and parent.func is node else "reference",
            _qualname(parent, parents), texts,
            [c for c in map(ast.unparse, chain(imported, parents)) if c not in texts],
            [text for text in texts if _GATE.search(text)],
            [c for cond in conditions for c in constraints(cond, consts)],
            [[t, ast.unparse(call)] for cond in conditions for call in ast.walk(cond) if isinstance(call, ast.Call)
             for t in [_target(_dotted_name(call.func) or "", names)[0]] if t])))
    return out


def _dotted_name(node: ast.AST) -> str | None:
    parts = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    return ".".join([node.id, *reversed(parts)]) if isinstance(node, ast.Name) else None


def _target(written: str, names: dict[str, tuple[str, ast.AST]]) -> tuple[str | None, ast.AST | None]:
    head, _, rest = written.partition(".")
    if head in names and ":" in names[head][0]:
        return (names[head][0], names[head][1]) if not rest else (None, None)
    for local, (module, node) in names.items():  # `ops.f`, `sglang.kernels.ops.x.f`
        if ":" not in module and written.startswith(local + ".") and "." not in written[len(local) + 1:]:
            return f"{module}:{written[len(local) + 1:]}", node
        if ":" not in module and local == module.split(".")[0] and written.startswith(module + "."):
            tail = written[len(module) + 1:]
            return (f"{module}:{tail}", node) if "." not in tail else (None, None)
    return None, None


def _registered(modules: list[ast.Module]) -> dict[str, str]:
    """op -> "module:name" from SGLang's kernel registry (`register_kernel(KernelSpec(op="mamba.x", backend=
    KernelBackend.JIT, target="sglang.kernels.ops.mamba.x:f"))`); of an op's backends, the JIT one."""
    out: dict[str, tuple[bool, str]] = {}
    for module in modules:
        for node in ast.walk(module):
            if not isinstance(node, ast.Call):
                continue
            kw = {k.arg: k.value for k in node.keywords if k.arg}
            op, target = kw.get("op"), kw.get("target")
            if not (isinstance(op, ast.Constant) and isinstance(op.value, str) and isinstance(target, ast.Constant)
                    and isinstance(target.value, str) and ":" in target.value):
                continue
            jit = "JIT" in ast.unparse(kw["backend"]) if "backend" in kw else False
            if op.value not in out or (jit and not out[op.value][0]):
                out[op.value] = (jit, target.value)
    return {op: target for op, (_, target) in out.items()}


def _dispatchers(module: ast.Module, pkg: str, ops: dict[str, str]) -> dict[str, str]:
    """"pkg:f" -> the registered target of the op that a module-level `def f` returns `get_kernel("op", ...)(...)` of."""
    out = {}
    for node in module.body:
        if not isinstance(node, ast.FunctionDef):
            continue
        for call in ast.walk(node):
            if (isinstance(call, ast.Call) and _dotted_name(call.func) in ("get_kernel", "selector.get_kernel")
                    and call.args and isinstance(call.args[0], ast.Constant) and call.args[0].value in ops):
                out[f"{pkg}:{node.name}"] = ops[call.args[0].value]
                break
    return out


def _reexports(tree: SglangTree) -> dict[str, str]:
    """"package:name" -> "module:name" for names a kernels package re-exports (imports or lazy `_EXPORTS`),
    and for a package's functions that dispatch through SGLang's kernel registry (`get_kernel("op")`)."""
    out: dict[str, str] = {}
    texts = kernel_texts(str(tree.root))
    empty = ast.Module(body=[], type_ignores=[])
    trees = {rel: parse(tree.root / rel) or empty for rel, text in texts.items()
             if "get_kernel(" in text or ("target=" in text and "op=" in text)
             or (rel.endswith("__init__.py") and "import" in text)}
    ops = _registered([trees[rel] for rel, text in texts.items() if "target=" in text and "op=" in text])
    for rel, text in texts.items():
        if ops and "get_kernel(" in text:
            out.update(_dispatchers(trees[rel], dotted(rel), ops))
        if not rel.endswith("__init__.py") or "import" not in text:
            continue
        module, pkg = trees[rel], dotted(rel)
        lazy = any(isinstance(n, ast.FunctionDef) and n.name == "__getattr__" for n in module.body)
        for node in module.body:
            if isinstance(node, ast.ImportFrom):
                for a in node.names:
                    out[f"{pkg}:{a.asname or a.name}"] = f"{import_source(node, rel)}:{a.name}"
            elif lazy and isinstance(node, ast.Assign) and isinstance(node.value, ast.Dict):
                for k, v in zip(node.value.keys, node.value.values):
                    if isinstance(k, ast.Constant) and isinstance(v, ast.Constant) and isinstance(v.value, str):
                        owner = v.value if v.value.startswith("sglang.") else f"{pkg}.{v.value}"
                        out[f"{pkg}:{k.value}"] = f"{owner}:{k.value}"
    return out


_INDEXES: dict[str, list[dict]] = {}


def index(tree: SglangTree) -> list[dict] | None:
    """Every use of a kernels name in the tree's sglang/srt (Site fields), built once, then read from disk."""
    srt = ensure_srt(tree)
    if srt is None:
        return None
    files = sorted(srt.rglob("*.py"))
    digest = hashlib.sha256(f"{INDEX_VERSION} {tree.root.resolve()}".encode())
    for path in files:
        stat = path.stat()
        digest.update(f"{path.relative_to(srt).as_posix()} {stat.st_size} {stat.st_mtime_ns}\n".encode())
    target = paths.sub("srt-index") / paths.safe_name(f"{tree.version}-{tree.origin}-{digest.hexdigest()[:16]}.json")
    if str(target) in _INDEXES:
        return _INDEXES[str(target)]
    if target.exists():
        sites = json.loads(target.read_text())["sites"]
    else:
        sites = _build(tree, srt, files)
        tmp = target.with_suffix(f".{os.getpid()}.tmp")
        tmp.write_text(json.dumps({"version": tree.version, "origin": tree.origin, "files": len(files),
                                   "sites": sites}))
        os.replace(tmp, target)
    _INDEXES[str(target)] = sites
    return sites


def _build(tree: SglangTree, srt: Path, files: list[Path]) -> list[dict]:
    jobs = []
    for path in files:
        try:
            text = _srt_text(path)
        except Refused:  # a FIFO, a device or a file over the bound in the tree: it calls nothing we can see
            continue
        if any(pkg in text for pkg in _KERNEL_PACKAGES):
            jobs.append((path.relative_to(tree.root).as_posix(), str(path)))
    kernel_modules = frozenset(dotted(rel) for rel in kernel_texts(str(tree.root)))
    reexports = _reexports(tree)
    workers = max(1, min(8, os.cpu_count() or 1, len(jobs)))
    if workers == 1:
        _init_worker(kernel_modules, frozenset(reexports))
        results = [_scan_file(job) for job in jobs]
    else:
        with ProcessPoolExecutor(workers, initializer=_init_worker,
                                 initargs=(kernel_modules, frozenset(reexports), os.getpid())) as pool:
            results = list(pool.map(_scan_file, jobs, chunksize=8))
    sites = [site for result in results for site in result]
    for site in sites:
        for _ in range(4):
            site["target"] = reexports.get(site["target"], site["target"])
    return sites


def reach(tree: SglangTree, module: registry.JitModule) -> Reach:
    """The runtime's sites of one module, their conditions, and a one-line verdict."""
    points: dict[str, EntryPoint] = {}
    loaders = []
    for site in module.call_sites:
        if f"{site.file}:{site.loader}" not in loaders:
            loaders.append(f"{site.file}:{site.loader}")
            points.update({f"{ep.module}:{ep.name}": ep for ep in entry_points(tree, site)})
    sites_raw = index(tree)
    found = [_site(tree, s) for s in (sites_raw or []) if s["target"] in points]
    gates = list(dict.fromkeys(g for s in found for g in s.gates + s.requires))
    seen, unique = set(), []
    for c in (c for s in found for c in s.constraints):
        key = (c.name, c.op, tuple(c.values), c.certain)
        if key not in seen:
            seen.add(key)
            unique.append(c)
    if sites_raw is None:
        verdict = "sglang/srt is not in this tree: its runtime call sites are unknown"
    elif found:
        calls = sum(s.kind == "call" for s in found)
        verdict = (f"reached from {len(found)} runtime site{'s' if len(found) != 1 else ''} in "
                   f"{len({s.file for s in found})} file(s) ({calls} call{'s' if calls != 1 else ''})")
    else:
        verdict = "no call site in sglang/srt: reached only from tests/benchmarks or by plugins"
    return Reach(module.name, loaders, list(points.values()), found, gates, unique, sites_raw is not None,
                 bool(found), verdict)


def _site(tree: SglangTree, raw: dict) -> Site:
    site = Site(**{**raw, "constraints": [Constraint(**c) for c in raw["constraints"]], "requires": []})
    for target, call in site.helpers:  # `can_use_fused_inplace_qknorm(head_dim, q.dtype)`: what it tests
        module_name, _, name = target.partition(":")
        rel = next((r for r in kernel_texts(str(tree.root)) if dotted(r) == module_name), None)
        module = parse(tree.root / rel) if rel else None
        fn = next((n for n in (module.body if module else []) if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))
                   and n.name == name), None)
        if fn is None:
            continue
        node = ast.parse(call, mode="eval").body
        consts = module_constants(module)
        for raw, cond in requirements(fn, [ast.unparse(a) for a in node.args]):
            site.requires.append(f"{name}: {ast.unparse(cond)}")
            site.constraints += constraints(raw, consts, site.requires[-1])  # named as the predicate names them
    return site


def why(tree: SglangTree, name: str) -> Reach:
    return reach(tree, registry.find(tree, name))
