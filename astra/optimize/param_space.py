"""The offline search's parameter space, read from the kernel source itself.

A `Param` is one integer literal in the source that shapes how the kernel runs, with the values worth
trying in its place:
- `const`: a launch or tile constant (`constexpr uint32_t kBlockSize = 256;`, kThreads, kNumWarps,
  kVecSize, kRowsPerBlock, kUnroll, ...), powers of two from a quarter to four times the value;
- `vec`: a vector width: the element count of `AlignedVector<T, 4>` or the byte count of
  `16 / sizeof(T)`-style widths (8 and 16 bytes: Hopper's widest load is 16 bytes);
- `bounds`: `__launch_bounds__(N)`'s thread count (the tile must agree, or the build or checks fail)
  and a minimum of blocks per SM added or changed (`__launch_bounds__(N, M)`, M in 1..4);
- `unroll`: the factor of `#pragma unroll N`;
- `cap`: a thread-count cap in host code, `dim3 block(std::min(heads * rot_dim / 2, 512))` or
  `threads = std::min(..., 512)`: the literal bound of a `std::min` in a statement about threads or blocks;
- `launch`: a literal block size given to `LaunchKernel(grid, 256, ...)` or `<<<grid, 256, ...>>>`, unless
  the kernel it launches never reads `blockDim` (a one-warp kernel striding by 32: more threads race);
- `floor`: a thread-count floor in host code, `num_thread = std::max(num_experts, 128)`: the literal bound
  of a `std::max` in a statement about threads or blocks (a floor of 128 threads where 32 serve);
- `warps`: a CTA's warp count written as linked literals (launch bounds, the launch's block size, the
  body's per-warp slots and strides), moved together (astra.optimize.warp_geometry);
- `tmpl`: a launch-geometry template argument the spec's wrapper entry passes as a literal
  (`dispatch_probability<{max_copies}, 256>`'s BLOCK_DIM), set inside the file instead
  (astra.optimize.entry_templates).
Constants are read from any `const`/`constexpr` integer declaration whose name says what it is
(kBlockSize, TPB, WARPS_PER_TB, block_size, kNumThreads, kRowsPerBlock, ...), not only `k`-prefixed
constexprs; a warp's size or a maximum is never one. Single moves come out in the order the kinds are
worth trying under a deadline: vector widths and launch geometry first, unrolling last.
None is assumed legal: a value the kernel's static_asserts or shapes reject fails to build or is
incorrect, and the search drops it. `render` writes an assignment back into the text (right to left,
so earlier spans keep their offsets).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from astra.cxx import decls
from astra.cxx.brackets import closing
from astra.cxx.text import blank
from astra.optimize import cpp_args, entry_templates, warp_geometry

_ALIGNED = re.compile(r"\bAlignedVector\s*<\s*[\w:]+(?:\s*<[^<>]*>)?\s*,\s*(?P<value>\d+)\s*>")
_BYTES = re.compile(r"(?P<value>\d+)(?=\s*/\s*\(?\s*sizeof\s*\()")  # 16 / sizeof(T), 16 / (sizeof(T) * 2)
_BOUNDS = re.compile(r"__launch_bounds__\s*\(\s*(?P<value>\d+)\s*(?:,\s*(?P<min>\d+)\s*)?\)")
_UNROLL = re.compile(r"#pragma\s+unroll\s+(?P<value>\d+)\b")
_DECL = re.compile(
    r"\b(?:static\s+)?(?:inline\s+)?(?:constexpr|const)\s+(?:auto|int|unsigned(?:\s+int)?|(?:std::)?u?int(?:32|64)_t|"
    r"(?:std::)?size_t|uint)\s+(?P<name>\w+)\s*=\s*(?P<value>\d+)[uUlL]*\s*;")
_TUNABLE_NAME = re.compile(
    r"(?i)(threads|thread_?num|block_?size|block_?dim|warps|vec|unroll|tile|items_?per|rows_?per|tokens_?per|"
    r"per_?block|per_?cta|per_?thread|tpb|cta_?size|loop_?count|stages)")
_NOT_TUNABLE = re.compile(r"(?i)(warp_?size|warp_?threads|max|min|per_?sm)")
_MIN = re.compile(r"\bstd::min\s*(?:<[^<>();]*>)?\s*\(")
_MAX = re.compile(r"\bstd::max\s*(?:<[^<>();]*>)?\s*\(")
_LAUNCH = re.compile(r"\bLaunchKernel\s*\(|<<<")
_BLOCK_SIZE = re.compile(r"\bblockDim\b|\bthis_thread_block\b|\bthread_block\b|\btiled_partition\b")
_METHOD = re.compile(r"\s*\.\s*\w+\s*\(")
_FIRST_ARG = re.compile(r"\s*\(\s*&?\s*(?:\w+\s*::\s*)*(\w+)")  # (kernel<T>, ...), (&ns::kernel, ...)
_ABOUT_THREADS = re.compile(r"(?i)thread|block|dim3|tpb|cta")
_FLOOR_OF = re.compile(r"(?i)thread|tpb|cta_?size")
MAX_THREADS = cpp_args.MAX_THREADS
ORDER = ("vec", "const", "tmpl", "warps", "cap", "floor", "launch", "bounds", "minblocks", "unroll")  # single moves, best bets first


@dataclass(frozen=True)
class Param:
    name: str  # readable and unique: "kBlockSize", "AlignedVector@L42", "launch_bounds@L88", ...
    kind: str  # const | tmpl | vec | warps | cap | floor | launch | bounds | minblocks | unroll
    start: int  # the literal's span in the source
    end: int
    value: int  # as written
    choices: tuple[int, ...]  # values to try instead (never the current one)
    insert: str = ""  # for a value the source does not write yet (minblocks): the text to insert at start
    links: tuple[tuple[int, int, int], ...] = ()  # (start, end, divisor): literals written as value // divisor
    note: str = ""  # what the links are, for the candidate's description
    fixed: tuple[tuple[int, int, str], ...] = ()  # edits made whatever the value (tmpl: the parameter unnamed)


def _line(text: str, pos: int) -> int:
    return text.count("\n", 0, pos) + 1


def _powers(value: int, low: int, high: int, factors=(0.25, 0.5, 2, 4)) -> tuple[int, ...]:
    if value <= 0 or value & (value - 1):
        return ()
    return tuple(sorted({int(value * f) for f in factors if low <= value * f <= high and value * f != value}))


def _tunable(name: str) -> bool:
    return bool(_TUNABLE_NAME.search(name)) and not _NOT_TUNABLE.search(name)


def find_params(text: str, entries: list[str] = ()) -> list[Param]:
    """Every tunable literal of `text` (see the module docstring) outside comments and string literals,
    grouped by kind; `entries` (the spec's wrapper entries) add the template arguments they pass as literals."""
    params: list[Param] = []
    seen_names: dict[str, int] = {}
    taken: set[int] = set()
    code = blank(text)  # a literal in a comment or a string literal is not one to tune

    def add(name: str, kind: str, start: int, end: int, value: int, choices: tuple[int, ...], insert: str = "",
            links: tuple = (), note: str = "", fixed: tuple = ()) -> None:
        if (not choices or (start in taken and not insert) or (start < len(text) and code[start] != text[start])
                or any(a in taken for a, _, _ in links)):
            return
        taken.update([start, *(a for a, _, _ in links)])
        count = seen_names.get(name, 0)
        seen_names[name] = count + 1
        params.append(Param(name if count == 0 else f"{name}@L{_line(text, start)}", kind, start, end, value,
                            choices, insert, links, note, fixed))

    for g in warp_geometry.find(text):  # first: its linked literals are not moved alone
        add(f"warps@L{_line(text, g.start)}", "warps", g.start, g.end, g.threads, g.choices(), links=g.links,
            note=f"{g.kernel}: {g.where}")

    for m in _DECL.finditer(text):
        name = m.group("name")
        if _tunable(name):
            value = int(m.group("value"))
            add(name, "const", m.start("value"), m.end("value"), value, _powers(value, 1, MAX_THREADS))
    for slot in entry_templates.find(text, list(entries), _tunable):
        add(slot.name, "tmpl", slot.at, slot.at, slot.value, _powers(slot.value, 1, MAX_THREADS),
            insert=slot.line_format, note=f"the template argument of {slot.owner}",
            fixed=(slot.rename,))
    for start, end, value in _thread_caps(text):
        add(f"threads_cap@L{_line(text, start)}", "cap", start, end, value, _powers(value, 32, MAX_THREADS))
    for start, end, value in _thread_caps(text, _MAX, _FLOOR_OF):
        add(f"threads_floor@L{_line(text, start)}", "floor", start, end, value, _powers(value, 32, MAX_THREADS))
    for start, end, value in _launch_blocks(text):
        add(f"launch_threads@L{_line(text, start)}", "launch", start, end, value, _powers(value, 32, MAX_THREADS))
    for m in _ALIGNED.finditer(text):
        value = int(m.group("value"))
        add(f"AlignedVector@L{_line(text, m.start())}", "vec", m.start("value"), m.end("value"), value,
            _powers(value, 1, 16, factors=(0.5, 2)))
    for m in _BYTES.finditer(text):
        value = int(m.group("value"))
        if value in (8, 16):
            add(f"vector_bytes@L{_line(text, m.start())}", "vec", m.start("value"), m.end("value"), value,
                tuple(v for v in (8, 16) if v != value))
    for m in _BOUNDS.finditer(text):
        value, line = int(m.group("value")), _line(text, m.start())
        add(f"launch_bounds@L{line}", "bounds", m.start("value"), m.end("value"), value,
            _powers(value, 32, MAX_THREADS, factors=(0.5, 2)))
        if m.group("min"):
            current = int(m.group("min"))
            add(f"min_blocks@L{line}", "minblocks", m.start("min"), m.end("min"), current,
                tuple(v for v in (1, 2, 3, 4) if v != current))
        else:
            add(f"min_blocks@L{line}", "minblocks", m.end("value"), m.end("value"), 0, (2, 4), insert=", {}")
    for m in _UNROLL.finditer(text):
        value = int(m.group("value"))
        add(f"unroll@L{_line(text, m.start())}", "unroll", m.start("value"), m.end("value"), value,
            _powers(value, 1, 32, factors=(0.5, 2)))
    return params


def _thread_caps(text: str, call: re.Pattern = _MIN, about: re.Pattern = None) -> list[tuple[int, int, int]]:
    """The literal bound of each `std::min(a, N)` (or `std::max`) in a statement that sets threads or blocks
    (`about`: what the statement must name; a floor must be a thread count, not a block's shared bytes)."""
    caps = []
    for m in call.finditer(text):
        statement = text[max(text.rfind(";", 0, m.start()), text.rfind("{", 0, m.start()),
                             text.rfind("}", 0, m.start())) + 1: m.start()]
        if not (about or _ABOUT_THREADS).search(statement):
            continue
        for span in cpp_args.arguments(text, m.end())[:2]:
            found = cpp_args.literal(text, span)
            if found:
                caps.append(found)
    return caps


def _launch_blocks(text: str) -> list[tuple[int, int, int]]:
    """A literal block size: the second argument of `LaunchKernel(...)` or of `<<<...>>>`, unless every kernel
    it may launch is found in the file and never reads `blockDim` (see `_fixed_block`)."""
    blocks = []
    code = blank(text)
    device = None
    for m in _LAUNCH.finditer(text):
        spans = cpp_args.arguments(text, m.end(), ">>>" if m.group(0) == "<<<" else ")")
        found = cpp_args.literal(text, spans[1]) if len(spans) >= 2 else None
        if found:
            device = _device_code(text, code) if device is None else device
            names = _launched(code, m, device)
            if not (names and all(_fixed_block(device, name) for name in names)):
                blocks.append(found)
    return blocks


def _launched(code: str, launch: re.Match, device: dict[str, str]) -> list[str]:
    """The kernels a launch may start: the first argument of `LaunchKernel(...)(kernel, ...)`, or what stands
    before `<<<` (namespaces and template arguments left out); a local that names a kernel
    (`auto kernel = my_kernel<4>;`, `auto k = &ns::my_kernel;`, `auto k = c ? a<1> : a<2>;`) is read through to
    every kernel of the file its initialiser names. Empty when it cannot tell."""
    if launch.group(0) == "<<<":
        head = code[:launch.start()].rstrip()
        if head.endswith(">"):  # my_kernel<T, 4><<<...>>>: back over the template arguments
            depth, i = 0, len(head) - 1
            while i >= 0:
                depth += {">": 1, "<": -1}.get(head[i], 0)
                if depth == 0:
                    break
                i -= 1
            head = head[:max(i, 0)].rstrip()
        name = re.search(r"(\w+)$", head)  # ns::kernel: the last name
    else:
        close = closing(code, launch.end() - 1)
        while close is not None:  # LaunchKernel(...).enable_pdl(on)(kernel, ...): past the configuration calls
            method = _METHOD.match(code, close + 1)
            if not method:
                break
            close = closing(code, method.end() - 1)
        name = _FIRST_ARG.match(code, close + 1) if close is not None else None
    if name is None:
        return []
    if name.group(1) in device and "__global__" in device[name.group(1)]:
        return [name.group(1)]
    initialiser = None
    for a in re.finditer(rf"\b{re.escape(name.group(1))}\s*=([^;]*);", code[:launch.start()]):
        initialiser = a.group(1)
    if initialiser is None:
        return []
    return [w for w in dict.fromkeys(re.findall(r"\w+", initialiser)) if "__global__" in device.get(w, "")]


def _device_code(text: str, code: str) -> dict[str, str]:
    """The file's device code by name: each `__global__` or `__device__` definition (a declaration, an overload,
    a specialisation: all read as one) and each `#define` (a macro may read blockDim for a kernel)."""
    out: dict[str, str] = {}
    for c in decls.layout(text) or decls.chunks(text):
        piece = code[c.start:c.end]
        if c.name and (c.kind == decls.DIRECTIVE or "__global__" in piece or "__device__" in piece):
            out[c.name] = out.get(c.name, "") + "\n" + piece
    return out


def _fixed_block(device: dict[str, str], kernel: str) -> bool:
    """Whether `kernel` is written for the block size it is launched with: its definition in the file, and the
    file's device functions and macros it names (transitively), never read the block's size (`blockDim`, or a
    cooperative group of the block). Such a kernel spreads its work with its own constants
    (`for (i = lane; i < n; i += 32)` in a one-warp kernel): more threads repeat that work and race on its
    stores, fewer leave part of it undone, and a race can give the original's outputs by timing alone, which no
    check of outputs rules out. False where the kernel's body is not in the file."""
    if "__global__" not in device.get(kernel, "") or "{" not in device[kernel]:
        return False
    seen, todo = {kernel}, [kernel]
    while todo:
        body = device[todo.pop()]
        if _BLOCK_SIZE.search(body):
            return False
        for name in decls.references(body, set(device) - seen):
            seen.add(name)
            todo.append(name)
    return True


def line_of(text: str, param: Param) -> int:
    return _line(text, param.start)


def render(text: str, params: list[Param], assignment: dict[str, int]) -> str:
    """`text` with each named parameter set to its assigned value."""
    by_name = {p.name: p for p in params}
    edits = []  # (start, end, new text), applied right to left so earlier spans keep their offsets
    for name, value in assignment.items():
        param = by_name[name]
        edits.append((param.start, param.end, param.insert.format(value) if param.insert else str(value)))
        edits.extend(param.fixed)
        edits.extend((start, end, str(value // divisor)) for start, end, divisor in param.links)
    for start, end, new in sorted(edits, key=lambda e: (e[0], e[1]), reverse=True):
        text = text[:start] + new + text[end:]
    return text


def describe(params: list[Param], assignment: dict[str, int]) -> str:
    """"kBlockSize 256 -> 512, AlignedVector@L42 4 -> 8" (a candidate's idea, readable in history)."""
    by_name = {p.name: p for p in params}
    parts = []
    for name, value in sorted(assignment.items()):
        param = by_name[name]
        before = "none" if param.insert and param.kind != "tmpl" else str(param.value)
        warp = warp_geometry.WARP
        linked = f" ({param.value // warp} -> {value // warp} warps; {param.note})" if param.kind == "warps" else ""
        linked = f" ({param.note}, set in the file)" if param.kind == "tmpl" else linked
        parts.append(f"{name} {before} -> {value}{linked}")
    return ", ".join(parts) or "no change"


def slug(assignment: dict[str, int]) -> str:
    return "param:" + ",".join(f"{name}={value}" for name, value in sorted(assignment.items()))


def single_moves(params: list[Param]) -> list[dict[str, int]]:
    """Every parameter moved alone to each of its choices: the first rung of the search."""
    ranked = sorted(params, key=lambda p: ORDER.index(p.kind) if p.kind in ORDER else len(ORDER))
    return [{p.name: value} for p in ranked for value in p.choices]


def combine(winners: list[dict[str, int]], limit: int = 6) -> list[dict[str, int]]:
    """Pairs (and the triple) of winning single moves on different parameters, best first: what
    coordinate search tries once single moves have been ranked."""
    out: list[dict[str, int]] = []
    for i, first in enumerate(winners):
        for second in winners[i + 1:]:
            if set(first) & set(second):
                continue
            out.append({**first, **second})
    distinct: list[dict[str, int]] = []  # the best move of each parameter, best first
    for move in winners:
        if not any(set(move) & set(kept) for kept in distinct):
            distinct.append(move)
    if len(distinct) >= 3:
        out.insert(0, {**distinct[0], **distinct[1], **distinct[2]})
    return out[:limit]
