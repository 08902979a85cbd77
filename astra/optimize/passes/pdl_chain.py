"""pdl_chain: a kernel launched right after another launch of the same host code starts while that one ends.

    LaunchKernel(g1, b1, stream)(absmax, ...);            LaunchKernel(g1, b1, stream)(absmax, ...);
    LaunchKernel(g2, b2, stream)(quant, ...);     ->      LaunchKernel(g2, b2, stream).enable_pdl(true)(quant, ...);

    __global__ void absmax(...) { body }                  __global__ void absmax(...) { launch_dependents; body }
    __global__ void quant(...) { body }                   __global__ void quant(...) { wait; body }

An op made of several kernels pays a launch between each: the next grid is scheduled only once the last one
has finished and its memory is flushed. With programmatic dependent launch (Hopper, CUDA 12) the later grid is
launched while the earlier still runs (`.enable_pdl(true)`, SGLang's LaunchKernel), once every CTA of the
earlier one has released it (`griddepcontrol.launch_dependents`, here its first statement); its CTAs then wait
(`griddepcontrol.wait`, here its first statement, before any access to memory) until the earlier grid has
completed and its stores are visible. What the kernel computes is unchanged; the next grid's launch and
scheduling overlap the earlier one's work. SGLang's own multi-kernel ops do this by hand (hc_combine's gate and
apply kernels, for one).

Where: a launch `LaunchKernel(...)(kernel, ...)` (passes.launches) that comes after another LaunchKernel launch
of the same function: the nearest earlier statement of its block that launches, or of a block around it (before
the `if` or loop that holds it). That is the op's own earlier launch, so the overlap is inside the op. The later
kernel gets the wait, every such launch of it the attribute, and each kernel the earlier statement launches gets
the release (after its own wait, where it has one). A kernel named other than by launches and queries is neither
chained nor released.
Refused: a later kernel that already waits or releases (PDLWaitPrimary, PDLTriggerSecondary,
`griddepcontrol`, cudaGridDependencySynchronize), a launch that already says `.enable_pdl(...)`, a file where no
launch comes after another.
The instructions are emitted for sm_90 and later only (`__CUDA_ARCH__ >= 900`), as SGLang's own PDLWaitPrimary
is. A GPU before Hopper ignores the attribute; a build for an older architecture run on Hopper through its PTX
would launch with the attribute and no wait, which SGLang's JIT (built for the GPU it runs on) never does.
"""

from __future__ import annotations

import re

from astra.cxx.brackets import closing
from astra.cxx.text import blank
from astra.optimize.passes.base import ParsedPass, Refusal
from astra.optimize.passes.launches import Use, uses
from astra.optimize.passes.syntax import Unit, body, walk

WAIT = 'asm volatile("griddepcontrol.wait;" ::: "memory");'
RELEASE = 'asm volatile("griddepcontrol.launch_dependents;");'
_GUARD = "#if defined(__CUDA_ARCH__) && (__CUDA_ARCH__ >= 900)"
_PDL = re.compile(r"\b(?:PDLWaitPrimary|PDLTriggerSecondary|cudaGridDependencySynchronize|"
                  r"cudaTriggerProgrammaticLaunchCompletion)\b|griddepcontrol")
_ANOTHER_PATH = ("CASE_STMT", "DEFAULT_STMT", "BREAK_STMT", "CONTINUE_STMT", "RETURN_STMT", "GOTO_STMT")
_LAUNCH_TEXT = re.compile(rb"\bLaunchKernel\s*\(")
_RELEASES = re.compile(r"\b(?:PDLTriggerSecondary|cudaTriggerProgrammaticLaunchCompletion)\b|"
                       r"asm\s+volatile\s*\(\s*\"griddepcontrol\.launch_dependents;\"")
_WAIT_CALL = re.compile(r"\b(?:PDLWaitPrimary\s*<[^<>;]*>\s*\(\s*\)|cudaGridDependencySynchronize\s*\(\s*\))\s*;|"
                        r"asm\s+volatile\s*\(\s*\"griddepcontrol\.wait;\"[^;]*;")


class PdlChain(ParsedPass):
    name = "pdl_chain"
    family = "pdl"

    def rewrite(self, unit: Unit, spec: dict | None) -> tuple[str, str]:
        up = unit.parents()
        launches = _launches(unit)
        chained = [(kernel, use, earlier) for kernel, use in launches
                   for earlier in [_earlier_kernels(unit, use, launches, up)] if earlier is not None]
        if not chained:
            raise Refusal("no LaunchKernel(...)(kernel, ...) launch comes after another launch of its function")
        plain = blank(unit.data.decode("latin-1"))  # one character per byte: libclang's offsets hold
        edits: dict[tuple[int, int], str] = {}
        done: list[tuple[int, str]] = []  # (line, what), told in the file's order
        reasons: list[str] = []
        releases: dict[str, object] = {}
        for kernel, use, earlier in chained:
            code = unit.code(use.call)
            if ".enable_pdl(" in code:
                reasons.append(f"{kernel.spelling}: its launch on line {_line(unit, use.call)} already sets PDL")
                continue
            if _PDL.search(unit.code(kernel)):
                reasons.append(f"{kernel.spelling}: already waits for or releases a dependent launch (PDL)")
                continue
            at = unit.span(use.call)[0]
            close = closing(plain, at + len("LaunchKernel"))
            if not unit.code(use.call).startswith("LaunchKernel(") or close is None:
                reasons.append(f"{kernel.spelling}: the launch on line {_line(unit, use.call)} is not LaunchKernel(...)")
                continue
            start = _body_start(unit, kernel)
            if start is None:
                reasons.append(f"{kernel.spelling}: its body is not written out in the file (a macro?)")
                continue
            edits[(close + 1, close + 1)] = ".enable_pdl(true)"
            edits[(start, start)] = _block(unit, start, WAIT, "wait for the launch before this one (PDL)")
            for other in earlier:
                releases.setdefault(other.spelling, other)
            after = ", ".join(sorted(k.spelling for k in earlier)) or "a launch"
            told = (_line(unit, use.call), f"{kernel.spelling} after {after} (line {_line(unit, use.call)})")
            if told not in done:  # an explicit specialisation: the same launch read twice
                done.append(told)
        if not done:
            raise Refusal("; ".join(reasons))
        for kernel in releases.values():
            at = _after_wait(unit, plain, kernel)
            if at is None or _in_code(unit, plain, _RELEASES, *unit.span(kernel)):
                continue  # not written out in the file, or it releases where its author chose already
            if (at, at) in edits:  # the kernel waits too (a chain of three): release right after its new wait
                edits[(at, at)] += _block(unit, at, RELEASE, "let the next launch start (PDL)")
            else:
                edits[(at, at)] = _block(unit, at, RELEASE, "let the next launch start (PDL)")
        source = _splice(unit, edits)
        return source, "launched with PDL after the op's earlier launch: " + ", ".join(what for _, what in sorted(done))


