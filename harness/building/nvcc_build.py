"""Building a kernel module exactly as SGLang's `load_jit` does, plus a content-hashed cache.

A build is a generated wrapper (`cuda.cu` and/or `main.cpp`: the tvm-ffi includes, an `#include` of each
kernel file, one `TVM_FFI_DLL_EXPORT_TYPED_FUNC` per wrapper inside `namespace sglang`), compiled with
SGLang's flags plus `-Xptxas=-v` (resource report only; the SASS is unchanged) and linked into a `.so`.

A candidate kernel is built with `overrides`: its text replaces one file of the tree. The replaced file
lives in a mirror of its root (`<cache>/overlays/<hash>/root<i>/`, every other file a symlink to the
original), so quoted includes in both directions resolve as they would in a patched tree.

Every failure (compile error, missing nvcc, timeout, unwritable cache) is a `BuildResult` with ok=False.
Imports only the standard library and, lazily, tvm_ffi and torch: this runs on a bare GPU box.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
import re
import shutil
import subprocess
import threading
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Callable

from harness.building.ptxas import KernelResources, find_demangler, parse_ptxas
from harness.building.sources import file_digest, materialise_overlay, override_targets, tree_digest, wrapper_source
from harness.building.toolchain import (
    BuildFailure,
    arch_flags,
    cuda_home,
    default_arch,
    host_compiler,
    nvcc_path,
    tool_version,
    tvm_ffi_paths,
    tvm_ffi_version,
)
from harness.worker import children

__all__ = ["BuildRequest", "BuildResult", "build", "build_many", "cached", "trim_errors"]

KEY_VERSION = "astra-harness-build-1"
BUILD_JOBS_ENV = "ASTRA_BUILD_JOBS"  # builds at once by default (build_jobs)
TIMED_OUT = "build timed out"  # how a build's reason starts when a tool ran past the build's time
DISK_FULL = ("No space left on device", "ENOSPC", "Disk quota exceeded")  # what a tool says when the disk is full
_NAME_RE = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.-]*$")


@dataclass
class BuildRequest:
    """One module to build. Relative `cuda_files`/`cpp_files` resolve against `source_root` (csrc)."""

    name: str
    source_root: str
    include_dirs: list[str]
    cuda_files: list[str]
    cpp_files: list[str] = field(default_factory=list)
    cuda_wrappers: list[tuple[str, str]] = field(default_factory=list)
    cpp_wrappers: list[tuple[str, str]] = field(default_factory=list)
    extra_cuda_cflags: list[str] = field(default_factory=list)
    extra_cflags: list[str] = field(default_factory=list)
    extra_ldflags: list[str] = field(default_factory=list)
    header_only: bool = True
    arch: str | None = "90a"  # None: the local GPU's target (see toolchain.default_arch)
    overrides: dict[str, str] = field(default_factory=dict)


@dataclass
class BuildResult:
    """What a build produced; `error` is a trimmed excerpt for a reader, `log` the full output. `refused`: a
    compiler or the linker refused the sources (building them again says the same), as opposed to the machine
    failing the build (a full disk, a timeout, a tool that could not run)."""

    ok: bool
    so_path: str | None
    cache_hit: bool
    seconds: float
    command: list[str]
    log: str
    error: str | None
    resources: list[KernelResources]
    key: str
    refused: bool = False


@dataclass
class _Plan:
    """A request resolved into files to write and commands to run (cwd = the build directory)."""

    units: list[tuple[str, bool, str | None]]  # (filename, is_cuda, generated text or None)
    commands: list[list[str]]  # compiles, then the link
    so_name: str
    overlay: Path | None
    targets: dict[int, dict[str, str]]  # root index -> {relative path: replacement text}
    roots: list[str]  # original [source_root, *include_dirs]
    tree_digest: str


def plan_build(req: BuildRequest, cache_dir: Path) -> _Plan:
    """Resolve sources (through an overlay when there are overrides) and write out every command."""
    roots = [req.source_root, *req.include_dirs]
    digest = tree_digest(roots)
    targets = override_targets(req.overrides, roots)
    overlay = None
    if targets:
        seed = json.dumps([digest, [os.path.abspath(r) for r in roots], sorted(req.overrides.items())])
        overlay = cache_dir.resolve() / "overlays" / hashlib.sha256(seed.encode()).hexdigest()[:16]
    effective = [str(overlay / f"root{i}") if i in targets else os.path.abspath(r) for i, r in enumerate(roots)]

    def resolve(path: str) -> str:  # a relative file: the first root that has it (as overrides do)
        if os.path.isabs(path):
            return path
        index = next((i for i, root in enumerate(roots) if os.path.isfile(os.path.join(root, path))), 0)
        return os.path.join(effective[index], path)

    cuda, cpp = [resolve(p) for p in req.cuda_files], [resolve(p) for p in req.cpp_files]
    units: list[tuple[str, bool, str | None]] = []
    if req.header_only:
        if cpp or req.cpp_wrappers:
            units.append(("main.cpp", False, wrapper_source(cpp, req.cpp_wrappers)))
        if cuda or req.cuda_wrappers:
            units.append(("cuda.cu", True, wrapper_source(cuda, req.cuda_wrappers)))
    else:
        units = [(path, path.endswith(".cu"), None) for path in cpp + cuda]
    if not units:
        raise BuildFailure("nothing to build: no cuda_files, cpp_files or wrappers")
    commands = _commands(req, units, effective[1:])
    return _Plan(units, commands, f"{req.name}.so", overlay, targets, roots, digest)


def _commands(req: BuildRequest, units: list[tuple[str, bool, str | None]], includes: list[str]) -> list[list[str]]:
    """Compile commands (one per unit, with a depfile) and the link, in SGLang's flag order."""
    ffi_includes, lib_dir, lib_name = tvm_ffi_paths()
    include_flags = [f"-I{path}" for path in [*ffi_includes, *includes]]
    cxx = host_compiler()
    with_device = any(is_cuda for _, is_cuda, _ in units)
    nvcc = nvcc_path() if with_device else None
    commands, objects = [], []
    for index, (filename, is_cuda, _) in enumerate(units):
        obj = f"{Path(filename).stem}_{index}.o"
        objects.append(obj)
        if is_cuda:
            ptxas_v = [] if "-Xptxas=-v" in req.extra_cuda_cflags else ["-Xptxas=-v"]
            flags = ["-Xcompiler", "-fPIC", *arch_flags(req.arch or default_arch()), "-std=c++20", "-O3",
                     "--expt-relaxed-constexpr", *req.extra_cuda_cflags, *ptxas_v]
            commands.append([nvcc, "-MD", "-MF", f"{obj}.d", *flags, *include_flags, "-c", filename, "-o", obj])
        else:
            flags = ["-fPIC", "-std=c++20", "-O3", *req.extra_cflags]
            commands.append([cxx, "-MD", "-MF", f"{obj}.d", *flags, *include_flags, "-c", filename, "-o", obj])
    link = [cxx, *objects, "-shared", f"-L{lib_dir}", f"-l{lib_name}"]
    if with_device:
        link += [f"-L{cuda_home()}/lib64", "-lcudart"]
    commands.append([*link, *req.extra_ldflags, "-o", f"{req.name}.so"])
    return commands


