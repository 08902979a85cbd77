"""Is a built candidate the search base's machine code? Then screening it can only measure x1.000.

An edit of a constant the spec's entry never reaches at run time (`kVecWidth` under `kVectorized ? ... : 1`
with the entry instantiating `<false>`) compiles to the same module. `code_digest` hashes what a module
runs: the host code and constants (.text, .rodata, .data) and the device code nvcc embeds (.nv_fatbin),
read from the ELF section table with the standard library. Symbol names, the build id and debug sections
are left out; in .rodata, the build's per-candidate overlay folder (`overlays/<16 hex>/`, in `__FILE__`
strings of assertions and error messages) is masked, so a module built from another overlay still
matches. A digest that differs where the code is the same only costs a screening; a match where the
code differs cannot happen unless those sections are byte-identical, so nothing is skipped that could
have measured differently.
"""

from __future__ import annotations

import hashlib
import re
import struct
from pathlib import Path

CODE_SECTIONS = (".text", ".rodata", ".data", ".nv_fatbin")
_OVERLAY = re.compile(rb"overlays/[0-9a-f]{16}/")  # harness.building.nvcc_build's overlay folder: same length masked


def sections(path: Path) -> dict[str, bytes]:
    """{name: bytes} of an ELF64 little-endian file's sections (empty when it is not one)."""
    data = Path(path).read_bytes()
    if data[:4] != b"\x7fELF" or data[4] != 2 or data[5] != 1:
        return {}
    shoff, = struct.unpack_from("<Q", data, 0x28)
    shentsize, shnum, shstrndx = struct.unpack_from("<HHH", data, 0x3A)
    headers = []
    for i in range(shnum):
        name, kind, _flags, _addr, offset, size = struct.unpack_from("<IIQQQQ", data, shoff + i * shentsize)
        headers.append((name, kind, offset, size))
    if not headers or shstrndx >= len(headers):
        return {}
    _, _, str_off, str_size = headers[shstrndx]
    names = data[str_off:str_off + str_size]
    out = {}
    for name_off, kind, offset, size in headers:
        name = names[name_off:names.index(b"\0", name_off)].decode(errors="replace")
        out[name] = b"" if kind == 8 else data[offset:offset + size]  # SHT_NOBITS (.bss) has no bytes in the file
    return out


def code_digest(path: str | Path) -> str | None:
    """sha256 over the code sections of a built module (None when it has none or cannot be read)."""
    try:
        found = sections(Path(path))
    except (OSError, struct.error, ValueError):
        return None
    present = [name for name in CODE_SECTIONS if name in found]
    if ".text" not in present:
        return None
    digest = hashlib.sha256()
    for name in present:
        body = found[name]
        if name == ".rodata":
            body = _OVERLAY.sub(b"overlays/" + b"0" * 16 + b"/", body)
        digest.update(name.encode() + b"\0" + len(body).to_bytes(8, "little") + body)
    return digest.hexdigest()
