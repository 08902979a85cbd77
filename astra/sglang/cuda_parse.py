"""Parse SGLang's JIT CUDA sources with libclang: kernels, host entry points, tensor checks, includes.

`parse_source` reads one .cu/.cuh file and reports what is *defined in that file*:
  - kernels: `__global__` functions (template parameters, parameters, line extent);
  - host entries: static methods named `run` of classes defined in the file, static methods that
    launch a kernel, and free host functions that launch a kernel ("launch" = the body names a
    `__global__` function: `<<<...>>>`, `LaunchKernel(kernel, ...)`, `cudaLaunchKernelEx`, ...);
  - tensor constraints: each `TensorMatcher({...})` chain (dims as written, chained calls, the
    tensor given to `.verify(...)`), read from the tokens of the function holding it;
  - includes: the include closure restricted to SGLang's own files;
  - diagnostics: errors and fatal errors only, as `file:line: message` (errors clang raises on code
    nvcc accepts are kept apart, as `clang_only_errors`);
  - the names declared at namespace scope (astra.optimize.band_dispatch renames them), and every host
    function with its class and line extent (astra.optimize.entry_reach follows a spec's entry through them).

`parse_tree_report` parses every .cu/.cuh of an SGLang tree in worker processes and says which parse
cleanly; `parse_buildable` does so for the sources of every sm_90a-buildable module, each with the -D
flags its call site passes. The compiler arguments and where clang, CUDA and tvm-ffi are found live in
astra.sglang.clang_env.
"""

from __future__ import annotations

import multiprocessing
import os
import time
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

from astra.cxx.brackets import levels
from astra.errors import AstraError
from astra.sglang.clang_env import clang_env, code_tokens, load_cindex, nvcc_accepts, prefix_pch, tree_include_dirs
from astra.sglang.tensor_matchers import MatcherCall, TensorConstraint, find_tensor_matchers, join_tokens  # noqa: F401
from harness.worker import children

CUDA_SUFFIXES = (".cu", ".cuh")
_SCOPES = ("NAMESPACE", "LINKAGE_SPEC", "UNEXPOSED_DECL")
_CLASSES = ("STRUCT_DECL", "CLASS_DECL", "CLASS_TEMPLATE", "CLASS_TEMPLATE_PARTIAL_SPECIALIZATION")
_NAMED = ("STRUCT_DECL", "CLASS_DECL", "CLASS_TEMPLATE", "FUNCTION_DECL", "FUNCTION_TEMPLATE", "VAR_DECL",
          "TYPEDEF_DECL", "TYPE_ALIAS_DECL", "TYPE_ALIAS_TEMPLATE_DECL", "ENUM_DECL")
_FUNCTIONS = ("FUNCTION_DECL", "FUNCTION_TEMPLATE", "CXX_METHOD")
_TEMPLATE_PARAM_KINDS = {
    "TEMPLATE_TYPE_PARAMETER": "type",
    "TEMPLATE_NON_TYPE_PARAMETER": "non-type",
    "TEMPLATE_TEMPLATE_PARAMETER": "template",
}


@dataclass
class TemplateParam:
    name: str
    kind: str  # "type" | "non-type" | "template"
    type: str | None = None  # the type of a non-type parameter, as clang spells it
    default: str | None = None  # the default argument as written


@dataclass
class Param:
    name: str
    type: str  # as clang spells it, e.g. "const T *__restrict"


@dataclass
class KernelDecl:
    name: str
    qualified_name: str
    template_params: list[TemplateParam]
    params: list[Param]
    start_line: int  # the extent includes a leading `template <...>`
    end_line: int


@dataclass
class HostEntry:
    name: str
    qualified_name: str
    class_name: str | None  # None for a free function
    class_template_params: list[TemplateParam]
    template_params: list[TemplateParam]
    params: list[Param]
    start_line: int
    end_line: int
    launches: list[str] = field(default_factory=list)  # names of the __global__ functions it names


@dataclass
class ParsedSource:
    path: str
    kernels: list[KernelDecl]
    host_entries: list[HostEntry]
    tensor_constraints: list[TensorConstraint]
    includes: list[str]
    diagnostics: list[str]  # errors and fatal errors, `file:line: message`
    # errors clang raises on code nvcc accepts (see clang_env.nvcc_accepts); not in `diagnostics`
    clang_only_errors: list[str] = field(default_factory=list)
    scope_names: list[str] = field(default_factory=list)  # declared at namespace scope in this file
    # every host function defined in this file: (qualified name, class or None, first line, last line)
    host_functions: list[tuple[str, str | None, int, int]] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.diagnostics


