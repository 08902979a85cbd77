"""Pure comparison functions: candidate vs original, candidate vs a float64 reference, bitwise checks.

Every float comparison happens in float64 (float8 and bf16 are converted first). Rules:

- Against the original: an element mismatches when |cand - orig| > atol + rtol * |orig|; the
  non-finite values (NaN, +Inf, -Inf) must sit at exactly the original's positions, each of the same
  kind. Integer and bool outputs must be equal.
- Against a reference: the error is the relative L2 norm ||out - ref|| / ||ref|| over positions where
  both are finite (the non-finite positions are governed by the rule above); the candidate passes when
  its error <= max(2 x the original's error, floor).
- Read-only arguments: unchanged bit for bit (bytes compared, so NaN payloads count).
- Unordered outputs (a top-k's indices and the values paired with them): the order of values along the
  last dim is not part of the result. Before any comparison, each row of such outputs is sorted as a
  row of tuples (`sort_rows_together`: integer outputs are the leading keys), so the multiset of
  (index, value, ...) tuples per row must match: a pairing the candidate breaks still fails.
- Strided views: the storage outside the view (the gaps between rows, which belong to other tensors in
  the caller, e.g. the other columns of a fused qkv output) unchanged bit for bit; values are compared
  on the view.

Cost (the judge compares every output of every trial): `compare_outputs` and `error_vs_reference` compute
their statistics on the device and read them with one synchronisation each (no boolean-mask indexing);
`same_bytes_check` gives, after one bitwise comparison, the check `compare_outputs` would give an output
holding exactly the original's bytes (the result is the same, every field of it); `unchanged_all` and
`same_bytes_checks` read the bitwise comparisons of every argument of a call with one synchronisation.

Memory: the float64 statistics take several temporaries of 8 bytes per element. A large output is compared
in pieces of CHUNK elements, and the pieces' statistics are combined on the device (maxima, counts, norms),
so the judge's memory stays bounded whatever the output's size. Without pieces, compare_outputs held five
float64 copies at once: 16 GiB for one 805 MB bf16 output, which ran the judge out of memory beside the
candidate's process on an H100 (concat_mla_k at 16,384 tokens, SGLang 0.5.23). An output of CHUNK elements or
fewer is one piece: the same operations, bit for bit, as before.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Iterator

import torch

# Per-dtype tolerances used when a job gives none for a dtype (against the original; floor: reference).
DEFAULT_TOLERANCE: dict[str, dict[str, float]] = {
    "float64": {"atol": 1e-10, "rtol": 1e-10, "floor": 1e-12},
    "float32": {"atol": 1e-5, "rtol": 1e-5, "floor": 1e-5},
    "float16": {"atol": 1e-3, "rtol": 1e-3, "floor": 1e-3},
    "bfloat16": {"atol": 1e-2, "rtol": 1e-2, "floor": 1e-2},
    "float8_e4m3fn": {"atol": 1.25e-1, "rtol": 1.25e-1, "floor": 6e-2},
    "float8_e4m3fnuz": {"atol": 1.25e-1, "rtol": 1.25e-1, "floor": 6e-2},
    "float8_e5m2": {"atol": 2.5e-1, "rtol": 2.5e-1, "floor": 1.2e-1},
    "float8_e5m2fnuz": {"atol": 2.5e-1, "rtol": 2.5e-1, "floor": 1.2e-1},
}
EXACT = {"atol": 0.0, "rtol": 0.0, "floor": 0.0}
CHUNK = 1 << 24  # elements compared at once: float64 temporaries of 128 MiB each


@dataclass
class OutputCheck:
    """One output compared with the original's (worst over trials once merged)."""

    ok: bool
    max_abs: float = 0.0
    max_rel: float = 0.0  # over positions where the original is non-zero
    mismatches: int = 0  # finite positions outside atol + rtol * |orig|
    nonfinite_mismatches: int = 0  # positions whose NaN/Inf status differs from the original's
    numel: int = 0
    reason: str = ""

    def merge(self, other: "OutputCheck") -> "OutputCheck":
        """Worst of two checks (first failure reason kept)."""
        return OutputCheck(
            ok=self.ok and other.ok,
            max_abs=max(self.max_abs, other.max_abs),
            max_rel=max(self.max_rel, other.max_rel),
            mismatches=max(self.mismatches, other.mismatches),
            nonfinite_mismatches=max(self.nonfinite_mismatches, other.nonfinite_mismatches),
            numel=max(self.numel, other.numel),
            reason=self.reason or other.reason,
        )

    def to_dict(self) -> dict:
        return asdict(self)


