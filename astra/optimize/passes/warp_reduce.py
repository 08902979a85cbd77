"""warp_reduce: a shared-memory tree reduction run by a one-warp block becomes warp shuffles.

    for (int s = blockDim.x / 2; s > 0; s >>= 1) {        if (blockDim.x == 32) {  // one warp: shuffles
      if (tid < s) buf[tid] += buf[tid + s];       ->        auto value = buf[tid];
      __syncthreads();                                       for (int offset = 16; offset > 0; offset >>= 1)
    }                                                          value += __shfl_xor_sync(0xffffffffu, value, offset);
                                                             if (tid == 0) buf[0] = value;
                                                             __syncwarp();
                                                           } else {
                                                             <the original loop>
                                                           }

Applies to a loop `for (T s = H; s > 0; s >>= 1)` (or `s /= 2`) whose body is exactly a guarded
combine `if (tid < s) buf[tid] OP= buf[tid + s];` (`+=`, or `buf[tid] = max/fmaxf/min/fminf(buf[tid],
buf[tid + s])`) and a `__syncthreads()`, with `tid` the thread's index (`threadIdx.x` or a local
initialised to it) and `buf` one name. The result lands in `buf[0]` as the tree leaves it, written by
lane 0 and made visible to the warp by `__syncwarp()`; a block of any other size runs the original
loop (the check is at run time, on `blockDim.x`). Floating-point sums add in another order.
"""

from __future__ import annotations

import re

from astra.optimize.passes.base import ParsedPass, Refusal
from astra.optimize.passes.syntax import Unit, bare, body, parents, refers_to, splice, walk

_COMBINE = re.compile(r"^if\s*\(\s*(?P<tid>\w+|threadIdx\.x)\s*<\s*(?P<s>\w+)\s*\)\s*\{?\s*"
                      r"(?P<buf>\w+)\s*\[\s*(?P=tid)\s*\]\s*(?:(?P<op>[+*])=\s*(?P=buf)\s*\[\s*(?P=tid)\s*\+\s*(?P=s)\s*\]|"
                      r"=\s*(?P<fn>max|min|fmaxf|fminf|::max|::min)\s*\(\s*(?P=buf)\s*\[\s*(?P=tid)\s*\]\s*,\s*"
                      r"(?P=buf)\s*\[\s*(?P=tid)\s*\+\s*(?P=s)\s*\]\s*\))\s*;?\s*\}?$", re.S)
_HALVING = re.compile(r"^(?P<s>\w+)\s*(?:>>=\s*1|/=\s*2)$")


class WarpReduce(ParsedPass):
    name = "warp_reduce"
    family = "warp_reduce"

    def rewrite(self, unit: Unit, spec: dict | None) -> tuple[str, str]:
        edits, done = [], []
        for function in unit.device_functions():
            if body(function) is None:
                continue
            up = parents(function)
            for loop in [n for n in walk(body(function)) if n.kind.name == "FOR_STMT" and unit.in_main(n)]:
                edit = _tree_loop(unit, loop, up)
                if edit is not None:
                    edits.append(edit)
                    done.append(f"{function.spelling} line {unit.line_of(unit.span(loop)[0])}")
        if not edits:
            raise Refusal("no shared-memory tree reduction (`for (s = n / 2; s > 0; s >>= 1) { if (tid < s) "
                          "buf[tid] += buf[tid + s]; __syncthreads(); }`)")
        return splice(unit, edits), f"tree reduction done with warp shuffles when the block is one warp: {', '.join(done)}"


def _tree_loop(unit: Unit, loop, up: dict):
    children = list(loop.get_children())
    if len(children) != 4 or up.get(loop) is None or up[loop].kind.name != "COMPOUND_STMT":
        return None
    _, cond, step, loop_body = children
    halving = _HALVING.match(re.sub(r"\s+", " ", unit.code(step)).strip())
    if halving is None or not re.fullmatch(rf"{halving.group('s')}\s*>\s*0", unit.code(cond).strip()):
        return None
    statements = list(loop_body.get_children()) if loop_body.kind.name == "COMPOUND_STMT" else []
    if len(statements) != 2 or not re.fullmatch(r"__syncthreads\s*\(\s*\)", unit.code(statements[1]).strip()):
        return None
    combine = _COMBINE.match(unit.code(statements[0]).strip())
    if combine is None or combine.group("s") != halving.group("s"):
        return None
    tid = combine.group("tid")
    if tid != "threadIdx.x" and not _is_thread_index(unit, statements[0], tid):
        return None
    buf = combine.group("buf")
    start, end = unit.span(loop)
    ind, step_ = unit.indent(start), "  "
    fn = combine.group("fn")
    shuffled = "__shfl_xor_sync(0xffffffffu, value, offset)"
    update = f"value {combine.group('op')}= {shuffled};" if combine.group("op") else f"value = {fn}(value, {shuffled});"
    original = unit.code(loop)
    lines = ["if (blockDim.x == 32) {  // one warp: shuffles instead of shared memory and barriers",
             f"{ind}{step_}auto value = {buf}[{tid}];",
             f"{ind}{step_}for (int offset = 16; offset > 0; offset >>= 1) {{",
             f"{ind}{step_ * 2}{update}",
             f"{ind}{step_}}}",
             f"{ind}{step_}if ({tid} == 0) {buf}[0] = value;",
             f"{ind}{step_}__syncwarp();",
             f"{ind}}} else {{",
             *[(ind + step_ + line[len(ind):] if line.startswith(ind) else ind + step_ + line.lstrip()) if k else
               ind + step_ + line for k, line in enumerate(original.splitlines())],
             f"{ind}}}"]
    return start, end, "\n".join(lines)


def _is_thread_index(unit: Unit, statement, name: str) -> bool:
    """Whether `name` in the statement is a local initialised with `threadIdx.x` alone."""
    ref = next((n for n in walk(statement) if refers_to(n) is not None and refers_to(n).spelling == name), None)
    if ref is None or refers_to(ref).kind.name != "VAR_DECL":
        return False
    value = [c for c in refers_to(ref).get_children() if c.kind.name not in ("TYPE_REF", "NAMESPACE_REF")]
    return bool(value) and re.fullmatch(r"threadIdx\.x", unit.code(bare(value[-1])).strip()) is not None