def build_key(req: BuildRequest, plan: _Plan) -> str:
    """sha256 over everything that can change the output: texts, sources, flags, tool versions."""
    tools = sorted({command[0] for command in plan.commands})
    originals = [p if os.path.isabs(p) else os.path.join(req.source_root, p) for p in req.cuda_files + req.cpp_files]
    payload = {
        "version": KEY_VERSION,
        "name": req.name,
        "units": plan.units,
        "commands": plan.commands,
        "tree": plan.tree_digest,
        "sources": {path: file_digest(path) for path in originals},
        "overrides": sorted(req.overrides.items()),
        "tools": {tool: tool_version(tool) for tool in tools},
        "arch": req.arch or default_arch(),
        "tvm_ffi": tvm_ffi_version(),
    }
    return hashlib.sha256(json.dumps(payload, sort_keys=True).encode()).hexdigest()


# ---------------------------------------------------------------- running the compiler

_DIAGNOSTIC_RE = re.compile(
    r"(\(\d+\): (catastrophic )?error)|(:\d+(:\d+)?: (fatal )?error:)|(^(nvcc|ptxas) (error|fatal))"
    r"|(undefined reference to)|(^collect2: error)|(^\S*ld: )"
)


def trim_errors(log: str, strip: list[str] = (), max_errors: int = 5, max_lines: int = 40) -> str:
    """The first few error diagnostics with file:line and their indented context, for a reader.

    Overlay prefixes in `strip` are removed so a candidate's file reads as its tree-relative path.
    Falls back to the last lines of the log when no diagnostic is recognised.
    """
    for prefix in strip:
        log = log.replace(prefix.rstrip("/") + "/", "")
    lines = log.splitlines()
    starts = [i for i, line in enumerate(lines) if _DIAGNOSTIC_RE.search(line)]
    picked: list[str] = []
    for start in starts[:max_errors]:
        picked.append(lines[start])
        for line in lines[start + 1 : start + 9]:
            if not line.strip() or not line[0].isspace():
                break
            picked.append(line)
    if not starts:
        picked = [line for line in lines if line.strip()][-20:]
    if len(starts) > max_errors:
        picked.append(f"... and {len(starts) - max_errors} more error lines (see the full log)")
    return "\n".join(picked[:max_lines])