def tolerance_for(tolerances: dict[str, dict[str, float]], out_dtype: str, case_dtype: str) -> dict[str, float]:
    """The tolerance for an output: the job's entry for the output's dtype if any, else the looser
    (field by field) of the job's entry for the case dtype and the default for the output's dtype.
    Integer and bool outputs are exact."""
    name = out_dtype.removeprefix("torch.")
    dtype = getattr(torch, name, None)
    if isinstance(dtype, torch.dtype) and not dtype.is_floating_point:
        return dict(EXACT)
    if name in tolerances:
        return {**DEFAULT_TOLERANCE.get(name, {}), **tolerances[name]}
    base = tolerances.get(case_dtype, {})
    default = DEFAULT_TOLERANCE.get(name, DEFAULT_TOLERANCE["float32"])
    return {key: max(float(base.get(key, 0.0)), float(default[key])) for key in ("atol", "rtol", "floor")}


def _finite(x: torch.Tensor) -> torch.Tensor:
    """torch.isfinite in two kernels instead of four: |x| < Inf is False for NaN and for +-Inf."""
    return x.abs() < math.inf


def _pieces(t: torch.Tensor) -> Iterator[torch.Tensor]:
    """`t` itself when it has CHUNK elements or fewer, else its elements in row-major order, CHUNK or fewer at a
    time, a few rows (dim 0) each, made one at a time: views of a contiguous tensor, copies of those rows of a
    strided one. The pieces depend on the shape alone, so two tensors of one shape are cut alike."""
    if t.numel() <= CHUNK:
        yield t
    else:
        per_row = t.numel() // t.shape[0]
        if per_row > CHUNK:  # a row alone is too large: its own pieces, row after row
            for row in range(t.shape[0]):
                yield from _pieces(t[row])
        else:
            rows = CHUNK // per_row
            for start in range(0, t.shape[0], rows):
                yield t.narrow(0, start, min(rows, t.shape[0] - start)).reshape(-1)


def _differences(orig: torch.Tensor, cand: torch.Tensor, tol: dict[str, float]):
    """One piece's float64 original, |difference|, |original|, positions outside the tolerance and positions
    whose NaN/Inf class differs."""
    o = orig.to(torch.float64)
    # NaN/Inf classes are compared in the output's own dtype (its conversion to float64 is exact), float8 in
    # float64 (torch has no isnan or abs for it on every device). The candidate enters the float64 difference
    # as it is (promoted inside the kernel): the same values as its float64 copy.
    x, y = (orig, cand) if orig.element_size() > 1 else (o, cand.to(torch.float64))
    finite = _finite(x) & _finite(y)
    # A class differs where not both are finite, the values differ and not both are NaN (+Inf == +Inf).
    class_differs = ~(finite | (x == y) | (torch.isnan(x) & torch.isnan(y)))
    diff = torch.where(finite, (o - y).abs_(), 0.0)
    o_abs = o.abs()
    bound = float(tol.get("atol", 0.0)) + float(tol.get("rtol", 0.0)) * o_abs
    return o, diff, o_abs, finite & (diff > bound), class_differs


def _float_stats(orig: torch.Tensor, cand: torch.Tensor, tol: dict[str, float]) -> torch.Tensor:
    """One piece's [max abs, max rel, mismatches, non-finite mismatches] as a float64 tensor on the device, not
    yet read."""
    o, diff, o_abs, outside, class_differs = _differences(orig, cand, tol)
    # max_rel over finite positions where the original is non-zero: every other position gives 0 here (diff is 0
    # where either side is not finite; |orig| > 0 is False for NaN and 0) and every ratio is >= 0.
    rel = torch.where(o_abs > 0, diff / o_abs, 0.0)
    zero = torch.zeros((), dtype=torch.float64, device=o.device)
    numel = orig.numel()
    return torch.stack([diff.max() if numel else zero, rel.max() if numel else zero,
                        outside.sum().to(torch.float64), class_differs.sum().to(torch.float64)])


