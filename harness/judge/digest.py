"""A keyed digest of tensors' bytes, computed where the tensors are (on the GPU: no copy to the host).

What the judge compares digests for: a candidate's outputs on one set of inputs against another run's
(determinism), a timed launch's against the checked call's and the original's (harness.judge.timed_outputs).
A sha256 of the bytes on the host cost a device-to-host copy and about a second per GiB, on both sides, at
every verification; this digest costs a few passes over the bytes on the device.

The construction is a universal hash. The bytes are read as 16-bit half-words w_i (a zero byte pads an
odd length, and the length is part of the digest), and

    h = sum_i w_i * k_i  (mod p),   p = 2**31 - 1 (prime),

with k_i pseudo-random in [0, p), drawn from the position i and the key by the splitmix64 finaliser. For two
different byte strings of one length, the difference d_i = w_i - w'_i is below 2**16 < p in magnitude, so it
is invertible mod p, and with independent uniform keys the two digests agree with probability 1/p. Two
independent key streams are summed, so a collision has probability about 2**-62 per comparison; the key
(`Options.digest_key`) is drawn at random by the judge for each evaluation, so no kernel can be written
against it. Products stay below 2**47 and a chunk's sum below 2**63: exact in int64 on every device.

`digest(tensors, key)` hashes a list of tensors (their bytes end to end, their lengths beside the sums) into one
hex string of 64 characters, the same on the CPU and on a GPU, in about 25 kernel launches and one
synchronisation whatever the number of tensors.
"""

from __future__ import annotations

import hashlib
from typing import Iterable

import torch

P = (1 << 31) - 1
CHUNK = 1 << 23  # half-words per step: each int64 temporary of two key streams 128 MiB
_C1 = 0xBF58476D1CE4E5B9 - (1 << 64)  # splitmix64's multipliers, as signed int64
_C2 = 0x94D049BB133111EB - (1 << 64)
_GOLDEN = 0x9E3779B97F4A7C15 - (1 << 64)
_STREAMS = (0x243F6A8885A308D3, 0x13198A2E03707344)  # two independent key streams


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


def _salts(key: int) -> torch.Tensor:
    """One salt per key stream, as int64 values (a column, to broadcast over positions)."""
    salts = []
    for stream in _STREAMS:
        value = (key * 0x100000001B3 + stream) & ((1 << 64) - 1)
        salts.append(value - (1 << 64) if value >= 1 << 63 else value)
    return torch.tensor(salts, dtype=torch.int64).reshape(-1, 1)


def _halfwords(flat: torch.Tensor) -> torch.Tensor:
    """Flat uint8 bytes as non-negative int64 half-words (little-endian pairs; an odd length padded with 0)."""
    if flat.numel() % 2:
        flat = torch.cat([flat, flat.new_zeros(1)])
    pairs = flat.view(-1, 2).to(torch.int64)
    return pairs[:, 0] | (pairs[:, 1] << 8)


def _flat_bytes(tensor: torch.Tensor) -> torch.Tensor:
    return tensor.detach().contiguous().reshape(-1).view(torch.uint8)


def byte_sums(data: torch.Tensor, key: int) -> tuple[int, ...]:
    """The keyed sums mod P of the flat bytes `data` (uint8), one per key stream, both streams in one pass,
    CHUNK half-words at a time (the int64 temporaries stay a few hundred MiB whatever the data's size)."""
    salts = _salts(key).to(data.device)
    total = torch.zeros(len(_STREAMS), dtype=torch.int64, device=data.device)
    for start in range(0, data.numel(), 2 * CHUNK):
        part = _halfwords(data[start:start + 2 * CHUNK])
        first = start // 2
        positions = torch.arange(first, first + part.numel(), dtype=torch.int64, device=data.device)
        total += ((part * _keys(positions, salts)) % P).sum(dim=1) % P
    return tuple(int(v) % P for v in total.cpu().tolist())  # one synchronisation, 16 bytes


def digest(tensors: Iterable[torch.Tensor], key: int) -> str:
    """One hex digest of the bytes of `tensors` in order: their lengths and the keyed sums of their bytes laid
    end to end (one pass over all of them)."""
    flats = [_flat_bytes(t) for t in tensors]
    lengths = ",".join(str(f.numel()) for f in flats)
    if not flats:
        return hashlib.sha256(b"none").hexdigest()
    data = flats[0] if len(flats) == 1 else torch.cat(flats)
    sums = ",".join(str(s) for s in byte_sums(data, key))
    return hashlib.sha256(f"{lengths}:{sums}".encode()).hexdigest()
