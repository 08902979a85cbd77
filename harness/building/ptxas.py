"""Per-kernel resource use from ptxas's `-v` report (registers, spills, stack, shared and constant memory).

nvcc prints the report on stderr when given `-Xptxas=-v`:

    ptxas info    : Compiling entry function '_Z12scale_kernelIfEvPT_lf' for 'sm_90a'
    ptxas info    : Function properties for _Z12scale_kernelIfEvPT_lf
        0 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads
    ptxas info    : Used 10 registers, used 1 barriers, 512 bytes smem, 360 bytes cmem[0]

Toolkits word the "Used" line differently (older ones: no barriers, `cumulative stack size`, and
`cmem[N]` banks; CUDA 13 omits constant memory); each field is matched on its own, a missing count
reads as 0, and constant memory as None ("-" in the table) where it is not reported.
"""

from __future__ import annotations

import re
import shutil
import subprocess
from dataclasses import dataclass

_ENTRY_RE = re.compile(r"Compiling entry function '([^']+)' for '([^']+)'")
_PROPS_RE = re.compile(r"Function properties for (\S+)")
_FRAME_RE = re.compile(
    r"(\d+) bytes stack frame, (\d+) bytes spill stores, (\d+) bytes spill loads"
)
_USED_RE = re.compile(r"ptxas info\s*: Used (\d+) registers")
_BARRIERS_RE = re.compile(r"used (\d+) barriers")
_SMEM_RE = re.compile(r"(\d+) bytes smem")
_CMEM_RE = re.compile(r"(\d+) bytes cmem\[\d+\]")
_CUMULATIVE_STACK_RE = re.compile(r"(\d+) bytes cumulative stack size")


@dataclass
class KernelResources:
    """What ptxas reports for one entry function compiled for one architecture."""

    name: str  # demangled where a demangler was found, else the mangled name
    mangled: str
    arch: str  # e.g. "sm_90a"
    registers: int = 0
    spill_stores: int = 0  # bytes
    spill_loads: int = 0  # bytes
    stack_frame: int = 0  # bytes
    smem: int = 0  # static shared memory, bytes
    cmem: int | None = None  # constant memory over all banks, bytes; None where ptxas omits it (CUDA 13)
    barriers: int = 0

    @property
    def spills(self) -> int:
        """Total spill traffic in bytes (stores + loads)."""
        return self.spill_stores + self.spill_loads


def find_demangler(cuda_home: str | None = None) -> str | None:
    """GNU `c++filt` on PATH, else the toolkit's `cu++filt`, else None.

    c++filt comes first so names read the same on every machine (cu++filt writes `float *`,
    c++filt `float*`); both demangle the Itanium names nvcc emits.
    """
    found = shutil.which("c++filt")
    if found:
        return found
    if cuda_home:
        found = shutil.which("cu++filt", path=f"{cuda_home}/bin")
    return found or shutil.which("cu++filt")


def demangle(names: list[str], tool: str | None) -> dict[str, str]:
    """Map each mangled name to its demangled form; names stay as they are without a tool."""
    unique = sorted(set(names))
    if not tool or not unique:
        return {name: name for name in unique}
    try:
        done = subprocess.run(
            [tool, *unique], capture_output=True, text=True, timeout=30, check=False
        )
    except (OSError, subprocess.SubprocessError):
        return {name: name for name in unique}
    lines = done.stdout.splitlines()
    if done.returncode != 0 or len(lines) != len(unique):
        return {name: name for name in unique}
    return dict(zip(unique, lines))


def _apply_used_line(record: KernelResources, line: str) -> None:
    """Fill registers, barriers, smem, cmem (and an old-style stack size) from a "Used" line."""
    record.registers = int(_USED_RE.search(line).group(1))
    if match := _BARRIERS_RE.search(line):
        record.barriers = int(match.group(1))
    if match := _SMEM_RE.search(line):
        record.smem = int(match.group(1))
    banks = _CMEM_RE.findall(line)
    record.cmem = sum(int(value) for value in banks) if banks else None
    if (match := _CUMULATIVE_STACK_RE.search(line)) and not record.stack_frame:
        record.stack_frame = int(match.group(1))


def parse_ptxas(
    text: str, demangler: str | None = None, *, demangle_names: bool = True
) -> list[KernelResources]:
    """Every entry function in a compiler log, in the order ptxas compiled them.

    `demangler` is the path of cu++filt/c++filt; by default one is looked up on PATH.
    Lines that are not part of the report (warnings, echoed commands) are ignored.
    """
    records: list[KernelResources] = []
    current: KernelResources | None = None
    props_for: str | None = None
    for line in text.splitlines():
        if match := _ENTRY_RE.search(line):
            current = KernelResources(name=match.group(1), mangled=match.group(1), arch=match.group(2))
            records.append(current)
            props_for = None
        elif match := _PROPS_RE.search(line):
            props_for = match.group(1)
        elif (match := _FRAME_RE.search(line)) and current is not None:
            if props_for == current.mangled:
                current.stack_frame, current.spill_stores, current.spill_loads = (
                    int(match.group(1)), int(match.group(2)), int(match.group(3)),
                )
            props_for = None
        elif _USED_RE.search(line) and current is not None:
            _apply_used_line(current, line)
    if demangle_names and records:
        tool = demangler or find_demangler()
        names = demangle([record.mangled for record in records], tool)
        for record in records:
            record.name = names.get(record.mangled, record.mangled)
    return records


_COLUMNS = (
    ("kernel", "name"),
    ("arch", "arch"),
    ("regs", "registers"),
    ("spill st", "spill_stores"),
    ("spill ld", "spill_loads"),
    ("stack", "stack_frame"),
    ("smem", "smem"),
    ("cmem", "cmem"),
    ("bar", "barriers"),
)


def format_table(resources: list[KernelResources]) -> str:
    """A plain, aligned text table: kernel name left-aligned, numbers right-aligned (bytes)."""
    if not resources:
        return "(no kernels in the ptxas report)"
    rows = [[header for header, _ in _COLUMNS]]
    rows += [["-" if getattr(r, attr) is None else str(getattr(r, attr)) for _, attr in _COLUMNS] for r in resources]
    widths = [max(len(row[col]) for row in rows) for col in range(len(_COLUMNS))]
    lines = []
    for index, row in enumerate(rows):
        cells = [row[0].ljust(widths[0]), row[1].ljust(widths[1])]
        cells += [cell.rjust(width) for cell, width in zip(row[2:], widths[2:])]
        lines.append("  ".join(cells).rstrip())
        if index == 0:
            lines.append("  ".join("-" * width for width in widths))
    return "\n".join(lines)
