"""Concrete build variants for a JIT module: template arguments rendered into wrapper entries.

For a spec'd kernel the variants come from the spec (reviewed). For any other module the template
arguments that SGLang computes at run time (`make_cpp_args(head_dim, dtype, ...)`) are filled with
defaults: the loader's own default values first, then conventions of SGLang's names (a `dtype` is
bf16, `is_arch_support_pdl()` is true on Hopper). Guessed values are reported as guessed, and the
user overrides any of them with `--set name=value`.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from astra.sglang.discovery import CallSite

_PY_TO_CPP = {"True": "true", "False": "false", "torch.bfloat16": "bf16_t", "torch.float16": "fp16_t",
              "torch.float32": "fp32_t", "torch.float": "fp32_t", "torch.float8_e4m3fn": "fp8_e4m3_t",
              "torch.int32": "int32_t", "torch.int64": "int64_t", "torch.uint8": "uint8_t"}
# Conventional values for SGLang's template-argument names (Llama-3.1-8B-like where a size is asked).
_NAME_DEFAULTS = [
    (r"pdl", "true"),
    (r"out.*dtype|dtype.*out", "fp8_e4m3_t"),
    (r"(pos|seq|index|idx|req).*dtype", "int64_t"),
    (r"dtype", "bf16_t"),
    (r"^(is_|use_|has_|do_|enable|fuse|with_|skip|transpose|vectorized|pair)", "false"),
    (r"head_dim|rope_dim", "128"),
    (r"hidden|^d$|^dim$", "4096"),
    (r"group_size", "128"),
    (r"topk|top_k", "8"),
    (r"page_size|block_size", "64"),
    (r"world_size|num_gpus", "8"),
    (r"num_threads|threads|block_dim", "256"),
    (r"warps", "4"),
    (r"row_bytes|_bytes$", "256"),
]


@dataclass
class GuessedVariant:
    wrappers: list[tuple[str, str, str]]  # (export, entry, lang)
    extra_cuda_cflags: list[str]
    values: dict[str, str]  # symbol -> C++ text
    guessed: list[str] = field(default_factory=list)  # symbols filled by convention
    unresolved: list[str] = field(default_factory=list)
    fixed: list[str] = field(default_factory=list)  # integer literals and module constants: never a swept dim


def _symbol_value(symbol: str, defaults: dict[str, str], constants: dict[str, str],
                  overrides: dict[str, str]) -> tuple[str | None, str]:
    """(C++ value, where it came from): override, python, literal, default, constant (the loader module's
    own), name (a guess by convention) or none."""
    if symbol in overrides:
        return overrides[symbol], "override"
    if symbol in _PY_TO_CPP:
        return _PY_TO_CPP[symbol], "python"
    if re.fullmatch(r"-?\d+(\.\d+)?", symbol):
        return symbol, "literal"
    if symbol in defaults and defaults[symbol] != "None":
        return _PY_TO_CPP.get(defaults[symbol], defaults[symbol]), "default"
    if symbol in constants:
        return constants[symbol], "constant"
    key = symbol.rstrip("()").split(".")[-1].lower()
    for pattern, value in _NAME_DEFAULTS:
        if re.search(pattern, key):
            return value, "name"
    return None, "none"


def guess(site: CallSite, overrides: dict[str, str] | None = None) -> GuessedVariant:
    """Fill the `{args}` holes of a call site's wrappers and flags."""
    overrides = overrides or {}
    values: dict[str, str] = {}
    guessed: list[str] = []
    unresolved: list[str] = []

    constants = getattr(site, "module_constants", {}) or {}  # below what a caller or the loader defaults
    defaults = {k: v for c in site.callers for k, v in c.defaults.items()}
    defaults.update(site.loader_defaults)
    fixed: list[str] = []

    def value_of(symbol: str) -> str:
        value, origin = _symbol_value(symbol, defaults, constants, overrides)
        if value is None:
            unresolved.append(symbol)
            return "{" + symbol + "}"
        if origin == "name" and symbol not in guessed:
            guessed.append(symbol)
        if origin in ("literal", "constant") and symbol not in fixed:
            fixed.append(symbol)
        values[symbol] = value
        return value

    lists = {var: ", ".join(value_of(a) for a in args if not a.startswith("*"))
             for var, args in site.template_args.items()}

    def fill(text: str) -> str:
        def hole(m: re.Match) -> str:
            inner = m.group(1)
            if inner in lists:
                return lists[inner]
            cond = re.fullmatch(r"\s*(.+?)\s+if\s+(.+?)\s+else\s+(.+?)\s*", inner)
            if cond:  # `{0 if is_neox else 1}`: decide the condition like any other argument
                taken = value_of(cond.group(2)) not in ("false", "0", "False")
                return value_of(cond.group(1) if taken else cond.group(3))
            return value_of(inner)
        return re.sub(r"\{([^{}]+)\}", hole, text)

    wrappers = [(w.export, fill(w.entry), w.lang) for w in site.wrappers]
    flags = [fill(f) for f in site.extra_cuda_cflags]
    return GuessedVariant(wrappers, flags, values, guessed, sorted(set(unresolved)), fixed)