@dataclass
class ParseResult:
    path: str  # relative to the tree's csrc dir
    ok: bool
    n_kernels: int
    n_errors: int
    first_error: str | None
    seconds: float
    n_clang_only_errors: int = 0


def parse_source(path: str | os.PathLike, include_dirs: list[str], defines: dict | None = None,
                 source_root: str | os.PathLike | None = None, pch: bool = True) -> ParsedSource:
    """Parse one CUDA file. `include_dirs` are searched with -I (tvm-ffi's are always added);
    `defines` add to (or override) -DSGL_CUDA_ARCH=900; `source_root` (default: the file's folder)
    bounds which included files count as the project's own, with `include_dirs`. With `pch`, the
    parse starts from tvm-ffi's headers precompiled (as load_jit's wrapper includes them first)."""
    path = Path(path).resolve()
    if not path.is_file():
        raise AstraError(f"{path}: no such CUDA source file")
    tu = _parse_tu(path, include_dirs, defines, pch)
    roots = [Path(d).resolve() for d in include_dirs] + [Path(source_root or path.parent).resolve()]
    decls = list(_own_decls(tu.cursor, str(path)))
    functions = [c for c in decls if c.kind.name in _FUNCTIONS and c.is_definition()]
    kernels = [_kernel(c) for c in functions if _is_global(c)]
    errors = [d for d in tu.diagnostics if d.severity >= 3]  # 3 = error, 4 = fatal
    return ParsedSource(
        path=str(path),
        kernels=kernels,
        host_entries=[e for e in (_host_entry(c) for c in functions) if e is not None],
        tensor_constraints=[t for c in functions
                            for t in find_tensor_matchers(code_tokens(c), _qualified_name(c))],
        includes=_includes(tu, roots),
        diagnostics=[_format(d) for d in errors if not nvcc_accepts(tu, d)],
        clang_only_errors=[_format(d) for d in errors if nvcc_accepts(tu, d)],
        scope_names=list(dict.fromkeys(c.spelling for c in decls if c.spelling and c.kind.name in _NAMED
                                       and c.semantic_parent is not None
                                       and c.semantic_parent.kind.name in ("NAMESPACE", "TRANSLATION_UNIT"))),
        host_functions=[(_qualified_name(c), _class_of(c), *_extent(c)) for c in functions
                        if _is_host(c)],
    )


def _class_of(cursor) -> str | None:
    """The name of the class or struct `cursor` is a member of; None for a free function."""
    parent = cursor.semantic_parent
    return parent.spelling if parent is not None and parent.kind.name in _CLASSES else None


def _parse_tu(path: Path, include_dirs: list[str], defines: dict | None, pch: bool):
    """The translation unit of `path` (incomplete parses allowed: a template's errors do not stop the
    rest). With `pch`, tvm-ffi's headers come precompiled; when clang refuses that prefix the file is
    parsed again without it. Raises AstraError when libclang cannot parse the file at all."""
    cindex = load_cindex()
    env = clang_env()
    args = env.args([str(d) for d in include_dirs], defines)
    prefix = prefix_pch(env.args([], defines)) if pch else None  # -I dirs do not change tvm-ffi's headers
    try:
        if prefix is not None:
            tu = _parse(cindex, path, args + ["-include-pch", str(prefix)])
            if not any(_pch_trouble(d) for d in tu.diagnostics):
                return tu
        return _parse(cindex, path, args)
    except cindex.TranslationUnitLoadError as exc:
        raise AstraError(f"{path}: libclang could not parse the file at all ({exc})") from exc


def _parse(cindex, path: Path, args: list[str]):
    return cindex.Index.create().parse(str(path), args=args, options=cindex.TranslationUnit.PARSE_INCOMPLETE)


def _pch_trouble(diag) -> bool:
    """A fatal error about the precompiled prefix itself (stale, other clang): parse without it."""
    text = diag.spelling.lower()
    return diag.severity >= 4 and ("pch" in text or "precompiled" in text or "ast file" in text)


def _own_decls(cursor, main_file: str):
    """Declarations located in `main_file`, descending into namespaces and classes."""
    for child in cursor.get_children():
        loc_file = child.location.file
        if loc_file is None or loc_file.name != main_file:
            continue
        kind = child.kind.name
        if kind in _SCOPES or kind in _CLASSES:
            yield from _own_decls(child, main_file)
        if kind not in _SCOPES:
            yield child


def _attr_kinds(cursor) -> set[str]:
    """The attributes written on a declaration (`CUDAGLOBAL_ATTR`, `CUDAHOST_ATTR`, ...)."""
    return {c.kind.name for c in cursor.get_children() if c.kind.name.endswith("_ATTR")}


def _is_global(cursor) -> bool:
    return "CUDAGLOBAL_ATTR" in _attr_kinds(cursor)


