"""harness.paired_timing and harness.timed_outputs on the CPU: the ABBA turns, the candidate held while the
original samples, and every timed launch verified (a launch that skips work fails its case, naming the view
and the launch). Both sides are local TimingSides with Python kernels; the GPU half is tests/adversarial."""

from __future__ import annotations

import random

import pytest
import torch

from harness.job import BuildBase, Case, Job, Options, Variant
from harness.judge.correctness import output_digest
from harness.judge.inputs import make_inputs, poison_outputs
from harness.judge.paired_timing import (
    COLD_SETS,
    COLD_TURN,
    MAX_GRAPH_SETS,
    Pair,
    abba,
    cold_sets,
    graph_sets,
    minimum_rounds,
    sample_block,
    time_view,
)
from harness.judge.timed_outputs import Checked, LaunchCheck
from harness.timing.placement import BLOCKS
from harness.timing.stats import Stats
from harness.timing.timing_side import TimingSide
from tests.harness.timing.test_timed_sets_cpu import rowscale_case

ROWS, COLS = 8, 16


def _case(in_place: bool = False) -> Case:
    return rowscale_case(in_place, ROWS, COLS)


def _job(case: Case, seeds: tuple[int, ...] = (0, 1)) -> Job:
    return Job(name="rs", entry="rs", kernel_file="rs.cuh", variants={"v": Variant("v", [["rs", "R::run"]])},
               build=BuildBase(source_root="/src", include_dirs=[], cuda_files=["rs.cuh"]), cases=[case],
               tolerance={"float32": {"atol": 1e-5, "rtol": 1e-5, "floor": 1e-6}},
               options=Options(seeds=list(seeds), budget_ms_per_case=5.0))


def rowscale(args):
    x, w, out = args
    out.copy_(x * w)


def half_after(calls: int):
    """Whole rows for the first `calls` calls, then only the first half: the rest keeps the poison."""
    count = {"n": 0}

    def run(args):
        count["n"] += 1
        x, w, out = args
        rows = x.shape[0] if count["n"] <= calls else x.shape[0] // 2
        out[:rows].copy_(x[:rows] * w)
    return run


def off_by_ulp(args):
    x, w, out = args
    out.copy_(x * w)
    out.view(torch.int32)[:, 0] ^= 1  # within tolerance, never bit-identical


def checked_for(case: Case, launch, *, bit_exact: bool, deterministic: bool = True) -> Checked:
    args = poison_outputs(make_inputs(case, 0, "cpu"), case.args)
    launch([args["x"], args["w"], args["out"]])
    return Checked(digest=output_digest(case, args), bit_exact=bit_exact, deterministic_orig=True,
                   deterministic_cand=deterministic)


def run_view(view: str, cand_launch, checked: Checked | None, *, orig_launch=rowscale, case: Case | None = None,
             pair_factory=Pair):
    case = case or _case()
    job = _job(case)
    orig, cand = TimingSide("orig", orig_launch, case, "cpu"), TimingSide("cand", cand_launch, case, "cpu")
    fetched: list[list[int]] = []

    def fetch(indices):
        fetched.append(list(indices))
        return {i: cand.set_args(i) for i in indices}

    def make_check(seeds):
        return LaunchCheck(case, job, view, seeds, checked, orig.set_args, fetch)

    outcome = time_view(case, view, pair_factory(orig, cand), job.options, make_check, torch.device("cpu"),
                        random.Random(1))
    return outcome, fetched


@pytest.mark.parametrize("view", ["graph", "cold"])
def test_an_honest_candidate_is_timed_and_verified(view):
    outcome, fetched = run_view(view, rowscale, checked_for(_case(), rowscale, bit_exact=True))
    assert outcome.failures == [] and fetched == []
    entry = outcome.entry
    assert Stats.from_dict(entry["orig"]).n >= 1 and Stats.from_dict(entry["cand"]).n >= 1
    info = entry["info"]
    ends = [f"the last sample of block {b}" for b in range(1, BLOCKS)] + ["the last sample"]
    assert [label for label in info["verified"] if label.startswith("the last")] == ends, info["verified"]
    assert len(info["verified"]) in (BLOCKS, BLOCKS + 1)  # and one round drawn at random, unless it was a last
    assert info["blocks"] == len(info["block_ratios"]) == BLOCKS and all(r > 0 for r in info["block_ratios"])
    if view == "graph":
        assert info["input_sets"] == info["launches_per_sample"] > 1 and info["estimate_us"] > 0
    else:  # one launch per sample, cycling through COLD_SETS sets
        assert info["input_sets"] == COLD_SETS and info["launches_per_sample"] == 1