def _first_bad(orig: torch.Tensor, cand: torch.Tensor, tol: dict[str, float], limit: int = 3) -> list[list[int]]:
    """The first `limit` differing positions (row-major order), as indices into the outputs' shape."""
    found: list[list[int]] = []
    offset = 0
    for o, c in zip(_pieces(orig), _pieces(cand)):
        _, _, _, outside, class_differs = _differences(o, c, tol)
        for flat in torch.nonzero((class_differs | outside).reshape(-1))[: limit - len(found)].flatten().tolist():
            found.append(_unravel(offset + int(flat), orig.shape))
        if len(found) >= limit:
            break
        offset += o.numel()
    return found


def _unravel(flat: int, shape: torch.Size) -> list[int]:
    index = []
    for size in reversed(shape):
        flat, position = divmod(flat, size)
        index.append(position)
    return index[::-1]


def compare_outputs(orig: torch.Tensor, cand: torch.Tensor, tol: dict[str, float]) -> OutputCheck:
    """Compare the candidate's output with the original's (see the module docstring). Every statistic is
    computed on the device and read with one synchronisation (a failure's "first at" positions take one more)."""
    if orig.shape != cand.shape or orig.dtype != cand.dtype:
        return OutputCheck(False, reason=f"shape/dtype {tuple(cand.shape)}/{cand.dtype} != "
                                         f"{tuple(orig.shape)}/{orig.dtype}")
    numel = orig.numel()
    if not orig.dtype.is_floating_point:
        mismatches = int((orig != cand).sum().item())
        max_abs = 0.0
        if mismatches:  # a second synchronisation, on failure only
            max_abs = max(float((o.to(torch.float64) - c.to(torch.float64)).abs().max().item())
                          for o, c in zip(_pieces(orig), _pieces(cand)))
        reason = f"{mismatches} of {numel} integer elements differ" if mismatches else ""
        return OutputCheck(mismatches == 0, max_abs, 0.0, mismatches, 0, numel, reason)
    parts = [_float_stats(o, c, tol) for o, c in zip(_pieces(orig), _pieces(cand))]
    if len(parts) == 1:
        stats = parts[0]
    else:  # the largest errors, the counts summed
        stacked = torch.stack(parts)
        stats = torch.cat([stacked[:, :2].amax(dim=0), stacked[:, 2:].sum(dim=0)])
    max_abs, max_rel, mismatches_f, nonfinite_f = stats.tolist()  # counts < 2^53: exact in float64
    mismatches, nonfinite = int(mismatches_f), int(nonfinite_f)
    reasons = []
    if nonfinite:
        reasons.append(f"{nonfinite} NaN/Inf positions differ from the original's")
    if mismatches:
        reasons.append(f"{mismatches} of {numel} elements outside atol={tol.get('atol')} rtol={tol.get('rtol')} "
                       f"(max abs {max_abs:.3g}, max rel {max_rel:.3g})")
    if reasons:  # where: the first differing positions, for whoever fixes the kernel
        reasons.append("first at " + ", ".join(str(index) for index in _first_bad(orig, cand, tol)))
    return OutputCheck(not reasons, max_abs, max_rel, mismatches, nonfinite, numel, "; ".join(reasons))


def same_bytes_check(orig: torch.Tensor, cand: torch.Tensor, tol: dict[str, float]) -> OutputCheck | None:
    """The check `compare_outputs` gives when the candidate's output holds exactly the original's bytes, found
    with one bitwise comparison; None where it does not (then compare them). Same bytes mean same values, so:
    every NaN/Inf class equal, |cand - orig| = 0 at every finite position (max_abs and max_rel 0), no position
    outside atol + rtol * |orig| (with atol, rtol >= 0, which the shortcut requires) and integers all equal.
    Same device and strides are required too, so that the reference error of both is one computation
    (`error_vs_reference` on the same values, laid out alike)."""
    return same_bytes_checks([(orig, cand, tol)])[0]


def same_bytes_checks(outputs: list[tuple[torch.Tensor, torch.Tensor, dict[str, float]]]) -> list[OutputCheck | None]:
    """`same_bytes_check(orig, cand, tol)` of every output, the bitwise comparisons read with one
    synchronisation per device."""
    eligible = [orig.device == cand.device and orig.stride() == cand.stride()
                and float(tol.get("atol", 0.0)) >= 0.0 and float(tol.get("rtol", 0.0)) >= 0.0
                for orig, cand, tol in outputs]
    same = iter(unchanged_all([(orig, cand) for (orig, cand, _), ok in zip(outputs, eligible) if ok]))
    return [OutputCheck(True, 0.0, 0.0, 0, 0, orig.numel(), "") if ok and next(same) else None
            for (orig, _, _), ok in zip(outputs, eligible)]