def _run(command: list[str], cwd: Path, timeout: float) -> tuple[int | None, str]:
    """Run one command in its own process group (a tracked child: it ends with this process); on timeout
    kill the group and return rc None."""
    if timeout <= 0:
        return None, ""
    with children.started(command, cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                          text=True, errors="replace") as proc:
        try:
            output, _ = proc.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            children.kill_group(proc.pid)
            output, _ = proc.communicate()
            return None, output
        return proc.returncode, output


def _run_all(plan: _Plan, cwd: Path, deadline: float, keep_going: bool) -> tuple[str, str | None]:
    """Run the compiles, then the link if they all passed. Returns (log, failure reason or None).

    Without `keep_going` the first failing compile stops the build; with it every unit is compiled.
    """
    log: list[str] = []
    reason = None
    compiles, link = plan.commands[:-1], plan.commands[-1]
    for command in compiles + [link]:
        if reason is not None and (command is link or not keep_going):
            break
        rc, output = _run(command, cwd, deadline - time.monotonic())
        log.append("$ " + " ".join(command) + "\n" + output)
        tool = Path(command[0]).name
        if rc is None:
            return "\n".join(log), f"{TIMED_OUT} (in {tool})"
        if rc != 0 and reason is None:
            reason = f"{tool} exited with status {rc}"
    return "\n".join(log), reason


# ---------------------------------------------------------------- the cache


@contextmanager
def _flock(path: Path):
    """Exclusive advisory lock on `path`: one builder per key across threads and processes."""
    handle = os.open(path, os.O_CREAT | os.O_RDWR, 0o644)
    try:
        fcntl.flock(handle, fcntl.LOCK_EX)
        yield
    finally:
        os.close(handle)


def _cached(final: Path, key: str, start: float) -> BuildResult | None:
    """The published build in `final`, or None when there is none (or it is unreadable)."""
    if not (final / ".done").exists():
        return None
    try:
        meta = json.loads((final / "result.json").read_text())
        resources = [KernelResources(**item) for item in json.loads((final / "resources.json").read_text())]
        log = (final / "build.log").read_text()
    except (OSError, ValueError, TypeError):
        return None
    return BuildResult(True, str(final / meta["so_name"]), True, time.monotonic() - start, meta["command"], log,
                       None, resources, key)


