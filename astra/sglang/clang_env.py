"""Where the pieces for parsing CUDA with libclang live, the arguments that use them, and the
errors clang raises on CUDA that nvcc accepts.

Parsing CUDA needs four things besides the source:
  - libclang itself (the `libclang-ng` wheel ships `clang/native/libclang.so`);
  - clang's resource headers (`__clang_cuda_runtime_wrapper.h` and friends), which must come
    from the same clang; libclang-ng ships them in `clang/native/resource/include`
    (override: `ASTRA_CLANG_RESOURCE_DIR`);
  - a CUDA toolkit's headers (`CUDA_HOME`, `CUDA_PATH`, else /usr/local/cuda);
  - tvm-ffi's headers, which every SGLang JIT kernel includes.
Plus two folders of Astra's own (`astra/data/clang/`): a prelude of declarations that close the
gaps between clang's and nvcc's CUDA dialects, and empty stand-ins, searched last, for headers that
clang's CUDA wrapper includes but a toolkit may lack (curand_mtgp32_kernel.h is cuRAND's, missing
from minimal installs; texture_fetch_functions.h left in CUDA 13 and older clang wrappers want it).

Nothing here imports torch or tvm_ffi (tvm_ffi's `libinfo.py` is loaded on its own).
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import os
import re
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from types import ModuleType

from astra import paths
from astra.errors import ToolMissing
from astra.sglang.includes import includes_of

RESOURCE_ENV = "ASTRA_CLANG_RESOURCE_DIR"
INSTALL_HINT = "pip install 'libclang-ng>=22.1'"
DATA_DIR = paths.DATA_DIR / "clang"
PRELUDE_DIR = DATA_DIR / "prelude"
PRELUDE_HEADER = "astra_clang_prelude.h"
FALLBACK_DIR = DATA_DIR / "fallback"
_WRAPPER = "__clang_cuda_runtime_wrapper.h"

# Arguments shared by every parse. Why each one is there:
#   --cuda-device-only   libclang keeps only one of the driver's jobs; name it instead of relying on
#                        the default (the device job): __CUDA_ARCH__ is then set, so device code is
#                        seen as nvcc compiles it for the GPU; host code is still fully analysed.
#   -nocudalib           parsing never links libdevice, so a toolkit without nvvm/ still works.
#   -Wno-c++11-narrowing nvcc hands host code to GCC, which only warns on non-constant narrowing
#                        inside braces; clang makes it an error.
#   -Wno-unknown-cuda-version  a newer toolkit than clang knows is fine for parsing.
BASE_ARGS = (
    "-x", "cuda", "--cuda-device-only", "-std=c++20", "-nocudalib",
    "-Wno-c++11-narrowing", "-Wno-unknown-cuda-version",
)
DEFAULT_ARCH = "sm_90a"


@dataclass(frozen=True)
class ClangEnv:
    """Everything found on this machine that a CUDA parse needs."""

    resource_dir: Path
    cuda_home: Path
    tvm_ffi_include_dirs: tuple[str, ...]

    def args(self, include_dirs: list[str], defines: dict[str, str | None] | None = None,
             arch: str = DEFAULT_ARCH) -> list[str]:
        """The full libclang argument list for one source file (the file name is not included)."""
        args = list(BASE_ARGS) + [
            f"--cuda-gpu-arch={arch}",
            f"--cuda-path={self.cuda_home}",
            "-resource-dir", str(self.resource_dir),
        ]
        cccl = self.cuda_home / "include" / "cccl"
        if cccl.is_dir():  # CUDA 13 moved libcu++/CUB/Thrust here; nvcc adds it itself
            args += ["-isystem", str(cccl)]
        # The prelude folder goes in with -isystem. Besides finding the prelude, an -isystem in the
        # arguments stops libclang-ng's cindex from adding its bundled libc++ headers, which CUDA's
        # host_defines.h rejects on x86 (CUDA parses against the system's libstdc++).
        args += ["-isystem", str(PRELUDE_DIR), "-include", PRELUDE_HEADER]
        args += ["-idirafter", str(FALLBACK_DIR)]
        # SGLang's load_jit passes -DSGL_CUDA_ARCH (900 for sm_90a); its headers #error without it.
        merged = {"SGL_CUDA_ARCH": str(int(re.sub(r"\D", "", arch)) * 10), **(defines or {})}
        args += [f"-D{name}" if value is None else f"-D{name}={value}" for name, value in merged.items()]
        args += [f"-I{d}" for d in include_dirs]
        args += [f"-I{d}" for d in self.tvm_ffi_include_dirs]
        return args


@lru_cache(maxsize=1)
def clang_env() -> ClangEnv:
    """Locate libclang, its resource headers, CUDA and tvm-ffi, or raise ToolMissing saying what to do."""
    load_cindex()
    return ClangEnv(
        resource_dir=find_resource_dir(),
        cuda_home=find_cuda_home(),
        tvm_ffi_include_dirs=tuple(tvm_ffi_include_dirs()),
    )


def libclang_missing() -> str | None:
    """Why libclang cannot parse here (`astra extract` fails, and the rewrite passes all refuse), or None when it can."""
    try:
        clang_env()
    except ToolMissing as err:
        return str(err)
    return None


def load_cindex() -> ModuleType:
    """`clang.cindex`, with its shared library loaded."""
    try:
        import clang.cindex as cindex
    except ImportError as exc:
        raise ToolMissing(
            f"libclang's Python bindings are not installed ({exc}); run: {INSTALL_HINT}") from exc
    try:
        cindex.conf.lib  # noqa: B018  (loads libclang.so)
    except cindex.LibclangError as exc:
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else "no detail"
        raise ToolMissing(f"libclang could not be loaded ({first}); run: {INSTALL_HINT}") from exc
    return cindex


def find_resource_dir() -> Path:
    """clang's resource dir: `ASTRA_CLANG_RESOURCE_DIR`, else the one the libclang-ng wheel ships."""
    override = os.environ.get(RESOURCE_ENV)
    candidate = Path(override).expanduser() if override else _wheel_resource_dir()
    if candidate is not None and (candidate / "include" / _WRAPPER).is_file():
        return candidate.resolve()
    example = "e.g. /usr/lib/llvm-18/lib/clang/18"
    if override:
        raise ToolMissing(
            f"{RESOURCE_ENV}={override} is not a clang resource directory ({candidate}/include has no "
            f"{_WRAPPER}); point it at one ({example}) or unset it to use the headers that the "
            f"libclang-ng wheel ships (`{INSTALL_HINT}`)")
    raise ToolMissing(
        f"clang's resource headers were not found (no {_WRAPPER} in {candidate or 'the clang package'}"
        f"/include); CUDA cannot be parsed without them. Run `{INSTALL_HINT}` (its wheel ships them), "
        f"or set {RESOURCE_ENV} to a clang resource directory ({example})")


