"""Text of where SGLang's runtime reaches a JIT module (srt_gates.Reach): what `astra list --why NAME` and
the MCP `list` tool print, and the call sites a model drafting a spec is shown."""

from __future__ import annotations


def _cut(text: str, width: int = 150) -> str:
    text = " ".join(text.split())
    return text if len(text) <= width else text[: width - 1] + "…"


def format_reach(reach) -> str:
    """`reach`: an `astra.sglang.srt_gates.Reach`."""
    out = [f"{reach.module}"]
    for loader in reach.loaders:
        out.append(f"  loader:   {loader}")
    wrappers = [ep for ep in reach.entry_points if ep.kind != "loader"]
    if wrappers:
        out.append("  wrappers: " + ", ".join(
            f"{ep.name}" + ("" if ep.kind == "function" else f" ({ep.kind})")
            + ("" if ep.file == reach.loaders[0].split(":")[0] else f" [{ep.module}]") for ep in wrappers))
    else:
        out.append("  wrappers: none found (no function of the wrapper file calls an export)")
    if reach.sites:
        out.append("  runtime call sites (sglang/srt), with the conditions that hold there (outermost first):")
    for site in reach.sites:
        where = f" in {site.function}" if site.function else " at module level"
        kind = "" if site.kind == "call" else " (referenced, called later)"
        out.append(f"    {site.file}:{site.line}  {site.name}{where}{kind}")
        for cond in site.import_chain:
            out.append(f"        imported if {_cut(cond)}")
        for cond in site.chain:
            out.append(f"        {'gate' if cond in site.gates else 'if  '} {_cut(cond)}")
        for cond in site.requires:
            out.append(f"        needs {_cut(cond)}")
    if reach.constraints:
        out.append("  dimension constraints:")
        for c in reach.constraints:
            values = c.values if c.op in ("in", "not in") else (c.values[0] if len(c.values) == 1 else c.values)
            out.append(f"    {c.name} {c.op} {values}" + ("" if c.certain else "  (one alternative of an `or`)"))
    out.append(f"  verdict: {reach.verdict}")
    return "\n".join(out)