@pytest.mark.parametrize("view", ["graph", "cold"])
def test_a_launch_that_skips_work_once_timed_fails_naming_the_view_and_launch(view):
    outcome, _ = run_view(view, half_after(3), checked_for(_case(), rowscale, bit_exact=True))
    assert outcome.failures, outcome.entry
    assert outcome.failures[0].startswith(f"{view} view, timed launch ")
    assert "(inputs of seed 0)" in outcome.failures[0] or "(inputs of seed 100" in outcome.failures[0]


def test_a_candidate_that_differs_within_tolerance_is_compared_by_value():
    checked = checked_for(_case(), off_by_ulp, bit_exact=False)
    outcome, fetched = run_view("graph", off_by_ulp, checked)
    assert outcome.failures == [] and fetched  # the values were fetched and passed
    assert len(fetched) == 1  # the same digests at the last sample are not fetched again
    strict = Checked(digest=checked.digest, bit_exact=True, deterministic_orig=True, deterministic_cand=True)
    outcome, _ = run_view("graph", off_by_ulp, strict)
    assert outcome.failures and "bit for bit" in outcome.failures[0]


def test_the_first_set_must_give_the_checked_outputs():
    checked = checked_for(_case(), rowscale, bit_exact=False)
    checked.digest = "0" * 64  # the checked call gave something else on these inputs
    outcome, _ = run_view("cold", rowscale, checked)
    assert any("behaves differently when timed" in f for f in outcome.failures)


def test_skipped_rows_fail_by_value_even_when_nothing_was_checked_bitwise():
    outcome, _ = run_view("cold", half_after(2), None)  # the original against itself: values only
    assert outcome.failures and "NaN/Inf" in outcome.failures[0]


def test_writing_a_read_only_input_while_timed_fails():
    def scribbles(args):
        rowscale(args)
        args[0][0, 0] = 0.0
    outcome, _ = run_view("cold", scribbles, None)
    assert any("changed a read-only input" in f for f in outcome.failures)


def test_in_place_skipping_of_own_results_is_undone_by_the_restore():
    from tests.harness.timing.test_timed_sets_cpu import SkipsOwnResults

    def scale(args):
        args[0].mul_(args[1])
    skipper = SkipsOwnResults()
    outcome, _ = run_view("graph", skipper, None, orig_launch=scale, case=_case(in_place=True))
    assert outcome.failures == [] and skipper.skipped == 0


def test_a_side_that_raises_gives_an_error_entry():
    def boom(args):
        raise RuntimeError("launch failed")
    outcome, _ = run_view("cold", boom, None)
    assert outcome.entry == {"error": "launch failed", "side": None, "kind": "other"}


class RecordingPause:
    def __init__(self, log):
        self.stopped, self.log = False, log

    def stop(self):
        self.stopped = True
        self.log.append("stop")

    def resume(self):
        if self.stopped:
            self.log.append("resume")
        self.stopped = False


class RecordingQuiet:
    waited_s, bound_us = 0.0, 10.0

    def __init__(self, log):
        self.log = log

    def wait(self):
        self.log.append("quiet")
        return 0.0


def test_the_candidate_is_stopped_and_the_gpu_quiet_whenever_the_original_samples():
    log: list[str] = []
    pause = RecordingPause(log)

    class Held(TimingSide):  # the original: samples only while the candidate is stopped
        def sample(self, count):
            assert pause.stopped and log[-1] == "quiet"
            log.append(f"orig x{count}")
            return super().sample(count)

    class Remote(TimingSide):  # the candidate: every command resumes it first (RemoteSide.before_call)
        def _resumed(self):
            pause.resume()
            assert not pause.stopped

        def sample(self, count):
            self._resumed()
            log.append(f"cand x{count}")
            return super().sample(count)

        def digests(self):
            self._resumed()
            return super().digests()

    case = _case()
    job = _job(case)
    orig, cand = Held("orig", rowscale, case, "cpu"), Remote("cand", rowscale, case, "cpu")
    pair = Pair(orig, cand, pause, RecordingQuiet(log))
    outcome = time_view(case, "cold", pair, job.options,
                        lambda seeds: LaunchCheck(case, job, "cold", seeds, None, orig.set_args, lambda i: {}),
                        torch.device("cpu"), random.Random(0))
    assert outcome.failures == []
    samples = [entry for entry in log if entry.startswith(("orig", "cand"))]
    t = COLD_TURN  # cold rounds give each side COLD_TURN samples
    assert samples[:4] == [f"orig x{t}", f"cand x{2 * t}", f"orig x{2 * t}", f"cand x{2 * t}"]  # o c | c o | o c
    assert log[:3] == ["stop", "quiet", f"orig x{t}"]


