"""Serving mixes: how often each kernel is called with each token count, as weights over token counts.

Two kinds, both read from YAML or JSON:

- a mix over token counts, `{tokens: weight}`, the same for every kernel: the built-in ones
  (`decode`, the default, `prefill`, `balanced`; astra/data/serving_mixes.yaml says what each models)
  or a file. Weights are normalised per kernel to sum to 1, so a kernel's recoverable time reads as
  microseconds per average call drawn from the mix.
- observed shape counts, `{kernel: {tokens: count}}` (what a serving trace recorded): each kernel its
  own weights. With a top-level `steps: N` (the number of forward steps the counts were observed
  over), a weight is count / N, not normalised: a kernel called 61 times per step (once per layer)
  weighs 61 times one called once, and recoverable time is microseconds per serving step. Without
  `steps`, each kernel's counts are normalised like a mix. A kernel the file does not name uses the
  `"*"` entry when there is one; otherwise it was not observed, and its weights are empty (it
  recovers nothing and the ranking says why).

A weight moves to the nearest token count of the kernel's suite (nearest in log2, ties to the smaller
count), so a mix need not list the suite's exact counts.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path

import yaml

from astra import input_files, paths
from astra.errors import BadInput

DEFAULT_MIX = "decode"
MIXES_FILE = paths.DATA_DIR / "serving_mixes.yaml"
MAX_MIX_BYTES = input_files.MIX_BYTES


@dataclass(frozen=True)
class Mix:
    """A serving mix. `weights` for a mix over token counts; `per_kernel` (and `steps`) for observed counts."""

    name: str
    description: str = ""
    weights: dict[int, float] = field(default_factory=dict)
    per_kernel: dict[str, dict[int, float]] | None = None
    steps: float | None = None

    def for_kernel(self, kernel: str) -> tuple[dict[int, float], bool, str | None]:
        """(weights over token counts, whether to normalise them, a note) for `kernel`."""
        if self.per_kernel is None:
            return self.weights, True, None
        counts = self.per_kernel.get(kernel)
        note = None
        if counts is None:
            counts = self.per_kernel.get("*")
            note = f"not in mix {self.name}: " + ("its '*' counts used" if counts is not None else "not observed")
        if counts is None:
            return {}, True, note
        if self.steps:
            return {t: c / self.steps for t, c in counts.items()}, False, note
        return counts, True, note

    def to_dict(self) -> dict:
        return {"name": self.name, "description": self.description, "weights": self.weights,
                "per_kernel": self.per_kernel, "steps": self.steps}


@lru_cache(maxsize=1)
def builtin_mixes() -> dict[str, Mix]:
    """The mixes of astra/data/serving_mixes.yaml by name."""
    raw = yaml.safe_load(MIXES_FILE.read_text())["mixes"]
    return {name: Mix(name, " ".join(str(entry.get("description", "")).split()),
                      _weights(entry["weights"], f"{MIXES_FILE.name} {name}"))
            for name, entry in raw.items()}


def load_mix(value: str | None) -> Mix:
    """`--mix`: a built-in mix's name (default decode) or a YAML/JSON file (see the module docstring)."""
    value = DEFAULT_MIX if value is None else value
    builtin = builtin_mixes()
    try:
        path = Path(value).expanduser()
    except RuntimeError:  # `~nosuchuser/...`
        path = Path(value)
    if value in builtin and not path.exists():
        return builtin[value]
    if not path.exists() and not path.is_symlink():
        raise BadInput(f"--mix {value}: neither a built-in mix ({', '.join(builtin)}) nor a file; give one of "
                       "those, or a YAML/JSON file of {tokens: weight} or {kernel: {tokens: count}}")
    data = input_files.read_yaml(path, MAX_MIX_BYTES, what="a mix file", label=f"--mix {value}")  # JSON is YAML
    return parse_mix(data, str(value))


def parse_mix(data, name: str) -> Mix:
    """A mix from parsed YAML/JSON: {tokens: weight}, or {kernel: {tokens: count}} with optional `steps`."""
    where = f"--mix {name}"
    if not isinstance(data, dict) or not data:
        raise BadInput(f"{where}: expected a mapping {{tokens: weight}} or {{kernel: {{tokens: count}}}}")
    if not any(isinstance(v, dict) for v in data.values()):
        return Mix(name, "from a file", _weights(data, where))
    steps = data.get("steps")
    if steps is not None and (isinstance(steps, bool) or not isinstance(steps, (int, float))
                              or not 0 < steps < math.inf):
        raise BadInput(f"{where}: steps {steps!r} is not a positive number of observed steps")
    per_kernel = {}
    for kernel, counts in data.items():
        if kernel == "steps":
            continue
        if not isinstance(counts, dict):
            raise BadInput(f"{where}: {kernel}: expected {{tokens: count}}, got {type(counts).__name__}")
        per_kernel[str(kernel)] = _weights(counts, f"{where}: {kernel}", allow_zero=True)
    return Mix(name, "observed shape counts" + (f" over {steps:g} steps" if steps else ""), {}, per_kernel,
               float(steps) if steps else None)


def _weights(raw: dict, where: str, *, allow_zero: bool = False) -> dict[int, float]:
    out: dict[int, float] = {}
    for key, value in raw.items():
        try:
            tokens = int(str(key).strip())
        except ValueError:
            raise BadInput(f"{where}: key {key!r} is not a token count (a whole number)") from None
        if tokens <= 0:
            raise BadInput(f"{where}: token count {tokens} is not positive")
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 <= value < math.inf:
            raise BadInput(f"{where}: tokens {tokens}: weight {value!r} is not a non-negative number")
        out[tokens] = out.get(tokens, 0.0) + float(value)
    if not allow_zero and not any(out.values()):
        raise BadInput(f"{where}: every weight is zero")
    return dict(sorted(out.items()))


def nearest(tokens: int, suite: list[int]) -> int:
    """The suite's token count nearest to `tokens` in log2 (ties: the smaller)."""
    return min(sorted(suite), key=lambda s: abs(math.log2(s) - math.log2(tokens)))


def suite_weights(weights: dict[int, float], suite: list[int], *, normalise: bool = True) -> dict[int, float]:
    """Each weight moved to the nearest count of `suite`; normalised to sum to 1 if asked (and nonzero).
    Every suite count is a key (0.0 where no weight lands)."""
    out = {t: 0.0 for t in sorted(set(suite))}
    if not out:
        return out
    for tokens, weight in weights.items():
        out[nearest(tokens, list(out))] += weight
    total = sum(out.values())
    if normalise and total > 0:
        out = {t: w / total for t, w in out.items()}
    return out