def _wheel_resource_dir() -> Path | None:
    spec = importlib.util.find_spec("clang")
    if spec is None or not spec.submodule_search_locations:
        return None
    return Path(list(spec.submodule_search_locations)[0]) / "native" / "resource"


def find_cuda_home() -> Path:
    """The CUDA toolkit whose headers the parse uses (the build's rule, `harness.building.toolchain.cuda_home`)."""
    from harness.building.toolchain import cuda_home

    found = cuda_home()
    home = Path(found or "/usr/local/cuda").expanduser()
    origin = "CUDA_HOME/CUDA_PATH, /usr/local/cuda or nvcc on PATH" if found else "the default location"
    if (home / "include" / "cuda_runtime.h").is_file():
        return home.resolve()
    raise ToolMissing(
        f"no CUDA toolkit headers at {home} ({origin}: include/cuda_runtime.h is missing); "
        "install the CUDA toolkit (nvcc and headers) and set CUDA_HOME to it"
    )


def tvm_ffi_include_dirs() -> list[str]:
    """tvm-ffi's include dirs (its own headers and dlpack), found without importing tvm_ffi."""
    spec = importlib.util.find_spec("tvm_ffi")
    if spec is None or not spec.submodule_search_locations:
        raise ToolMissing("apache-tvm-ffi is not installed (SGLang's kernels include its headers); "
                          "run: pip install 'apache-tvm-ffi>=0.1.11'")
    libinfo = _load_libinfo(Path(list(spec.submodule_search_locations)[0]) / "libinfo.py")
    try:
        dirs = [libinfo.find_include_path(), libinfo.find_dlpack_include_path()]
    except RuntimeError as exc:
        raise ToolMissing(f"apache-tvm-ffi's headers are missing ({exc}); reinstall it: "
                          "pip install --force-reinstall 'apache-tvm-ffi>=0.1.11'") from exc
    return list(dict.fromkeys(dirs))


