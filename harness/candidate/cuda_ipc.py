"""Outputs handed from the candidate process to the judge on the GPU itself (CUDA IPC), instead of through files.

A file costs a device-to-host copy and a write in the candidate process, a read and a host-to-device copy in
the judge: seconds per GiB, on every trial of every case. Here the candidate process keeps each output
tensor alive on the GPU and names it by an IPC handle of its allocation, an offset and a length; the judge
maps the allocation, copies those bytes into memory of its own (device to device), and unmaps it before
the candidate process may free it (the candidate frees a case's tensors only once the judge has deleted
the case's directory: harness.candidate.exchange's backpressure).

Trust. The bytes are the candidate's own outputs, exactly what a file would have held: the judge validates
the length against the job, refuses an offset or length outside the mapped allocation (`Malformed`), copies
them before judging and never maps anything writable into the candidate. A handle that does not open is
`Malformed` too. The only CUDA calls are the driver API's (libcuda.so.1, loaded by every CUDA process):
cuMemGetAddressRange and cuIpcGetMemHandle in the candidate, cuIpcOpenMemHandle, cuMemcpyDtoD and
cuIpcCloseMemHandle in the judge. Where any of them is missing or fails in the candidate process, it writes
files as before (`export` returns None).
"""

from __future__ import annotations

import ctypes
from typing import Any

import torch

HANDLE_BYTES = 64
_LAZY_ENABLE_PEER_ACCESS = 1
_driver: Any = None


class _Handle(ctypes.Structure):
    """CUipcMemHandle: 64 opaque bytes, passed BY VALUE to cuIpcOpenMemHandle (a ctypes array would be a pointer)."""

    _fields_ = [("reserved", ctypes.c_char * HANDLE_BYTES)]


class IpcError(RuntimeError):
    """A CUDA IPC call failed (its CUresult in the message)."""


def _load() -> Any:
    global _driver
    if _driver is None:
        try:
            lib = ctypes.CDLL("libcuda.so.1")
        except OSError:
            _driver = False
            return False
        lib.cuMemGetAddressRange_v2.argtypes = [ctypes.POINTER(ctypes.c_uint64), ctypes.POINTER(ctypes.c_size_t),
                                                ctypes.c_uint64]
        lib.cuIpcGetMemHandle.argtypes = [ctypes.POINTER(_Handle), ctypes.c_uint64]
        lib.cuIpcOpenMemHandle_v2.argtypes = [ctypes.POINTER(ctypes.c_uint64), _Handle, ctypes.c_uint]
        lib.cuIpcCloseMemHandle.argtypes = [ctypes.c_uint64]
        lib.cuMemcpyDtoD_v2.argtypes = [ctypes.c_uint64, ctypes.c_uint64, ctypes.c_size_t]
        _driver = lib
    return _driver


def _check(result: int, what: str) -> None:
    if result != 0:
        raise IpcError(f"{what} failed (CUresult {result})")


def available() -> bool:
    """Whether the CUDA driver API can be called here (loads it: call before the sandbox seals)."""
    return bool(_load())


def export(tensor: torch.Tensor) -> dict[str, Any] | None:
    """{"handle": hex, "offset": bytes into the allocation} of a contiguous CUDA tensor, or None when IPC is
    not possible here (the caller writes a file instead). The tensor must stay alive until the judge read it."""
    lib = _load()
    if not lib or tensor.device.type != "cuda" or not tensor.is_contiguous():
        return None
    pointer = tensor.data_ptr()
    base, size = ctypes.c_uint64(), ctypes.c_size_t()
    handle = _Handle()
    try:
        _check(lib.cuMemGetAddressRange_v2(ctypes.byref(base), ctypes.byref(size), pointer), "cuMemGetAddressRange")
        _check(lib.cuIpcGetMemHandle(ctypes.byref(handle), base.value), "cuIpcGetMemHandle")
    except IpcError:
        return None
    return {"handle": bytes(handle).hex(), "offset": pointer - base.value}


class Imports:
    """The judge's mappings of the candidate's allocations for one case: each handle opened once, all closed
    by `close` (or the context manager's exit), after the device finished the copies."""

    def __init__(self) -> None:
        self.opened: dict[str, tuple[int, int]] = {}
        self.copies = 0

    def __enter__(self) -> "Imports":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _open(self, handle: str) -> tuple[int, int]:
        if handle not in self.opened:
            lib = _load()
            if not lib:
                raise IpcError("the CUDA driver API is not available in the judge")
            raw = bytes.fromhex(handle)
            if len(raw) != HANDLE_BYTES:
                raise IpcError(f"a handle of {len(raw)} bytes")
            pointer, base, size = ctypes.c_uint64(), ctypes.c_uint64(), ctypes.c_size_t()
            _check(lib.cuIpcOpenMemHandle_v2(ctypes.byref(pointer), _Handle.from_buffer_copy(raw),
                                             _LAZY_ENABLE_PEER_ACCESS), "cuIpcOpenMemHandle")
            try:
                _check(lib.cuMemGetAddressRange_v2(ctypes.byref(base), ctypes.byref(size), pointer.value),
                       "cuMemGetAddressRange")
            except IpcError:
                lib.cuIpcCloseMemHandle(pointer.value)
                raise
            self.opened[handle] = (pointer.value, int(size.value))
        return self.opened[handle]

    def copy(self, handle: str, offset: int, nbytes: int, device: torch.device) -> torch.Tensor:
        """`nbytes` bytes at `offset` of the candidate's allocation `handle`, copied into a new uint8 tensor of
        the judge's on `device`. Raises IpcError (a handle that does not open, a range outside the allocation)."""
        pointer, size = self._open(handle)
        if not (isinstance(offset, int) and 0 <= offset and offset + nbytes <= size):
            raise IpcError(f"bytes [{offset}, {offset}+{nbytes}) lie outside the allocation of {size} bytes")
        out = torch.empty(nbytes, dtype=torch.uint8, device=device)
        # On the legacy default stream: ordered with the judge's work on torch's default stream, where every read
        # of the candidate's outputs happens (a caller on a non-blocking stream would have to synchronise first).
        if nbytes:
            _check(_load().cuMemcpyDtoD_v2(out.data_ptr(), pointer + offset, nbytes), "cuMemcpyDtoD")
        self.copies += 1
        return out

    def close(self) -> None:
        if not self.opened:
            return
        torch.cuda.synchronize()
        lib = _load()
        for pointer, _ in self.opened.values():
            lib.cuIpcCloseMemHandle(pointer)
        self.opened.clear()