def disk_full(text: str | None) -> bool:
    """Whether a build's output says the disk (or the quota) is full."""
    return any(marker in (text or "") for marker in DISK_FULL)


def _failed(reason: str, start: float, key: str = "", command: list[str] | None = None, log: str = "") -> BuildResult:
    return BuildResult(False, None, False, time.monotonic() - start, command or [], log, reason, [], key)


def build(req: BuildRequest, cache_dir: Path, *, timeout_s: float = 300, keep_going: bool = False,
          prepared: Callable[[], None] | None = None) -> BuildResult:
    """Build `req` (or reuse the cached build with the same key). Never raises for a failed build.

    `keep_going` compiles every translation unit even after one fails, so the log holds all errors.
    `prepared` is called once, when what is left needs little of this interpreter: the sources are planned and
    overlaid, and the build waits for its key's lock, then for its compilers (or it returned). It must not raise.
    """
    start = time.monotonic()
    cache_dir = Path(cache_dir)
    key = ""
    told = [prepared is None]

    def tell() -> None:
        if not told[0]:
            told[0] = True
            prepared()  # type: ignore[misc]

    try:
        if not _NAME_RE.match(req.name):
            raise BuildFailure(f"bad module name {req.name!r}: use letters, digits, '_', '.', '-'")
        cache_dir.mkdir(parents=True, exist_ok=True)
        plan = plan_build(req, cache_dir)
        key = build_key(req, plan)
        final = cache_dir / f"{req.name}-{key[:16]}"
        if hit := _cached(final, key, start):
            return hit
        if plan.overlay is not None:  # safe beside other builders (staged, then renamed into place)
            materialise_overlay(plan.overlay, plan.roots, plan.targets)
        tell()
        with _flock(cache_dir / f".{req.name}-{key[:16]}.lock"):
            if hit := _cached(final, key, start):
                return hit
            return _build_locked(plan, key, final, timeout_s, keep_going, start)
    except BuildFailure as failure:
        return _failed(str(failure), start, key)
    except (OSError, subprocess.SubprocessError) as error:
        return _failed(f"build could not run: {error}", start, key)
    finally:
        tell()


def cached(req: BuildRequest, cache_dir: Path) -> BuildResult | None:
    """The published build of `req` in `cache_dir`, without building or waiting for a builder (None: none yet)."""
    start = time.monotonic()
    cache_dir = Path(cache_dir)
    try:
        if not _NAME_RE.match(req.name) or not cache_dir.is_dir():
            return None
        plan = plan_build(req, cache_dir)
        key = build_key(req, plan)
        return _cached(cache_dir / f"{req.name}-{key[:16]}", key, start)
    except (BuildFailure, OSError, subprocess.SubprocessError):
        return None


def _nvcc_command(plan: _Plan) -> list[str]:
    """The device compile command, or the first compile when the module has no CUDA unit."""
    for (_, is_cuda, _), command in zip(plan.units, plan.commands):
        if is_cuda:
            return command
    return plan.commands[0]