def _is_host(cursor) -> bool:
    """Whether a function runs on the host: not a kernel, and `__host__` or not `__device__` (a plain
    C++ function is host code)."""
    attrs = _attr_kinds(cursor)
    return "CUDAGLOBAL_ATTR" not in attrs and ("CUDAHOST_ATTR" in attrs or "CUDADEVICE_ATTR" not in attrs)


def _qualified_name(cursor) -> str:
    """`ns::Class::name` through the semantic parents; anonymous namespaces and classes are left out."""
    parts = [cursor.spelling]
    parent = cursor.semantic_parent
    while parent is not None and parent.kind.name != "TRANSLATION_UNIT":
        if parent.spelling and not parent.is_anonymous():
            parts.append(parent.spelling)
        parent = parent.semantic_parent
    return "::".join(reversed(parts))


def _template_params(cursor) -> list[TemplateParam]:
    """The template parameters `cursor` declares itself (not its class's), in order, with the type
    of a non-type parameter and each default argument as written."""
    params = []
    for child in cursor.get_children():
        kind = _TEMPLATE_PARAM_KINDS.get(child.kind.name)
        if kind is None:
            continue
        type_ = child.type.spelling if kind == "non-type" else None
        params.append(TemplateParam(child.spelling, kind, type_, _default_argument(child)))
    return params


def _default_argument(cursor) -> str | None:
    """The text after the top-level `=` of a template parameter, if it has one (`typename T =
    std::conditional_t<(N > 4), A, B>` has `std::conditional_t<(N > 4), A, B>`)."""
    tokens = code_tokens(cursor)
    spellings = [t.spelling for t in tokens]
    for i, depth, role in levels(spellings):
        if spellings[i] == "=" and depth == 0 and not role:
            return join_tokens(tokens[i + 1:]) or None
    return None


def _params(cursor) -> list[Param]:
    return [Param(c.spelling, c.type.spelling) for c in cursor.get_children() if c.kind.name == "PARM_DECL"]


def _extent(cursor) -> tuple[int, int]:
    return cursor.extent.start.line, cursor.extent.end.line


def _kernel(cursor) -> KernelDecl:
    start, end = _extent(cursor)
    return KernelDecl(cursor.spelling, _qualified_name(cursor), _template_params(cursor),
                      _params(cursor), start, end)


def _host_entry(cursor) -> HostEntry | None:
    """A host entry point, or None: `static run` methods, and host functions that launch kernels."""
    if not _is_host(cursor):
        return None
    parent = cursor.semantic_parent
    in_class = parent is not None and parent.kind.name in _CLASSES
    if in_class and not cursor.is_static_method():
        return None
    launches = _launched_kernels(cursor)
    if not launches and not (in_class and cursor.spelling == "run"):
        return None
    start, end = _extent(cursor)
    return HostEntry(
        name=cursor.spelling,
        qualified_name=_qualified_name(cursor),
        class_name=parent.spelling if in_class else None,
        class_template_params=_template_params(parent) if in_class else [],
        template_params=_template_params(cursor),
        params=_params(cursor),
        start_line=start,
        end_line=end,
        launches=launches,
    )


def _launched_kernels(cursor) -> list[str]:
    """Names of `__global__` functions referred to in the body of `cursor`, in order."""
    names: dict[str, None] = {}
    for node in cursor.walk_preorder():
        for target in _referenced(node):
            if target.kind.name in ("FUNCTION_DECL", "FUNCTION_TEMPLATE") and _is_global(target):
                names.setdefault(target.spelling)
    return list(names)


def _referenced(node) -> list:
    """What a reference expression names: every candidate of an unresolved (template) name."""
    kind = node.kind.name
    if kind == "OVERLOADED_DECL_REF":  # e.g. `kernel<T, N>` inside a template
        cindex = load_cindex()
        lib = cindex.conf.lib
        found = [cindex.Cursor.from_cursor_result(lib.clang_getOverloadedDecl(node, i), node)
                 for i in range(lib.clang_getNumOverloadedDecls(node))]
        return [c for c in found if c is not None]
    if kind in ("DECL_REF_EXPR", "MEMBER_REF_EXPR") and node.referenced is not None:
        return [node.referenced]
    return []


def _includes(tu, roots: list[Path]) -> list[str]:
    """Included files under `roots` (SGLang's own), in first-inclusion order."""
    found: dict[str, None] = {}
    for inclusion in tu.get_includes():
        included = Path(inclusion.include.name).resolve()
        if any(included.is_relative_to(root) for root in roots):
            found.setdefault(str(included))
    return list(found)


def _format(diag) -> str:
    """A diagnostic as `file:line: message` (`<command line>: message` when it has no file)."""
    loc = diag.location
    where = f"{loc.file.name}:{loc.line}" if loc.file is not None else "<command line>"
    return f"{where}: {diag.spelling}"


