"""Loading built modules and reading their exports' typed signatures (tvm-ffi)."""

from __future__ import annotations

import json
import re
from pathlib import Path


def load_module(so_path: str | Path):
    """Load a built module with tvm_ffi (imports torch first if installed, as tvm_ffi does)."""
    import tvm_ffi

    return tvm_ffi.load_module(str(so_path))


_SIGNATURE_RE = re.compile(r"`([^`]*\([^`]*\)[^`]*)`")
_PROBE_ARGS = 255  # no kernel takes this many, so the call is refused before any code runs


def export_signatures(module, names: list[str]) -> dict[str, str | None]:
    """Each export's typed signature, e.g. "scale_f32(0: DLTensor*, 1: float) -> void"; None if absent.

    tvm-ffi 0.1.11 only exports metadata when built with TVM_FFI_DLL_EXPORT_INCLUDE_METADATA (SGLang
    does not), but a typed function called with the wrong number of arguments raises a TypeError that
    quotes its signature. We call with 255 Nones rather than none, so a zero-argument export never runs.
    """
    signatures: dict[str, str | None] = {}
    for name in names:
        try:
            function = module.get_function(name)
        except AttributeError:
            signatures[name] = None
            continue
        try:
            function(*([None] * _PROBE_ARGS))
        except (TypeError, ValueError, RuntimeError) as error:
            match = _SIGNATURE_RE.search(str(error))
            signatures[name] = match.group(1) if match else str(error)
        else:
            signatures[name] = "(untyped export: accepted any arguments)"
    return signatures


def warm_signature_probe() -> None:
    """Pay now what the first error a tvm-ffi function raises in this process costs (most of a second: its
    backtrace machinery reads the symbols of the libraries loaded), so that `export_signatures` of a module loaded
    later answers at once: a built-in global function probed with the wrong number of arguments."""
    import tvm_ffi

    try:
        probe = tvm_ffi.get_global_func("ffi.String")
    except (AttributeError, ValueError, RuntimeError):
        return
    if probe is None:
        return
    try:
        probe(*([None] * _PROBE_ARGS))
    except (TypeError, ValueError, RuntimeError):
        pass


def kept_signatures(module, so_path: str | Path, names: list[str]) -> dict[str, str | None]:
    """`export_signatures` of a module of the build cache, kept beside it (`<module>.signatures.json`) for the next
    evaluation: a cached module never changes (its folder is named by the digest of what built it), and the first
    error a tvm-ffi module raises costs most of a second (its backtrace machinery reads the module's symbols)."""
    kept = Path(f"{so_path}.signatures.json")
    try:
        stored = json.loads(kept.read_text())
        if isinstance(stored, dict) and all(name in stored for name in names):
            return {name: stored[name] for name in names}
    except (OSError, ValueError):
        pass
    signatures = export_signatures(module, names)
    from harness.worker.process_group import write_json_atomic

    try:
        write_json_atomic(kept, signatures)
    except OSError:
        pass  # a read-only cache: computed again next time
    return signatures
