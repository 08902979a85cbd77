"""Prompt templates: data files `astra/llm/prompts/<name>.md` with `${name}` placeholders, one per role
(the optimize loop's LLM agent: system, testing, profiling, planning, coding; spec drafting: testing_*).

    render("planning", kernel="rmsnorm", gpu="NVIDIA H200", ...)

Only the braced form `${identifier}` is a placeholder; `$$` writes a literal `$`. Rendering is
strict in both directions: a placeholder without a value is an error naming it, and so is a value
that no placeholder uses (it catches typos such as `soruce=`). Strings are inserted as they are,
numbers with `str`, None as "(not available)", anything else (dicts, lists) as indented JSON.
"""

from __future__ import annotations

import json
import re
from functools import lru_cache
from pathlib import Path
from typing import Any

from astra.errors import AstraError

PROMPTS = Path(__file__).parent / "prompts"
_TOKEN = re.compile(r"\$(?:(\$)|\{([A-Za-z_][A-Za-z0-9_]*)\}|(\{[^}\n]*\}?))")


class TemplateError(AstraError):
    """A template that does not exist, is malformed, or was given the wrong variables."""


def names() -> list[str]:
    """The templates that exist (file stems)."""
    return sorted(p.stem for p in PROMPTS.glob("*.md"))


@lru_cache(maxsize=None)
def _load(name: str) -> str:
    path = PROMPTS / f"{name}.md"
    if not path.is_file():
        raise TemplateError(f"no prompt template {name!r} (looked for {path}); templates: {', '.join(names())}")
    text = path.read_text(encoding="utf-8")
    bad = [m.group(3) for m in _TOKEN.finditer(text) if m.group(3)]
    if bad:
        raise TemplateError(f"{path}: malformed placeholder ${bad[0]} (write ${{name}} with a Python identifier)")
    return text


def variables(name: str) -> list[str]:
    """The placeholders of template `name`, in order of first use."""
    found = [m.group(2) for m in _TOKEN.finditer(_load(name)) if m.group(2)]
    return list(dict.fromkeys(found))


def _text(value: Any) -> str:
    if isinstance(value, str):
        return value
    if value is None:
        return "(not available)"
    if isinstance(value, (int, float)):
        return str(value)
    return json.dumps(value, indent=2, ensure_ascii=False, default=str)


def render(name: str, **values: Any) -> str:
    """Template `name` with every placeholder replaced; raises TemplateError on a missing or unused value."""
    text, wanted = _load(name), variables(name)
    missing = [v for v in wanted if v not in values]
    unused = sorted(set(values) - set(wanted))
    if missing or unused:
        parts = []
        if missing:
            parts.append(f"missing value(s) for {', '.join(missing)}")
        if unused:
            parts.append(f"unused value(s) {', '.join(unused)} (no such placeholder)")
        raise TemplateError(f"prompt template {name!r}: {'; '.join(parts)}; it takes: {', '.join(wanted)}")
    return _TOKEN.sub(lambda m: "$" if m.group(1) else _text(values[m.group(2)]), text)