# ---------------------------------------------------------------- whole trees


def tree_sources(tree) -> list[Path]:
    """Every .cu/.cuh file under the tree's csrc dir."""
    return sorted(p for p in Path(tree.csrc_dir).rglob("*") if p.is_file() and p.suffix in CUDA_SUFFIXES)


def parse_tree_report(tree, files: list | None = None, workers: int | None = None,
                      defines: dict | None = None, on_parsed: Callable[[], None] | None = None) -> list[ParseResult]:
    """Parse every .cu/.cuh under `tree.csrc_dir` (or `files`, relative to it) and say which parse
    cleanly. `workers` defaults to the CPU count (at most 8); with more than one, files are parsed
    in spawned processes, so a calling script needs the usual `if __name__ == "__main__":` guard.
    `on_parsed` is called as each file's result comes in (a progress line counts them)."""
    workers = workers or min(8, os.cpu_count() or 1)
    csrc = Path(tree.csrc_dir).resolve()
    paths = [(csrc / f).resolve() for f in files] if files else [p.resolve() for p in tree_sources(tree)]
    include_dirs = tree_include_dirs(tree)
    prefix_pch(clang_env().args([], defines))  # fail fast on a missing tool; build the PCH once
    jobs = [(str(p), str(csrc), include_dirs, defines) for p in paths]
    results = []
    if workers <= 1 or len(jobs) <= 1:
        for job in jobs:
            results.append(_report_one(job))
            if on_parsed is not None:
                on_parsed()
        return results
    # spawn, not fork: libclang parses on helper threads, and forking a threaded process is unsafe.
    with ProcessPoolExecutor(max_workers=workers, mp_context=multiprocessing.get_context("spawn"),
                             initializer=children.die_with_parent, initargs=(os.getpid(),)) as pool:
        for result in pool.map(_report_one, jobs, chunksize=1):
            results.append(result)
            if on_parsed is not None:
                on_parsed()
    return results


def _report_one(job: tuple) -> ParseResult:
    """One file's `ParseResult` (a worker's job: path, csrc dir, include dirs, defines); a file libclang
    gives up on is a failed result, not a failed report."""
    path, csrc, include_dirs, defines = job
    started = time.perf_counter()
    rel = Path(path).relative_to(csrc).as_posix()
    try:
        parsed = parse_source(path, include_dirs, defines, source_root=csrc)
    except AstraError as exc:  # libclang gave up on this file: a failed result, not a failed report
        return ParseResult(rel, False, 0, 1, str(exc), round(time.perf_counter() - started, 2))
    return ParseResult(
        path=rel,
        ok=parsed.ok,
        n_kernels=len(parsed.kernels),
        n_errors=len(parsed.diagnostics),
        first_error=parsed.diagnostics[0] if parsed.diagnostics else None,
        seconds=round(time.perf_counter() - started, 2),
        n_clang_only_errors=len(parsed.clang_only_errors),
    )


# ---------------------------------------------------------------- the buildable modules


def module_defines(module) -> dict[str, str]:
    """The -D flags a module's first call site passes (values guessed where symbolic), as a parse takes them."""
    from astra.sglang import variants

    out = {}
    for flag in variants.guess(module.call_sites[0]).extra_cuda_cflags:
        if flag.startswith("-D") and "{" not in flag:
            name, _, value = flag[2:].partition("=")
            out[name] = value or "1"
    return out


def parse_buildable(tree, progress: Callable[[int, int], None] | None = None) -> list:
    """`parse_tree_report` over every sm_90a-buildable module's sources, each file parsed with the -D
    flags its call site passes (values guessed where symbolic); sorted by path. `progress(done, total)`
    is called as each file is parsed."""
    from astra.sglang import registry

    by_defines: dict[tuple, set[str]] = {}
    for m in registry.modules(tree):
        if m.sm90a in ("yes", "built"):
            key = tuple(sorted(module_defines(m).items()))
            by_defines.setdefault(key, set()).update(s for s in m.sources if not s.startswith("/"))
    groups, seen = [], set()
    for key, files in sorted(by_defines.items(), key=lambda kv: len(kv[0])):
        todo = sorted(files - seen)
        seen |= files
        if todo:
            groups.append((key, todo))
    total, done = sum(len(todo) for _, todo in groups), 0

    def parsed() -> None:
        nonlocal done
        done += 1
        if progress is not None:
            progress(done, total)

    results = []
    for key, todo in groups:
        results += parse_tree_report(tree, todo, defines=dict(key) or None, on_parsed=parsed)
    results.sort(key=lambda r: r.path)
    return results
