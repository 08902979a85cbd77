"""A keyed digest of tensors' bytes, computed where the tensors are (on the GPU: no copy to the host).

What the judge compares digests for: a candidate's outputs on one set of inputs against another run's
(determinism), a timed launch's against the checked call's and the original's (harness.judge.timed_outputs).
A sha256 of the bytes on the host cost a device-to-host copy and about a second per GiB, on both sides, at
every verification; this digest costs about one read of the bytes on the device.

The construction is a two-level universal hash. The bytes are read as signed 16-bit half-words (a zero byte
pads an odd length, zero half-words pad the last row, and the lengths are part of the digest), laid out in
rows of ROW half-words, w[c, j], and

    h = sum_c B_c * (sum_j w[c, j] * A_j mod p)  (mod p),   p = 2**31 - 1 (prime),

with the row keys A_j and the column keys B_c pseudo-random in [0, p), drawn from j (or c) and the key by the
splitmix64 finaliser. For two different byte strings of one length, the differences d[c, j] = w - w' are
below 2**16 < p in magnitude, so each non-zero one is invertible mod p: a non-zero row's inner sum is 0 with
probability 1/p over A, and given a non-zero inner sum, the outer sum is 0 with probability 1/p over B. So two
strings collide with probability at most 2/p per key stream; two independent streams are used (about 2**-60
per comparison). The key (`Options.digest_key`) is drawn at random by the judge for each evaluation, so no
kernel can be written against it.

Exact arithmetic: a row's inner sum is one float64 matrix product of the half-words with A split into 16-bit
halves; every product is below 2**31 and every partial sum below 2**47 in magnitude, integers that float64
holds exactly whatever order the sums take (on the CPU and on a GPU alike). The rest is int64.

`digest(tensors, key)` hashes a list of tensors (their bytes end to end, their lengths beside the sums) into one
hex string of 64 characters, the same on the CPU and on a GPU, in a few kernel launches per STEP_ROWS rows
and one synchronisation whatever the number of tensors; `digests(groups, key)` hashes many such lists with one
synchronisation for all (a verification digests every timed set at once), the lists of one row or less all in
one product (a decode case's sets: a few kernel launches for all of them, not a dozen for each).
"""

from __future__ import annotations

import hashlib
from typing import Iterable

import torch

P = (1 << 31) - 1
ROW = 1 << 16  # half-words per row
STEP_ROWS = 256  # rows per step: a float64 temporary of 128 MiB
_C1 = 0xBF58476D1CE4E5B9 - (1 << 64)  # splitmix64's multipliers, as signed int64
_C2 = 0x94D049BB133111EB - (1 << 64)
_GOLDEN = 0x9E3779B97F4A7C15 - (1 << 64)
_STREAMS = (0x243F6A8885A308D3, 0x13198A2E03707344)  # two independent key streams
_COLUMNS = 0x452821E638D01377  # separates the column keys B from the row keys A
# (key, device, ROW) -> {"halves": A's 16-bit halves, float64 (ROW, 2 x streams); "columns": B, int64 (rows, streams)}
_cached: dict[tuple[int, str, int], dict[str, torch.Tensor]] = {}


def _lsr(x: torch.Tensor, shift: int) -> torch.Tensor:
    """Logical right shift of int64 values (torch's >> is arithmetic)."""
    return (x >> shift) & ((1 << (64 - shift)) - 1)


def _keys(positions: torch.Tensor, salts: torch.Tensor) -> torch.Tensor:
    """Pseudo-random keys in [0, P): one row per salt (a column of int64), one column per position (int64),
    from the splitmix64 finaliser of position and salt."""
    z = positions * _GOLDEN + salts  # wraps modulo 2**64, as splitmix64 does
    z = (z ^ _lsr(z, 30)) * _C1
    z = (z ^ _lsr(z, 27)) * _C2
    z = z ^ _lsr(z, 31)
    return _lsr(z, 33) % P