def _launches(unit: Unit) -> list[tuple[object, Use]]:
    """(kernel, launch) for every LaunchKernel launch of a kernel of this file whose references are all
    launches or queries (passes.launches); another kernel can neither be chained nor released, and is left as is."""
    out = []
    for kernel in unit.kernels():
        found = uses(unit, kernel)
        if not isinstance(found, str):
            out += [(kernel, use) for use in found if not use.query]
    return out


def _earlier_kernels(unit: Unit, use: Use, launches: list, up: dict) -> list | None:
    """The kernels launched by the nearest statement before `use` that launches through LaunchKernel, looking
    in `use`'s block and then in each block around it (before an `if` or a loop that holds it), never past
    the function's body. None when no statement before it launches; [] when one does but launches no kernel
    this pass can name (it is still the op's earlier launch; it just gets no release)."""
    calls = {launch.call.hash: kernel for kernel, launch in launches}
    node = use.call
    while node in up and up[node].kind.name not in ("FUNCTION_DECL", "FUNCTION_TEMPLATE", "CXX_METHOD",
                                                     "LAMBDA_EXPR", "CONSTRUCTOR"):
        parent = up[node]
        if parent.kind.name == "COMPOUND_STMT":
            siblings = list(parent.get_children())
            for sibling in reversed(siblings[: siblings.index(node)]):
                if sibling.kind.name in _ANOTHER_PATH:
                    return None  # a `case` before this one, or a jump: what precedes may not have run
                if not _launches_here(unit, sibling):
                    continue
                found: list = []
                for n in walk(sibling):
                    if n.hash in calls and calls[n.hash] not in found:
                        found.append(calls[n.hash])
                return found
        node = parent
    return None


def _launches_here(unit: Unit, statement) -> bool:
    """Whether `statement` launches through LaunchKernel when it runs: a launch outside any lambda it defines."""
    lambdas = [unit.span(n) for n in walk(statement) if n.kind.name == "LAMBDA_EXPR"]
    return any(not any(a <= m.start() < b for a, b in lambdas)
               for m in _LAUNCH_TEXT.finditer(unit.data, *unit.span(statement)))


def _body_start(unit: Unit, kernel) -> int | None:
    """Just past the `{` of the kernel's body; None where that brace is not written in the file itself (a
    kernel a macro defines)."""
    block = body(kernel)
    if block is None or not unit.in_main(block):
        return None
    start = unit.span(block)[0]
    return start + 1 if unit.data[start:start + 1] == b"{" else None


def _after_wait(unit: Unit, plain: str, kernel) -> int | None:
    """Where a release goes: past the kernel's own wait for its primary if it has one, else its body's start
    (`plain`: the file with comments and literals blanked, one character per byte)."""
    start = _body_start(unit, kernel)
    if start is None:
        return None
    wait = _in_code(unit, plain, _WAIT_CALL, start, unit.span(kernel)[1])
    return wait.end() if wait else start


def _in_code(unit: Unit, plain: str, pattern: re.Pattern, start: int, end: int) -> re.Match | None:
    """The first match of `pattern` in the file's bytes [start, end) that begins in code, not in a comment or
    a literal (an `asm` statement's string is read: it says which instruction)."""
    raw = unit.data.decode("latin-1")
    for m in pattern.finditer(raw, start, end):
        if plain[m.start()] == raw[m.start()]:
            return m
    return None


def _block(unit: Unit, at: int, statement: str, why: str) -> str:
    """The guarded statement, on lines of its own, to insert at `at` (just past a `{` or a statement)."""
    indent = _indent_inside(unit, at)
    after = "" if unit.data[at:at + 1] in (b"\n", b"\r") else "\n"  # code after `{` on its line stays code
    return f"\n{_GUARD}\n{indent}{statement}  // {why}\n#endif{after}"


def _indent_inside(unit: Unit, at: int) -> str:
    """The indentation of the first statement after `at` (two spaces more than the line of `at` otherwise)."""
    rest = unit.data[at:].decode(errors="replace")
    m = re.search(r"\n([ \t]*)\S", rest)
    return m.group(1) if m and m.group(1) else unit.indent(at) + "  "


def _line(unit: Unit, node) -> int:
    return unit.line_of(unit.span(node)[0])


def _splice(unit: Unit, edits: dict[tuple[int, int], str]) -> str:
    data = unit.data
    for (start, end), new in sorted(edits.items(), reverse=True):
        data = data[:start] + new.encode() + data[end:]
    return data.decode()
