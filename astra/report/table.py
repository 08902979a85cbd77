"""Plain aligned text tables for the terminal (no dependency; pipes and CI logs stay readable)."""

from __future__ import annotations


def render(headers: list[str], rows: list[list], align: str | None = None, max_width: int = 48) -> str:
    """`align`: one character per column, 'l' or 'r' (default: numbers right, text left).
    Cells wider than `max_width` are cut with an ellipsis (use --json for full values)."""
    cells = [[_cut(_fmt(c), max_width) for c in row] for row in rows]
    widths = [max([len(h)] + [len(r[i]) for r in cells]) for i, h in enumerate(headers)]
    if align is None:
        align = "".join("r" if rows and all(isinstance(r[i], (int, float)) for r in rows) else "l"
                        for i in range(len(headers)))

    def line(values):
        return "  ".join(v.rjust(w) if a == "r" else v.ljust(w)
                         for v, w, a in zip(values, widths, align)).rstrip()

    out = [line(headers), line(["-" * w for w in widths])]
    out += [line(r) for r in cells]
    return "\n".join(out)


def _cut(text: str, width: int) -> str:
    return text if len(text) <= width else text[: width - 1] + "…"


def _fmt(value) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        return f"{value:.3g}" if abs(value) < 1000 else f"{value:.0f}"
    return str(value)