def _salts(key: int, extra: int = 0) -> torch.Tensor:
    """One salt per key stream, as int64 values (a column, to broadcast over positions)."""
    salts = []
    for stream in _STREAMS:
        value = (key * 0x100000001B3 + stream + extra) & ((1 << 64) - 1)
        salts.append(value - (1 << 64) if value >= 1 << 63 else value)
    return torch.tensor(salts, dtype=torch.int64).reshape(-1, 1)


def row_keys(key: int, device: torch.device) -> torch.Tensor:
    """A_j (j < ROW) of every stream (int64, one row per stream)."""
    return _keys(torch.arange(ROW, dtype=torch.int64, device=device), _salts(key).to(device))


def column_keys(key: int, rows: torch.Tensor) -> torch.Tensor:
    """B_c of every stream for the row numbers `rows` (int64, one row per stream)."""
    return _keys(rows, _salts(key, _COLUMNS).to(rows.device))


def _keys_of(key: int, device: torch.device) -> dict[str, torch.Tensor]:
    """The keys of `key` on `device`, made once (a few evaluations' keys are kept)."""
    entry = _cached.get((key, str(device), ROW))
    if entry is None:
        if len(_cached) >= 4:
            _cached.clear()
        keys = row_keys(key, device)
        halves = [part for stream in keys for part in (stream & 0xFFFF, stream >> 16)]
        entry = {"halves": torch.stack(halves, dim=1).to(torch.float64),
                 "columns": torch.zeros(0, len(_STREAMS), dtype=torch.int64, device=device)}
        _cached[(key, str(device), ROW)] = entry
    return entry


def _column_keys_upto(key: int, device: torch.device, rows: int) -> torch.Tensor:
    """B_c for c < `rows`, one column per stream (int64, (rows, streams)), grown by doubling as data grows."""
    entry = _keys_of(key, device)
    if entry["columns"].shape[0] < rows:
        count = max(rows, 2 * entry["columns"].shape[0], 64)
        entry["columns"] = column_keys(key, torch.arange(count, dtype=torch.int64, device=device)).T.contiguous()
    return entry["columns"][:rows]


def _halfwords(flat: torch.Tensor) -> torch.Tensor:
    """Flat uint8 bytes as signed 16-bit half-words (little-endian pairs; an odd length padded with 0)."""
    if flat.numel() % 2:
        flat = torch.cat([flat, flat.new_zeros(1)])
    elif flat.storage_offset() % 2:
        flat = flat.clone()  # a view of int16 needs an even offset
    return flat.view(torch.int16)


def byte_sums(data: torch.Tensor, key: int) -> tuple[int, ...]:
    """The keyed sums mod P of the flat bytes `data` (uint8), one per key stream."""
    return tuple(int(v) for v in _sums(data, key).cpu().tolist())  # one synchronisation, 16 bytes


def _sums(data: torch.Tensor, key: int) -> torch.Tensor:
    """byte_sums as a tensor where `data` is, STEP_ROWS rows of ROW half-words at a time (the temporaries stay
    a few hundred MiB whatever the data's size); nothing waits for the device."""
    words = _halfwords(data)
    halves = _keys_of(key, data.device)["halves"]
    full = words.numel() // ROW
    steps = [(first, words[first * ROW:min(first + STEP_ROWS, full) * ROW].view(-1, ROW))
             for first in range(0, full, STEP_ROWS)]
    if words.numel() > full * ROW:  # the last row, padded with zero half-words
        tail = words.new_zeros(1, ROW)
        tail[0, :words.numel() - full * ROW] = words[full * ROW:]
        steps.append((full, tail))
    columns = _column_keys_upto(key, data.device, sum(block.shape[0] for _, block in steps))
    total = torch.zeros(len(_STREAMS), dtype=torch.int64, device=data.device)
    for first, block in steps:
        inner = (block.to(torch.float64) @ halves).to(torch.int64) % P  # (rows, 2 x streams), exact
        inner = (inner[:, 0::2] + (inner[:, 1::2] << 16)) % P  # (rows, streams): sum_j w[c, j] A_j mod P
        total = (total + (inner * columns[first:first + block.shape[0]] % P).sum(dim=0)) % P
    return total


