"""The keyed digest (harness.judge.digest): equal bytes agree, any changed half-word, length or key disagrees,
the stepped sums equal one pass, and the sum is the two-level keyed form."""

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


def test_changes_in_several_rows_are_seen(monkeypatch):
    """Small rows, so that the data spans many rows and steps: changes that cancel within a row's plain sum,
    or across rows at one column, still change the digest."""
    monkeypatch.setattr(keyed, "ROW", 8)
    monkeypatch.setattr(keyed, "STEP_ROWS", 3)
    base = torch.arange(100, dtype=torch.int16)
    reference = digest([base], 4)
    swapped = base.clone()
    swapped[[1, 2]] = swapped[[2, 1]]  # same row, same sum
    assert digest([swapped], 4) != reference
    across = base.clone()
    across[3] += 5
    across[11] -= 5  # same column of two rows
    assert digest([across], 4) != reference
    opposite = base.clone()
    opposite[67] = -opposite[67]
    assert digest([opposite], 4) != reference


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


def test_an_odd_offset_view_digests_as_its_copy():
    data = torch.arange(301, dtype=torch.uint8)
    assert digest([data[1:201]], 9) == digest([data[1:201].clone()], 9)


def test_steps_sum_to_the_one_pass_value(monkeypatch):
    data = torch.randn(70000).view(torch.uint8)  # 140000 half-words: two whole rows and a tail
    whole = byte_sums(data, 99)
    monkeypatch.setattr(keyed, "STEP_ROWS", 1)
    assert byte_sums(data, 99) == whole
    assert all(0 <= s < P for s in whole) and len(whole) == 2


def test_extreme_half_words_stay_exact():
    """Half-words of -32768 and 32767 over whole rows: the float64 products and sums are exact."""
    for value in (-32768, 32767):
        data = torch.full((keyed.ROW * 2 + 3,), value, dtype=torch.int16).view(torch.uint8)
        keys_a = keyed.row_keys(11, torch.device("cpu")).tolist()
        keys_b = keyed.column_keys(11, torch.arange(3, dtype=torch.int64)).tolist()
        for stream, sums in enumerate(byte_sums(data, 11)):
            rows = [value * sum(keys_a[stream]), value * sum(keys_a[stream]), value * sum(keys_a[stream][:3])]
            assert sums == sum(b * (r % P) for b, r in zip(keys_b[stream], rows)) % P


def test_the_sum_is_the_two_level_keyed_form(monkeypatch):
    """h = sum_c B_c (sum_j w[c, j] A_j mod P) mod P over signed little-endian half-words in rows of ROW
    (the last padded with zeros): checked against Python integers."""
    monkeypatch.setattr(keyed, "ROW", 4)
    monkeypatch.setattr(keyed, "STEP_ROWS", 2)
    words = [0x0102, 0x7FFF, -1, 12, -32768, 5, 0, 9, 77, -300, 4]
    data = torch.tensor(words, dtype=torch.int16).view(torch.uint8)
    keys_a = keyed.row_keys(5, torch.device("cpu")).tolist()
    keys_b = keyed.column_keys(5, torch.arange(3, dtype=torch.int64)).tolist()
    assert all(0 <= k < P for row in keys_a + keys_b for k in row) and keys_a[0] != keys_a[1]
    padded = words + [0]
    for stream, sums in enumerate(byte_sums(data, 5)):
        inner = [sum(w * a for w, a in zip(padded[4 * c:4 * c + 4], keys_a[stream])) % P for c in range(3)]
        assert sums == sum(b * i for b, i in zip(keys_b[stream], inner)) % P


def test_many_groups_at_once_match_one_by_one():
    groups = [[torch.randn(100), torch.arange(7, dtype=torch.uint8)], [], [torch.zeros(3)], [torch.ones(70000)]]
    assert keyed.digests(groups, 5) == [digest(g, 5) for g in groups]
    assert keyed.digests([], 5) == []


def test_cached_column_keys_grow_to_the_same_values(monkeypatch):
    """The column keys are kept per key and grown as longer data comes: a long digest after a short one is the
    digest a fresh cache gives."""
    monkeypatch.setattr(keyed, "ROW", 4)
    monkeypatch.setattr(keyed, "_cached", {})
    digest([torch.arange(10, dtype=torch.int16)], 6)  # 3 rows: the first keys kept
    long = torch.arange(1000, dtype=torch.int16)  # 250 rows: the kept keys grow
    grown = digest([long], 6)
    assert keyed._cached[(6, "cpu", 4)]["columns"].shape[0] >= 250
    monkeypatch.setattr(keyed, "_cached", {})
    assert digest([long], 6) == grown
    keys_b = keyed.column_keys(6, torch.arange(250, dtype=torch.int64)).T
    assert torch.equal(keyed._cached[(6, "cpu", 4)]["columns"][:250], keys_b)


def test_small_groups_hashed_together_give_each_ones_own_sums(monkeypatch):
    """Groups of one row or less share one product (`_all_sums`): each gets what `_sums` gives it alone, and the
    Python-integer form for one row, with larger groups, empty ones and odd lengths mixed in."""
    monkeypatch.setattr(keyed, "ROW", 4)
    monkeypatch.setattr(keyed, "STEP_ROWS", 3)  # several blocks of small groups
    rng = random.Random(3)
    datas = [torch.tensor([rng.randrange(256) for _ in range(n)], dtype=torch.uint8)
             for n in (0, 1, 2, 7, 8, 9, 3, 8, 30, 5, 8, 0, 17)]
    together = keyed._all_sums(datas, 9)
    assert together.shape == (len(datas), 2)
    for data, sums in zip(datas, together.tolist()):
        assert sums == keyed._sums(data, 9).tolist()
    keys_a = keyed.row_keys(9, torch.device("cpu")).tolist()
    keys_b = keyed.column_keys(9, torch.arange(1, dtype=torch.int64)).tolist()
    for data, sums in zip(datas, together.tolist()):
        if data.numel() > 8:
            continue
        padded = data.tolist() + [0] * (8 - data.numel())
        words = [int.from_bytes(bytes(padded[k:k + 2]), "little", signed=True) for k in range(0, 8, 2)]
        for stream in range(2):
            inner = sum(w * a for w, a in zip(words, keys_a[stream])) % P
            assert sums[stream] == keys_b[stream][0] * inner % P
    groups = [[d] for d in datas] + [[datas[3], datas[8]], []]
    assert keyed.digests(groups, 9) == [digest(g, 9) for g in groups]