def _load_libinfo(path: Path) -> ModuleType:
    """tvm_ffi/libinfo.py as a standalone module (importing tvm_ffi itself loads torch)."""
    spec = importlib.util.spec_from_file_location("_astra_tvm_ffi_libinfo", path)
    if spec is None or spec.loader is None or not path.is_file():
        raise ToolMissing(f"apache-tvm-ffi looks broken ({path} is missing); reinstall it: "
                          "pip install --force-reinstall 'apache-tvm-ffi>=0.1.11'")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def dependency_include_dirs() -> list[str]:
    """Include dirs of the header-only dependencies SGLang's loaders may add, where installed.

    Mirrors `sglang/kernels/jit/utils/deps.py` (flashinfer with its bundled CUTLASS, deep_gemm,
    nvidia-mathdx) plus torch's headers for kernels written as torch extensions. Missing
    packages are skipped: the files that need them then fail with "file not found".
    """
    dirs: list[Path] = []
    flashinfer = _package_dir("flashinfer")
    if flashinfer is not None:
        data = flashinfer / "data"
        dirs += [data / "include", data / "csrc", data / "cutlass" / "include",
                 data / "cutlass" / "tools" / "util" / "include", data / "spdlog" / "include",
                 data / "csrc" / "nv_internal", data / "csrc" / "nv_internal" / "include"]
    deep_gemm = _package_dir("deep_gemm")
    if deep_gemm is not None:
        dirs.append(deep_gemm / "include")
    mathdx = _package_dir("nvidia.mathdx")
    if mathdx is not None:
        dirs += [mathdx / "include", mathdx / "external" / "cutlass" / "include"]
    torch = _package_dir("torch")
    if torch is not None:
        dirs += [torch / "include", torch / "include" / "torch" / "csrc" / "api" / "include"]
    return [str(d) for d in dict.fromkeys(dirs) if d.is_dir()]


def _package_dir(name: str) -> Path | None:
    """The directory of an installed package, found without importing it."""
    try:
        spec = importlib.util.find_spec(name)
    except (ImportError, ValueError):
        return None
    if spec is None:
        return None
    if spec.submodule_search_locations:
        return Path(list(spec.submodule_search_locations)[0])
    return Path(spec.origin).parent if spec.origin else None


def tree_include_dirs(tree) -> list[str]:
    """Include dirs for parsing a tree's csrc files the way its loaders build them: the JIT include
    dir, folders inside csrc that loaders add with `extra_include_paths` (inferred: a folder whose
    path completes an `#include` nothing else resolves), and installed header-only dependencies."""
    csrc = Path(tree.csrc_dir)
    dirs = [Path(tree.include_dir)] + _inferred_csrc_dirs(csrc, Path(tree.include_dir))
    return [str(d) for d in dict.fromkeys(dirs)] + dependency_include_dirs()


def _inferred_csrc_dirs(csrc: Path, include_dir: Path) -> list[Path]:
    sources = [p for p in sorted(csrc.rglob("*")) if p.is_file() and p.suffix in
               (".cu", ".cuh", ".h", ".hpp", ".inl")]
    rel_files = {p.relative_to(csrc).as_posix() for p in sources}
    dirs: dict[Path, None] = {}
    for source in sources:
        for name in includes_of(source.read_text(errors="replace")):
            if "/" not in name or (source.parent / name).exists() or (include_dir / name).exists():
                continue
            owners = {f[: -len(name)] for f in rel_files if f.endswith("/" + name) or f == name}
            if len(owners) == 1:
                dirs.setdefault(csrc / owners.pop())
    return [d.resolve() for d in dirs]


# ---------------------------------------------------------------- precompiled prefix

# What SGLang's load_jit writes before the kernel file in every generated cuda.cu. Parsing these
# once into a precompiled header, and starting each parse from it, mirrors the real build and
# makes a parse about 2.4 times faster (tvm-ffi's headers are most of a kernel's parse time).
WRAPPER_PREFIX = ("tvm/ffi/container/tensor.h", "tvm/ffi/dtype.h", "tvm/ffi/error.h",
                  "tvm/ffi/extra/c_env_api.h", "tvm/ffi/function.h")


