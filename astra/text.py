"""Text from outside (an LLM, an endpoint) made safe to print or store: no terminal control.

ANSI escape sequences (CSI such as ESC[2J, OSC such as a window-title or hyperlink sequence) and
every C0/C1 control character except newline and tab are removed; a carriage return would let a
line overwrite what came before it, so it goes too. `html.escape` is still the HTML report's job.

Every stage may import this module; it imports nothing of Astra.
"""

from __future__ import annotations

import re

# CSI (ESC [ ... final byte), OSC (ESC ] ... BEL or ESC \\), 8-bit CSI, other escapes; then single controls.
_ESCAPES = re.compile("\x1b\\[[0-?]*[ -/]*[@-~]|\x1b\\][^\x07\x1b]*(?:\x07|\x1b\\\\)?"
                      "|\x9b[0-?]*[ -/]*[@-~]|\x1b[ -/]*[0-~]?")
_CONTROLS = re.compile(r"[\x00-\x08\x0b-\x1f\x7f-\x9f]")


def printable(text: object) -> str:
    """`text` (any value, as str) with escape sequences and control characters except \\n and \\t removed."""
    if text is None:
        return ""
    return _CONTROLS.sub("", _ESCAPES.sub("", str(text)))


def one_line(text: object, limit: int | None = None) -> str:
    """`printable(text)` on one line (newlines and tabs become spaces), cut to `limit` characters."""
    out = " ".join(printable(text).split())
    return out if limit is None or len(out) <= limit else out[: limit - 3] + "..."
