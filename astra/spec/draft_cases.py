"""The cases of a drafted spec: model configurations whose dims meet the runtime's gates
(`gate_models`), their dims and token counts moved where the host checks ask
(astra.spec.constraint_fit), and kept where every constraint holds and the tensors fit in
`MAX_CASE_BYTES`; edge shapes (every dim 64) when no model fits.
"""

from __future__ import annotations

import math
from pathlib import Path

from astra.spec import evidence, meanings
from astra.spec.constraint_fit import satisfy, violated
from astra.spec.expr import ExprError, evaluate, names_in
from astra.spec.model import KernelSpec, load_models

MAX_CASE_BYTES = 3 << 29  # 1.5 GiB of tensors per case


def gate_models(models, constraints: list[dict], dim_meanings: dict, notes: list[str]) -> list[tuple[str, int]]:
    """Keep the models whose dims satisfy the runtime's gates (e.g. `head_size not in (64, 128, 256,
    512)` sends only Phi-3's 96 here); when none of the usual ones does, look through every model."""
    if not constraints:
        return models
    all_models = load_models()

    def fits(model: str, tp: int) -> bool:
        fields = {**all_models[model], "tp": tp}
        for c in constraints:
            wanted = meanings.meaning_of(c["name"])
            for d, m in dim_meanings.items():
                if wanted is None or m is None or m.key != wanted.key:
                    continue
                value, _ = meanings.value_for(m, fields, tp)
                try:
                    value = int(evaluate(str(value), fields))
                except ExprError:
                    continue
                if not evidence.satisfies(value, c):
                    return False
        return True

    kept = [m for m in models if fits(*m)]
    if not kept:
        kept = [(m, 1) for m in all_models if fits(m, 1)][:3]
        if kept:
            notes.append(f"models chosen by the runtime's gates: {[m for m, _ in kept]}")
    return kept or models


def fill_models(spec: dict, models, dim_meanings: dict, token_dim: str, notes: list[str],
                constraints: list[str] = ()) -> None:
    """Model entries (dims by meaning, moved where the host checks ask: `satisfy`) and their
    token counts (moved likewise, then kept when every constraint holds and the tensors fit)."""
    all_models = load_models()
    derived = spec["derived"]
    dtypes = spec["dtypes"]
    free = [c for c in constraints if token_dim not in _closure(c, derived)]
    entries = []
    for model, tp in models:
        fields = {**all_models[model], "tp": tp}
        entry_dims, values = {}, {}
        for d, m in dim_meanings.items():
            value, _ = meanings.value_for(m, fields, tp)
            entry_dims[d] = value
            try:
                values[d] = int(evaluate(value, fields) if isinstance(value, str) else value)
            except (ExprError, TypeError, ValueError):
                values[d] = 128
        moved = satisfy(values, derived, free, set(values), dtypes[0])
        for d, v in moved.items():
            if v != values[d]:
                entry_dims[d] = v
        entries.append({"model": model, "tp": tp, "dims": entry_dims, "_values": moved})
    spec["shapes"]["models"] = entries
    for entry in entries:
        base = entry.pop("_values")
        entry["tokens"] = _tokens(spec, base, token_dim, constraints, meanings.TOKENS)
    dropped = [e["model"] for e in entries if not e["tokens"]]
    spec["shapes"]["models"] = [e for e in entries if e["tokens"]]
    if dropped:
        notes.append(f"models {dropped}: every token count is over {MAX_CASE_BYTES >> 20} MiB of tensors, "
                     "invalid or refused by a host check")
    if not spec["shapes"]["models"]:
        edge: list[dict] = []
        for base in (64, 16, 8):  # smaller dims when tensors of many dims outgrow MAX_CASE_BYTES at 64
            for t in (1, 16, 128):
                values = {d: base for d in spec["dims"] if d != token_dim}
                values = satisfy({**values, token_dim: t}, derived, constraints, set(values), dtypes[0])
                values = satisfy(values, derived, constraints, {token_dim}, dtypes[0])
                if _fits(spec, values, constraints) and values not in edge:
                    edge.append(values)
            if edge:
                break
        spec["shapes"]["edge"] = edge
        notes.append(f"no model configuration fits: edge shapes with every dim {base} (moved where a check asks) "
                     "were used")
        if not edge:
            notes.append("no edge shape meets every host check either: the draft has no case")


def _closure(expr: str, derived: dict[str, str]) -> set[str]:
    out, stack = set(), list(names_in(expr))
    while stack:
        n = stack.pop()
        if n not in out:
            out.add(n)
            stack += list(names_in(derived.get(n, "")))
    return out


def _tokens(spec: dict, base: dict[str, int], token_dim: str, constraints, sweep: list[int]) -> list[int]:
    """The sweep's token counts moved to meet the checks on the token dim, kept where every case fits."""
    kept: list[int] = []
    for tokens in sweep:
        values = satisfy({**base, token_dim: tokens}, spec["derived"], list(constraints), {token_dim},
                               spec["dtypes"][0])
        t = values[token_dim]
        if t not in kept and _fits(spec, values, constraints):
            kept.append(t)
    return kept


def _fits(spec: dict, values: dict[str, int], constraints) -> bool:
    """Every constraint holds for every dtype, and the tensors fit in MAX_CASE_BYTES."""
    probe = KernelSpec(path=Path("draft.yaml"), raw=spec)
    for dtype in spec["dtypes"]:
        if violated(values, spec["derived"], list(constraints), dtype):
            return False
    try:
        names = probe.names_for(values, spec["dtypes"][0])
        sizes = [[int(evaluate(str(d), names)) for d in a["shape"]] for a in spec["arguments"]
                 if a["kind"] == "tensor" and a.get("present", True) is not False]
        total = sum(math.prod(shape) * 2 for shape in sizes)
    except (ExprError, KeyError, ZeroDivisionError, TypeError, ValueError):
        return False
    return all(d >= 1 for shape in sizes for d in shape) and 0 < total <= MAX_CASE_BYTES



def refit_tokens(spec: dict) -> list[str]:
    """After the template values were settled by compiling (a derived constant such as `max_tokens: 64`),
    the token counts and edge shapes that now break a constraint are dropped; returns review notes."""
    constraints = list(spec["shapes"].get("constraints") or [])
    token_dim = spec["shapes"].get("token_dim", "tokens")
    if not constraints:
        return []
    all_models, notes, kept_entries = load_models(), [], []
    for entry in spec["shapes"].get("models") or []:
        fields = {**all_models.get(entry["model"], {}), "tp": entry.get("tp", 1)}
        try:
            base = {d: int(evaluate(v, fields) if isinstance(v, str) else v) for d, v in (entry.get("dims") or {}).items()}
        except (ExprError, TypeError, ValueError):
            kept_entries.append(entry)
            continue
        tokens = [t for t in entry.get("tokens") or [] if _fits(spec, {**base, token_dim: t}, constraints)]
        if tokens != entry.get("tokens"):
            notes.append(f"{entry['model']}: token counts {sorted(set(entry.get('tokens') or []) - set(tokens))} "
                         "dropped: they break a check once the template values were settled")
        if tokens:
            kept_entries.append({**entry, "tokens": tokens})
    spec["shapes"]["models"] = kept_entries
    spec["shapes"]["edge"] = [e for e in spec["shapes"].get("edge") or [] if _fits(spec, dict(e), constraints)]
    return notes