def prefix_pch(args: list[str]) -> Path | None:
    """A precompiled header of WRAPPER_PREFIX for parses with `args`, cached under
    $ASTRA_HOME/clang-pch and rebuilt when a header in it changes; None if it cannot be built
    (the parse then simply goes without)."""
    cindex = load_cindex()
    lib = Path(cindex.conf.get_filename())
    stat = lib.stat() if lib.is_file() else None
    key_data = [args, str(lib), stat.st_size if stat else 0, stat.st_mtime_ns if stat else 0, WRAPPER_PREFIX]
    key = hashlib.sha256(json.dumps(key_data).encode()).hexdigest()[:20]
    pch = paths.sub("clang-pch") / f"{key}.pch"
    manifest = pch.with_suffix(".json")
    if pch.is_file() and _fresh(manifest):
        return pch
    return _build_pch(cindex, args, pch, manifest)


def _build_pch(cindex, args: list[str], pch: Path, manifest: Path) -> Path | None:
    header = pch.with_suffix(".cuh")
    text = "".join(f"#include <{h}>\n" for h in WRAPPER_PREFIX)
    if not header.is_file() or header.read_text() != text:  # a rewrite would stale a PCH in use
        header.write_text(text)
    tu = cindex.Index.create().parse(str(header), args=args,
                                     options=cindex.TranslationUnit.PARSE_INCOMPLETE)
    if any(d.severity >= 3 for d in tu.diagnostics):
        return None
    files = {str(header)} | {inc.include.name for inc in tu.get_includes()}
    tmp = pch.with_suffix(f".{os.getpid()}.pch.tmp")
    try:
        tu.save(str(tmp))
    except cindex.TranslationUnitSaveError:
        tmp.unlink(missing_ok=True)
        return None
    tmp_manifest = manifest.with_suffix(f".{os.getpid()}.json.tmp")
    tmp_manifest.write_text(json.dumps({f: _stamp(Path(f)) for f in sorted(files)}))
    os.replace(tmp, pch)
    os.replace(tmp_manifest, manifest)
    return pch


def _stamp(path: Path) -> list[int]:
    stat = path.stat()
    return [stat.st_size, stat.st_mtime_ns]


def _fresh(manifest: Path) -> bool:
    """Whether every file the precompiled header was built from is unchanged."""
    try:
        stamps = json.loads(manifest.read_text())
        return all(_stamp(Path(f)) == stamp for f, stamp in stamps.items())
    except (OSError, ValueError):
        return False


# ---------------------------------------------------------------- clang vs nvcc


def code_tokens(cursor) -> list:
    """The tokens of `cursor`'s extent, comments left out. The extent is rebuilt from file positions:
    libclang tokenizes nothing for an extent that starts in a macro (`SGL_DEVICE int f()`)."""
    start, end = cursor.extent.start, cursor.extent.end
    if start.file is None:
        return []
    tu = cursor.translation_unit
    extent = tu.get_extent(start.file.name, ((start.line, start.column), (end.line, end.column)))
    return [t for t in tu.get_tokens(extent=extent) if t.kind.name != "COMMENT"]


# Errors clang raises on code that nvcc, as SGLang invokes it, compiles. They are listed apart
# (`clang_only_errors`) so that an empty `diagnostics` means what a clean nvcc build would.
_NVCC_ASM_DIALECT = (
    "invalid % escape in inline assembly string",  # nvcc passes `%laneid` etc. through to PTX
    "invalid input constraint 'C' in asm",  # nvcc's "C" constraint: a compile-time string (CUDA 12.4+)
)


def nvcc_accepts(tu, diag) -> bool:
    """Whether `diag`, an error in `tu`, is one that nvcc (as SGLang runs it) does not raise."""
    text = diag.spelling
    if text.startswith(_NVCC_ASM_DIALECT):
        return True
    if text.startswith("no matching function for call to"):
        notes = [n for n in diag.children if n.spelling.startswith("candidate")]
        return bool(notes) and all(_relaxed_constexpr_candidate(tu, n) for n in notes)
    return False


def _relaxed_constexpr_candidate(tu, note) -> bool:
    """A host call to a `constexpr __device__` function: nvcc allows it under
    --expt-relaxed-constexpr (SGLang always passes it); clang has no such switch."""
    if "call to __device__ function from __host__ function" not in note.spelling:
        return False
    decl = load_cindex().Cursor.from_location(tu, note.location)
    if decl is None or decl.kind.name not in ("FUNCTION_DECL", "FUNCTION_TEMPLATE"):
        return False
    tokens = [t.spelling for t in code_tokens(decl)]
    head = tokens[: tokens.index("{")] if "{" in tokens else tokens
    return "constexpr" in head
