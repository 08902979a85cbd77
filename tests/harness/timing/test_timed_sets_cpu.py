"""harness.timed_sets on the CPU: timed launches get checked inputs, restored before every sample, so an
in-place kernel is never timed on its own outputs (the GPU half: tests/adversarial/test_timed_work.py)."""

from __future__ import annotations

import torch

from harness.job import ArgSpec, Case
from harness.judge.correctness import output_digest
from harness.judge.inputs import make_inputs
from harness.timing.timed_sets import TimedSets, read_only_names, set_footprint, timing_seeds, written_names
from harness.timing.timing_side import TimingSide

ROWS, COLS = 6, 8


def rowscale_case(in_place: bool = False, rows: int = ROWS, cols: int = COLS) -> Case:
    """out = x * w, or x *= w in place (float32)."""
    args = [ArgSpec("x", "tensor", "inout" if in_place else "in", [rows, cols], "float32"),
            ArgSpec("w", "tensor", "in", [cols], "float32")]
    if not in_place:
        args.append(ArgSpec("out", "tensor", "out", [rows, cols], "float32"))
    return Case(id=f"rowscale{'_inplace' if in_place else ''}/rows={rows}", band="decode", label="t", dtype="float32",
                dims={"rows": rows, "cols": cols}, variant="v", bytes=3 * rows * cols * 4, args=args)


def scale_in_place(args):
    x, w = args
    x.mul_(w)


class SkipsOwnResults:
    """x *= w, but rows that already hold a result it wrote (remembered by their bytes) are left alone: the
    in-place own-result skipping of tests/adversarial x_inplace_skips_own_result, in Python."""

    def __init__(self) -> None:
        self.written: set[bytes] = set()
        self.skipped = 0

    def __call__(self, args) -> None:
        x, w = args
        for row in range(x.shape[0]):
            if x[row].numpy().tobytes() in self.written:
                self.skipped += 1
                continue
            x[row].mul_(w)
            self.written.add(x[row].numpy().tobytes())


def test_seeds_start_with_the_first_checked_seed():
    assert timing_seeds([7, 8], 3) == [7, 10001, 10002]
    assert timing_seeds([], 1) == [0] and timing_seeds([3], 0) == [3]


def test_roles_and_footprint():
    case = rowscale_case()
    assert written_names(case) == ["out"] and read_only_names(case) == ["x", "w"]
    assert set_footprint(case) == (2 * ROWS * COLS + COLS) * 4 + ROWS * COLS * 4  # every tensor + out's pristine copy
    assert written_names(rowscale_case(in_place=True)) == ["x"]


def test_sets_are_checked_inputs_with_poisoned_outputs():
    case = rowscale_case()
    sets = TimedSets(case, [0, 10001], "cpu")
    assert len(sets) == 2
    assert torch.equal(sets.inputs[0]["x"], make_inputs(case, 0, "cpu")["x"])  # what the checked call of seed 0 saw
    assert not torch.equal(sets.inputs[0]["x"], sets.inputs[1]["x"])
    assert sets.inputs[0]["out"].isnan().all()
    sets.inputs[0]["out"].zero_()
    sets.restore()
    assert sets.inputs[0]["out"].isnan().all()  # poisoned again before every sample


def test_restore_means_an_in_place_kernel_is_never_timed_on_its_own_outputs():
    case = rowscale_case(in_place=True)
    drawn = make_inputs(case, 0, "cpu")["x"].clone()
    skipper = SkipsOwnResults()
    side = TimingSide("cand", skipper, case, "cpu")
    side.prepare("cold", [0])
    side.sample(20)
    assert skipper.skipped == 0  # every sample started from the drawn inputs
    assert torch.equal(side.set_args(0)["x"], drawn * make_inputs(case, 0, "cpu")["w"])
    side.sets.restore()
    assert torch.equal(side.set_args(0)["x"], drawn)

    unrestored = SkipsOwnResults()  # the same loop without the restore: the kernel skips every row it wrote
    side = TimingSide("cand", unrestored, case, "cpu")
    side.prepare("cold", [0])
    side.sets.restore = lambda index=None: None
    side.sample(20)
    assert unrestored.skipped >= 19 * ROWS


def test_digests_cover_outputs_and_read_only_inputs():
    case = rowscale_case()
    side = TimingSide("orig", lambda a: a[2].copy_(a[0] * a[1]), case, "cpu")
    side.prepare("graph", [0, 10001, 10002])
    side.sample(1)
    digests = side.digests()
    assert len(digests) == 3 and len({d["out"] for d in digests}) == 3
    assert digests[0]["out"] == output_digest(case, side.set_args(0))
    before = digests[1]["in"]
    side.set_args(1)["x"][0, 0] += 1.0
    assert side.digests()[1]["in"] != before


def test_a_side_that_reuses_digests_gives_each_seed_the_digest_it_gave_first():
    case = rowscale_case()
    calls = []

    def multiply(args):
        calls.append(1)
        args[2].copy_(args[0] * args[1])

    fresh = TimingSide("cand", multiply, case, "cpu")
    reusing = TimingSide("orig", multiply, case, "cpu", reuse_digests=True)
    for side in (fresh, reusing):
        side.prepare("graph", [0, 10001, 10002], layout=3)
        side.sample(1)
    first = reusing.digests()
    assert first == fresh.digests()
    # a later block of the same view, placed anew: the seeds already digested are not digested again
    for side in (fresh, reusing):
        side.prepare("graph", [0, 10001, 10002], layout=5)
        side.sample(1)
    assert reusing.digests() == fresh.digests() == first
    # the cold view: its own digests (a kernel may run otherwise when captured), then reused within it
    for side in (fresh, reusing):
        side.prepare("cold", [0, 10001, 10002, 10003], layout=7)
        side.sample(4)
    assert reusing.digests() == fresh.digests()
    assert sorted(reusing.reused) == [("cold", 0), ("cold", 10001), ("cold", 10002), ("cold", 10003),
                                      ("graph", 0), ("graph", 10001), ("graph", 10002)]
    # what the sets hold now is not digested again: a changed output is seen by the fresh side only
    for side in (fresh, reusing):
        side.set_args(0)["out"][0, 0] += 1.0
    assert fresh.digests()[0] != first[0] and reusing.digests()[0] == first[0]


def test_digests_of_chosen_sets_are_those_of_every_set():
    case = rowscale_case()
    sets = TimedSets(case, [0, 10001, 10002], "cpu")
    every = sets.digests()
    assert sets.digests([2, 0]) == [every[2], every[0]]
    assert sets.digests([]) == []