def _all_sums(datas: list[torch.Tensor], key: int) -> torch.Tensor:
    """`_sums` of every flat byte tensor of `datas` (one row each, a column per stream). Data of one row or less
    (most of a decode case's sets) is laid out one to a row of a block and hashed by one product for all,
    STEP_ROWS rows at a time: the same values, as such data is its own row 0."""
    rows: list[torch.Tensor | None] = [None] * len(datas)
    small = [i for i, data in enumerate(datas) if data.numel() <= 2 * ROW]
    for i, data in enumerate(datas):
        if data.numel() > 2 * ROW:
            rows[i] = _sums(data, key)
    for first in range(0, len(small), STEP_ROWS):
        chosen = small[first:first + STEP_ROWS]
        for i, value in zip(chosen, _one_row_sums([datas[i] for i in chosen], key)):
            rows[i] = value
    return torch.stack([row for row in rows if row is not None])


def _one_row_sums(datas: list[torch.Tensor], key: int) -> torch.Tensor:
    """`_sums` of flat byte tensors of at most one row each, by one product: row r of a zeroed block holds the
    bytes of `datas[r]` (an odd length's last byte pairs with a zero, as `_halfwords` pads it). The block is as
    wide as the longest of them, not a whole row: the zero half-words past it add nothing to any sum."""
    device = datas[0].device
    width = max(2, max(data.numel() for data in datas))
    width += width % 2  # whole half-words
    block = torch.zeros(len(datas), width, dtype=torch.uint8, device=device)
    sizes = torch.tensor([data.numel() for data in datas], dtype=torch.int64, device=device)
    total = sum(data.numel() for data in datas)
    if total:  # byte k of datas[r] goes to row r, column k: made on the device (no host-sized index)
        starts = torch.cumsum(sizes, 0) - sizes
        rows = torch.arange(len(datas), dtype=torch.int64, device=device) * width
        shift = torch.repeat_interleave(rows - starts, sizes, output_size=total)
        block.view(-1)[torch.arange(total, dtype=torch.int64, device=device) + shift] = torch.cat(datas)
    halves = _keys_of(key, device)["halves"][:width // 2]
    inner = (block.view(torch.int16).to(torch.float64) @ halves).to(torch.int64) % P
    inner = (inner[:, 0::2] + (inner[:, 1::2] << 16)) % P  # (rows, streams): each row's sum_j w[0, j] A_j mod P
    return inner * _column_keys_upto(key, device, 1) % P  # times B_0


def digest(tensors: Iterable[torch.Tensor], key: int) -> str:
    """One hex digest of the bytes of `tensors` in order: their lengths and the keyed sums of their bytes laid
    end to end (one pass over all of them)."""
    return digests([list(tensors)], key)[0]


def digests(groups: list[list[torch.Tensor]], key: int) -> list[str]:
    """`digest` of every group of tensors, with one synchronisation for all of them (the groups' tensors on
    one device)."""
    flats = [[_flat_bytes(t) for t in group] for group in groups]
    datas = [f[0] if len(f) == 1 else torch.cat(f) for f in flats if f]
    values = iter(_all_sums(datas, key).cpu().tolist() if datas else [])
    out = []
    for group in flats:
        if not group:
            out.append(hashlib.sha256(b"none").hexdigest())
            continue
        lengths = ",".join(str(f.numel()) for f in group)
        text = ",".join(str(int(v)) for v in next(values))
        out.append(hashlib.sha256(f"{lengths}:{text}".encode()).hexdigest())
    return out


def _flat_bytes(tensor: torch.Tensor) -> torch.Tensor:
    return tensor.detach().contiguous().reshape(-1).view(torch.uint8)