def test_turns_alternate_abba_and_merge():
    assert abba(0, 3) == [("orig", 1), ("cand", 2), ("orig", 2), ("cand", 1)]
    assert abba(1, 2) == [("cand", 1), ("orig", 1)]
    assert abba(0, 3, 4) == [("orig", 4), ("cand", 8), ("orig", 8), ("cand", 4)]  # never longer than COLD_SETS


def test_a_converged_block_stops_at_its_minimum_not_at_the_next_batch():
    class Constant:  # every sample the same: the stop rule holds as soon as the minimum is reached
        def sample(self, count):
            return [5.0] * count

        def digests(self):
            return []

    class NoCheck:
        def verify(self, label, orig, cand):
            return []

    options = _job(_case()).options
    for min_samples, per_round, rounds in ((10, 1, 10), (100, COLD_TURN, 26), (9, 1, 10), (3, 1, 4)):
        assert minimum_rounds(min_samples, per_round) == rounds
        verified: list[str] = []
        taken, stop = sample_block(Pair(Constant(), Constant()), options, NoCheck(), min_samples, None, 0, 1, [],
                                    verified, per_round)
        assert stop == "converged" and taken["rounds"] == rounds and verified == ["the last sample"]
        assert len(taken["orig"]) == len(taken["cand"]) == rounds * per_round >= min_samples


def test_cold_sets_fit_the_memory_and_a_turn_never_outgrows_them():
    assert cold_sets(1 << 20, 1 << 40) == COLD_SETS == 2 * COLD_TURN
    assert cold_sets(1 << 30, 3 << 30) == 3 and cold_sets(1 << 40, 1 << 30) == 1


def test_graph_sets_fill_the_replay_within_memory():
    assert graph_sets(5.0, 1000, 1 << 30) == 100  # 500 us of 5 us launches
    assert graph_sets(1000.0, 1000, 1 << 30) == 1
    assert graph_sets(5.0, 1 << 20, 10 << 20) == 10  # bounded by memory
    assert graph_sets(0.001, 1, 1 << 40) == MAX_GRAPH_SETS
    assert graph_sets(5.0, 1 << 40, 1 << 30) == 1


@pytest.mark.parametrize("period,full", [(3, True), (8, True), (2, False), (8, False)])
def test_a_cold_cheat_that_counts_its_launches_is_caught(period, full):
    """A kernel that counts its launches (and sees each placement's new sets, so it does full work on the
    warm-ups) computes every row only on one launch in `period` (`full`), or skips half its rows on one launch
    in `period`: a cold side cycles through COLD_SETS sets, so every verification sees the last COLD_SETS
    launches, whichever turn they came from."""
    state = {"launches": 0, "warmups": 0}

    def cheater(args):
        state["launches"] += 1
        x, w, out = args
        after = state["launches"] - state["warmups"]
        honest = after <= 0 or ((after % period == 0) if full else (after % period != 0))
        if honest:
            out.copy_(x * w)
        else:
            half = x.shape[0] // 2
            out[:half].copy_(x[:half] * w)  # the other half keeps the poison

    class Counting(TimingSide):
        def prepare(self, view, seeds, layout=0):
            state["launches"], state["warmups"] = 0, max(3, len(seeds))
            return super().prepare(view, seeds, layout)

    case = _case()
    job = _job(case)
    caught = 0
    for seed in range(8):
        orig, cand = TimingSide("orig", rowscale, case, "cpu"), Counting("cand", cheater, case, "cpu")

        def make(seeds, orig=orig, cand=cand):
            return LaunchCheck(case, job, "cold", seeds, checked_for(case, rowscale, bit_exact=True), orig.set_args,
                               lambda indices: {i: cand.set_args(i) for i in indices})

        outcome = time_view(case, "cold", Pair(orig, cand), job.options, make, torch.device("cpu"),
                            random.Random(seed))
        caught += bool(outcome.failures)
    assert caught == 8


def test_raw_samples_are_kept_per_side_and_block_only_when_asked(monkeypatch):
    from harness.timing import modes

    outcome, _ = run_view("cold", rowscale, checked_for(_case(), rowscale, bit_exact=True))
    assert "raw_us" not in outcome.entry["info"]
    monkeypatch.setattr(modes, "RAW_SAMPLES", True)
    outcome, _ = run_view("cold", rowscale, checked_for(_case(), rowscale, bit_exact=True))
    raw = outcome.entry["info"]["raw_us"]
    for side in ("orig", "cand"):
        assert len(raw[side]) == BLOCKS
        assert sum(len(block) for block in raw[side]) == Stats.from_dict(outcome.entry[side]).n
        assert all(v > 0 for block in raw[side] for v in block)