def _bytes(t: torch.Tensor) -> torch.Tensor:
    return t.contiguous().reshape(-1).view(torch.uint8)


def unchanged(before: torch.Tensor, after: torch.Tensor) -> bool:
    """True when `after` holds exactly the bytes of `before` (same shape and dtype; NaN-safe)."""
    return unchanged_all([(before, after)])[0]


def unchanged_all(pairs: list[tuple[torch.Tensor, torch.Tensor]]) -> list[bool]:
    """`unchanged(before, after)` of every pair, read with one synchronisation per device: each pair's bytes
    compared where they are (after moved to before's device), the answers stacked and read together."""
    answers: list[bool | None] = []
    differs: dict[torch.device, list[torch.Tensor]] = {}
    slots: list[tuple[torch.device, int]] = []
    for before, after in pairs:
        if before.shape != after.shape or before.dtype != after.dtype:
            answers.append(False)
            continue
        if before.device != after.device:
            after = after.to(before.device)
        flags = differs.setdefault(before.device, [])
        slots.append((before.device, len(flags)))
        flags.append(torch.ne(_bytes(before), _bytes(after)).any())  # False for no bytes, as torch.equal's True
        answers.append(None)
    read = {device: torch.stack(flags).tolist() for device, flags in differs.items()}
    pending = iter(slots)
    out = []
    for answer in answers:
        if answer is None:
            device, index = next(pending)
            answer = not read[device][index]
        out.append(answer)
    return out


_SAME_SIZE_INT = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}


