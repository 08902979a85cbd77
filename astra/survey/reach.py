"""Whether SGLang's runtime reaches a kernel, and under which gates: a survey record's `reach`, and how
much a kernel's recoverable time counts in the ranking because of it.

From `astra.sglang.srt_gates.why` (what `astra list --why NAME` prints), a kernel is:

- warm:    a runtime call site in sglang/srt runs with no gate but platform checks (`_is_cuda`,
           `not _is_hip`, true on any NVIDIA GPU); only call sites count, references (a function
           stored to be called later) only where there is no call;
- gated:   every call site is gated on the model, its configuration, dims or flags
           (`can_use_fused_inplace_qknorm(head_dim, q.dtype)`, `attn_tp_size == 1`): it runs for
           some deployments only;
- cold:    no call site in sglang/srt ("cold: no call site in sglang/srt"): reached only from tests,
           benchmarks or plugins;
- unknown: the tree has no sglang/srt, or the module could not be looked up.

`REACH_FACTORS` is what the ranking multiplies recoverable time by: warm 1, gated 0.5 (a gated kernel
runs in a share of deployments), cold 0.1 (its time is recoverable only for users calling it
directly: it sinks below every warm kernel within 10x of it), unknown 1 (no evidence either way; the
table marks it).
"""

from __future__ import annotations

import re
from typing import Callable

from astra.errors import AstraError
from astra.spec.trees import tree_for
from astra.text import one_line

REACH_FACTORS = {"warm": 1.0, "gated": 0.5, "cold": 0.1, "unknown": 1.0}
_PLATFORM = re.compile(r"^(_?is_cuda(\(\))?|not\s+_?is_(hip|npu|xpu|cpu|musa|mps)(\(\))?)$")
_CUDA = re.compile(r"^_?is_cuda(\(\))?$")
MAX_GATES = 12

ReachOf = Callable[[object, "str | None", "str | None"], dict]  # (spec, --sglang, --sglang-src) -> reach


def platform_only(gate: str) -> bool:
    """A gate that holds on every NVIDIA GPU: `_is_cuda`, `not _is_hip`, `_is_cuda or _is_hip`, `a and b` of those."""
    gate = " ".join(gate.split())
    if _PLATFORM.match(gate):
        return True
    if " or " in gate and " and " not in gate:
        return any(_CUDA.match(part.strip()) for part in gate.split(" or "))
    if " and " in gate and " or " not in gate:
        return all(_PLATFORM.match(part.strip()) for part in gate.split(" and "))
    return False


def summarize(reach) -> dict:
    """The record's `reach` from an `astra.sglang.srt_gates.Reach`."""
    calls = [s for s in reach.sites if s.kind == "call"]
    considered = calls or list(reach.sites)
    gates_of = [[g for g in s.gates + s.requires if not platform_only(g)] for s in considered]
    if not reach.srt:
        status = "unknown"
    elif not reach.sites:
        status = "cold"
    elif any(not gates for gates in gates_of):
        status = "warm"
    else:
        status = "gated"
    gates = list(dict.fromkeys(one_line(g, 160) for gates in gates_of for g in gates))
    return {"status": status, "verdict": one_line(reach.verdict, 300), "sites": len(reach.sites),
            "calls": len(calls), "gates": gates[:MAX_GATES], "more_gates": max(0, len(gates) - MAX_GATES),
            "sites_at": [f"{s.file}:{s.line}" for s in considered][:MAX_GATES]}


def unknown(why: str) -> dict:
    return {"status": "unknown", "verdict": one_line(why, 300), "sites": 0, "calls": 0, "gates": [],
            "more_gates": 0, "sites_at": []}


def reach_of(spec, sglang_version: str | None = None, sglang_src: str | None = None) -> dict:
    """`summarize(srt_gates.why(tree, spec.module))` on the tree the spec is benched on; a lookup that
    fails gives status unknown, with why."""
    from astra.sglang import srt_gates

    try:
        return summarize(srt_gates.why(tree_for(spec, sglang_version, sglang_src), spec.module))
    except AstraError as err:
        return unknown(f"gates unknown: {err}")


def status_of(reach: dict | None) -> str:
    status = (reach or {}).get("status")
    return status if status in REACH_FACTORS else "unknown"


def factor(reach: dict | None) -> float:
    return REACH_FACTORS[status_of(reach)]


def label(reach: dict | None) -> str:
    """One line for tables: "warm", "gated: a; b (+2 more)", "cold: no call site in sglang/srt", ..."""
    status = status_of(reach)
    reach = reach or {}
    if status == "warm":
        return "warm" + (f" (also gated: {'; '.join(reach['gates'][:2])})" if reach.get("gates") else "")
    if status == "gated":
        more = len(reach.get("gates") or []) - 3 + int(reach.get("more_gates") or 0)
        return "gated: " + "; ".join((reach.get("gates") or [])[:3]) + (f" (+{more} more)" if more > 0 else "")
    if status == "cold":
        return "cold: no call site in sglang/srt"
    return "unknown: " + (reach.get("verdict") or "no reach recorded")