def _build_locked(plan: _Plan, key: str, final: Path, timeout_s: float, keep_going: bool, start: float) -> BuildResult:
    """Compile in a private staging directory; publish a success by rename (under the key's lock).

    Failures are returned, never cached: a fixed environment (a header installed) must not keep failing.
    """
    staging = final.parent / f".staging-{uuid.uuid4().hex}"
    staging.mkdir()
    try:
        for filename, _, text in plan.units:
            if text is not None:
                (staging / filename).write_text(text)
        log, reason = _run_all(plan, staging, time.monotonic() + timeout_s, keep_going)
        resources = parse_ptxas(log, find_demangler(cuda_home()))
        command = _nvcc_command(plan)
        if reason is not None:
            strip = [str(plan.overlay / f"root{i}") for i in plan.targets] if plan.overlay else []
            excerpt = trim_errors(log, strip)
            timed_out = reason.startswith(TIMED_OUT)
            if timed_out:
                excerpt = f"{reason} after {timeout_s:g} s\n{excerpt}".rstrip()
            return BuildResult(False, None, False, time.monotonic() - start, command, log,
                               excerpt or reason, resources, key, refused=not timed_out and not disk_full(log))
        meta = {"ok": True, "command": command, "commands": plan.commands,
                "so_name": plan.so_name, "seconds": time.monotonic() - start}
        (staging / "build.log").write_text(log)
        (staging / "resources.json").write_text(json.dumps([asdict(r) for r in resources], indent=1))
        (staging / "result.json").write_text(json.dumps(meta, indent=1))
        (staging / "deps.txt").write_text("\n".join(_dependencies(staging)) + "\n")
        (staging / ".done").touch()
        if final.exists():
            shutil.rmtree(final)  # a leftover without .done; we hold the lock
        os.rename(staging, final)
        return BuildResult(True, str(final / plan.so_name), False, time.monotonic() - start, command, log,
                           None, resources, key)
    finally:
        shutil.rmtree(staging, ignore_errors=True)


def _dependencies(build_dir: Path) -> list[str]:
    """Every file the compilers read, from the `-MD -MF` depfiles (make syntax) the build left."""
    found: dict[str, None] = {}
    for depfile in sorted(build_dir.glob("*.o.d")):
        text = depfile.read_text(errors="replace").replace("\\\n", " ")
        for line in text.splitlines():
            _, _, prerequisites = line.partition(": ")
            for token in re.split(r"(?<!\\)\s+", prerequisites.strip()):
                if token:
                    found[token.replace("\\ ", " ")] = None
    return list(found)


def build_jobs() -> int:
    """Builds at once by default: $ASTRA_BUILD_JOBS where set (astra.scale.local gives each GPU worker its share of
    the host's cores), else every core."""
    try:
        wanted = int(os.environ.get(BUILD_JOBS_ENV, ""))
    except ValueError:
        wanted = 0
    return wanted if wanted > 0 else os.cpu_count() or 1


def build_many(reqs: list[BuildRequest], cache_dir: Path, jobs: int | None = None,
               progress: Callable[[int, int], None] | None = None, **kwargs) -> list[BuildResult]:
    """Build several requests in parallel threads (each runs its compiler as a subprocess); results in
    the order given. The largest sources start first: a Marlin GEMM compiles for minutes, and started
    last it would hold the whole batch up long after every small module is done. `progress(done, total)`
    is called (from the building thread) as each build ends."""
    order = sorted(range(len(reqs)), key=lambda i: -source_size(reqs[i]))
    ended, lock = [0], threading.Lock()

    def one(i: int) -> BuildResult:
        result = build(reqs[i], cache_dir, **kwargs)
        if progress is not None:
            with lock:
                ended[0] += 1
                progress(ended[0], len(reqs))
        return result

    with ThreadPoolExecutor(max_workers=jobs or build_jobs()) as pool:
        futures = {i: pool.submit(one, i) for i in order}
        return [futures[i].result() for i in range(len(reqs))]


def source_size(req: BuildRequest) -> int:
    """Bytes of the request's own source files (the first root that has each, overrides as given): a
    cheap stand-in for how long nvcc will take on it."""
    total = 0
    for rel in [*req.cuda_files, *req.cpp_files]:
        if rel in req.overrides:
            total += len(req.overrides[rel])
            continue
        for root in [req.source_root, *req.include_dirs]:
            path = rel if os.path.isabs(rel) else os.path.join(root, rel)
            if os.path.isfile(path):
                total += os.path.getsize(path)
                break
    return total