def _flat_storage(t: torch.Tensor) -> torch.Tensor:
    return t.as_strided((t.untyped_storage().nbytes() // t.element_size(),), (1,), 0)


def gaps_unchanged(before: torch.Tensor, after: torch.Tensor) -> bool:
    """True when the storage behind the view `after` holds, outside the view (the gaps between the rows
    of a strided view), exactly the bytes it holds behind `before` (same size, strides and storage size)."""
    if (before.shape != after.shape or before.stride() != after.stride() or before.dtype != after.dtype
            or before.untyped_storage().nbytes() != after.untyped_storage().nbytes()):
        return False
    if before.device != after.device:
        after = _flat_storage(after).to(before.device).as_strided(after.size(), after.stride(), after.storage_offset())
    int_dtype = _SAME_SIZE_INT[before.element_size()]
    flat_b, flat_a = _flat_storage(before).view(int_dtype), _flat_storage(after).view(int_dtype)
    gaps = torch.ones(flat_b.shape, dtype=torch.bool, device=before.device)
    gaps.as_strided(before.size(), before.stride(), before.storage_offset()).fill_(False)
    return bool(torch.equal(flat_b[gaps], flat_a[gaps]))


def error_vs_reference(out: torch.Tensor, ref: torch.Tensor) -> dict[str, float]:
    """Error of `out` against a float64 reference: max_abs and rel_l2 over positions where both are
    finite (rel_l2 falls back to the absolute L2 norm when the reference is all zeros there), and
    `nonfinite`: positions where `out` is NaN/Inf but the reference is finite. One synchronisation."""
    return reference_error(reference_stats(out, ref).tolist())


def reference_stats(out: torch.Tensor, ref: torch.Tensor) -> torch.Tensor:
    """`error_vs_reference`'s statistics as a float64 tensor on `out`'s device, not yet read (several are
    read with one synchronisation): [error norm, reference norm, max abs error, non-finite count]. A large
    output's pieces (CHUNK elements each) combine as the norm of their norms, the largest error and the sum of
    counts."""
    if tuple(out.shape) != tuple(ref.shape):
        raise ValueError(f"reference shape {tuple(ref.shape)} != output shape {tuple(out.shape)}")
    parts = [_reference_piece(o, r) for o, r in zip(_pieces(out), _pieces(ref))]
    if len(parts) == 1:
        return parts[0]
    stacked = torch.stack(parts)
    return torch.stack([torch.linalg.vector_norm(stacked[:, 0]), torch.linalg.vector_norm(stacked[:, 1]),
                        stacked[:, 2].max(), stacked[:, 3].sum()])


def _reference_piece(out: torch.Tensor, ref: torch.Tensor) -> torch.Tensor:
    o = out.to(torch.float64)
    r = ref.to(device=o.device, dtype=torch.float64)
    finite_r = _finite(r)
    finite = _finite(o) & finite_r
    zero = torch.zeros((), dtype=torch.float64, device=o.device)
    diff = torch.where(finite, o - r, zero)
    ref_f = torch.where(finite, r, zero)
    max_abs = zero
    if diff.numel():  # max |diff| = max(|min|, |max|): one reduction, no |diff| tensor
        low, high = torch.aminmax(diff)
        max_abs = torch.maximum(low.abs(), high.abs())
    # out non-finite where the reference is finite: the reference's finite positions less the common ones
    nonfinite = finite_r.sum() - finite.sum()
    return torch.stack([torch.linalg.vector_norm(diff), torch.linalg.vector_norm(ref_f), max_abs,
                        nonfinite.to(torch.float64)])


def reference_error(stats: list[float]) -> dict[str, float]:
    """`error_vs_reference`'s dict from `reference_stats`, read."""
    err_norm, ref_norm, max_abs, nonfinite = stats
    return {
        "max_abs": max_abs,
        "rel_l2": err_norm / ref_norm if ref_norm > 0.0 else err_norm,
        "nonfinite": int(nonfinite),
    }


def reference_verdict(cand_err: float, orig_err: float, floor: float) -> tuple[bool, str]:
    """The reference rule: candidate error <= max(2 x original error, floor). Returns (ok, reason)."""
    limit = max(2.0 * orig_err, floor) if math.isfinite(orig_err) else floor
    if not math.isfinite(cand_err):
        return False, f"error vs float64 reference is {cand_err}"
    if cand_err <= limit:
        return True, ""
    return False, (f"error vs float64 reference {cand_err:.3g} > max(2 x original's {orig_err:.3g}, "
                   f"floor {floor:.3g}) = {limit:.3g}")


def sort_rows_together(tensors: list[torch.Tensor]) -> list[torch.Tensor]:
    """Tensors of one shape with each row (last dim) reordered by one permutation: the lexicographic order
    of the tuples (integer tensors first, in the order given, then floats). Stable sorts from the last
    key to the first (radix order); equal tuples keep their order, which cannot matter."""
    if not tensors or tensors[0].dim() == 0:
        return list(tensors)
    keys = sorted(range(len(tensors)), key=lambda i: (tensors[i].is_floating_point(), i))
    n = tensors[0].shape[-1]
    perm = torch.arange(n, device=tensors[0].device).expand(tensors[0].shape).contiguous()
    for i in reversed(keys):
        values = torch.gather(_sortable(tensors[i]), -1, perm)
        perm = torch.gather(perm, -1, torch.sort(values, dim=-1, stable=True).indices)
    return [_gather(t, perm) for t in tensors]


_SIGNED = {1: torch.int8, 2: torch.int16, 4: torch.int32, 8: torch.int64}
_UNSIGNED = (torch.uint16, torch.uint32, torch.uint64)


def _gather(t: torch.Tensor, index: torch.Tensor) -> torch.Tensor:
    """torch.gather along the last dim for any dtype (float8 and unsigned ints have no gather kernel:
    moved as same-size signed words)."""
    if t.is_floating_point() and t.element_size() == 1 or t.dtype in _UNSIGNED:
        return torch.gather(t.view(_SIGNED[t.element_size()]), -1, index).view(t.dtype)
    return torch.gather(t, -1, index)


def _sortable(t: torch.Tensor) -> torch.Tensor:
    """A key torch can sort that orders like `t`'s values."""
    if t.dtype == torch.bool:
        return t.to(torch.uint8)
    if t.is_floating_point() and t.element_size() == 1:  # float8: sort by value
        return t.to(torch.float32)
    if t.dtype in (torch.uint16, torch.uint32):  # no sort kernel: widened as unsigned, which keeps the order
        return t.view(_SIGNED[t.element_size()]).to(torch.int64) & ((1 << (8 * t.element_size())) - 1)
    if t.dtype == torch.uint64:  # the sign bit flipped: the signed order of the result is the unsigned order
        return t.view(torch.int64) ^ torch.iinfo(torch.int64).min
    return t
