"""The keyed digest (harness.judge.digest): equal bytes agree, any changed half-word, length or key disagrees,
and the chunked sums equal one pass."""

from __future__ import annotations

import random

import pytest
import torch

from harness.judge import digest as keyed
from harness.judge.digest import P, byte_sums, digest


def test_equal_bytes_give_equal_digests_and_the_key_matters():
    a = torch.randn(33, 17, dtype=torch.bfloat16)
    assert digest([a], 7) == digest([a.clone()], 7)
    assert digest([a], 7) != digest([a], 8)
    assert len(digest([a], 7)) == 64 and int(digest([a], 7), 16) >= 0  # 64 hex characters, as the link expects


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.int8, torch.uint8])
def test_any_single_change_is_seen(dtype):
    rng = random.Random(0)
    base = torch.arange(4099, dtype=torch.int64).remainder(120).to(dtype)
    reference = digest([base], 12345)
    flat = base.view(-1).view(torch.uint8)
    for _ in range(40):
        changed = flat.clone()
        position, bit = rng.randrange(changed.numel()), rng.randrange(8)
        changed[position] ^= 1 << bit  # low and high bits alike: no bit of a half-word is left out
        assert digest([changed.view(dtype)], 12345) != reference


def test_lengths_and_order_of_tensors_count():
    odd = torch.arange(7, dtype=torch.uint8)
    assert digest([odd], 0) != digest([odd[:6]], 0)  # a zero pad byte is not the same as a zero byte
    padded = torch.cat([odd, odd.new_zeros(1)])
    assert digest([odd], 0) != digest([padded], 0)
    a, b = torch.ones(8), torch.zeros(8)
    assert digest([a, b], 3) != digest([b, a], 3)
    short, long = torch.arange(4, dtype=torch.uint8), torch.arange(4, 12, dtype=torch.uint8)
    assert digest([short, long], 3) != digest([torch.arange(6, dtype=torch.uint8), torch.arange(6, 12, dtype=torch.uint8)], 3)
    assert digest([], 3) != digest([torch.zeros(0)], 3)


def test_chunks_sum_to_the_one_pass_value(monkeypatch):
    data = torch.randn(5000).view(torch.uint8)
    whole = byte_sums(data, 99)
    monkeypatch.setattr(keyed, "CHUNK", 777)
    assert byte_sums(data, 99) == whole
    assert all(0 <= s < P for s in whole) and len(whole) == 2


def test_the_sum_is_the_keyed_linear_form():
    """h = sum_i w_i k_i mod P over little-endian half-words: checked against Python integers."""
    data = torch.tensor([0x0102, 0x7FFF, -1, 12], dtype=torch.int16).view(torch.uint8)
    words = [0x0102, 0x7FFF, 0xFFFF, 12]
    keys = keyed._keys(torch.arange(4, dtype=torch.int64), keyed._salts(5)).tolist()
    assert all(0 <= k < P for row in keys for k in row) and len(set(keys[0])) == 4 and keys[0] != keys[1]
    for stream, sums in enumerate(byte_sums(data, 5)):
        assert sums == sum(w * k for w, k in zip(words, keys[stream])) % P
