"""harness.timing_link on the CPU: the judge's RemoteSide drives the candidate process's TimingServer
(harness.candidate) over two real pipes (the server on a thread here), and refuses what it cannot trust."""

from __future__ import annotations

import os
import random
import threading

import pytest
import torch

from harness.candidate.process import TimingServer
from harness.judge.paired_timing import Pair, time_view
from harness.judge.timed_outputs import LaunchCheck
from harness.judge.timings import _fetch
from harness.timing.timing_link import LinkBroken, RemoteSide, SideFailed, encode, serve, write_all
from harness.timing.timing_side import TimingSide
from tests.harness.judge.test_paired_timing_cpu import _case, _job, half_after, rowscale


@pytest.fixture
def linked(tmp_path):
    """A RemoteSide and, on a thread, the candidate's server with `launch` for case 0."""
    threads = []

    def start(launch, job):
        commands_read, commands_write = os.pipe()
        replies_read, replies_write = os.pipe()
        server = TimingServer(job, {"v": launch}, torch.device("cpu"), tmp_path)
        thread = threading.Thread(target=serve, args=(commands_read, replies_write, server.handle), daemon=True)
        thread.start()
        threads.append((thread, [commands_read, commands_write, replies_read, replies_write]))
        remote = RemoteSide(commands_write, replies_read, alive=thread.is_alive, timeout_s=30.0)
        remote.case = 0
        return remote

    yield start
    for thread, fds in threads:
        thread.join(timeout=5)
        for fd in fds:
            try:
                os.close(fd)
            except OSError:
                pass


def test_remote_side_runs_the_same_steps_as_a_local_one(linked, tmp_path):
    case = _case()
    remote = linked(rowscale, _job(case))
    assert remote.estimate(0) > 0
    remote.prepare("graph", [0, 10001, 10002])
    times = remote.sample(3)
    assert len(times) == 3 and all(t > 0 for t in times)
    local = TimingSide("orig", rowscale, case, "cpu")
    local.prepare("graph", [0, 10001, 10002])
    local.sample(1)
    assert remote.digests() == local.digests()
    values = _fetch(remote, tmp_path, case, [1, 2], torch.device("cpu"))
    assert torch.equal(values[2]["out"], local.set_args(2)["out"]) and set(values[1]) == {"out"}
    assert not (tmp_path / "timed-outputs").exists()  # read, then deleted
    remote.close()
    remote.exit()


def test_a_paired_view_over_the_link_catches_skipped_work(linked, tmp_path):
    case = _case()
    job = _job(case)
    remote = linked(half_after(4), job)
    orig = TimingSide("orig", rowscale, case, "cpu")

    def make_check(seeds):
        return LaunchCheck(case, job, "graph", seeds, None, orig.set_args,
                           lambda indices: _fetch(remote, tmp_path, case, indices, torch.device("cpu")))

    outcome = time_view(case, "graph", Pair(orig, remote), job.options, make_check, torch.device("cpu"),
                        random.Random(2))
    assert outcome.failures and outcome.failures[0].startswith("graph view, timed launch ")
    assert "NaN/Inf" in outcome.failures[0]
    remote.exit()


def test_errors_come_back_as_side_failures(linked):
    def boom(args):
        raise RuntimeError("too many resources requested for launch")
    remote = linked(boom, _job(_case()))
    with pytest.raises(SideFailed, match="too many resources") as failure:
        remote.estimate(0)
    assert failure.value.kind == "other"
    with pytest.raises(SideFailed, match="before prepare"):
        remote.sample(1)
    remote.exit()


def _fake_candidate(reply: bytes):
    """A RemoteSide whose 'candidate' answers every command with `reply`."""
    commands_read, commands_write = os.pipe()
    replies_read, replies_write = os.pipe()

    def answer():
        os.read(commands_read, 1 << 16)
        write_all(replies_write, reply)
    thread = threading.Thread(target=answer, daemon=True)
    thread.start()
    return RemoteSide(commands_write, replies_read, alive=lambda: True, timeout_s=2.0), thread


@pytest.mark.parametrize("reply", [
    encode({"op": "sample", "us": [1.0, -2.0]}),  # a negative time
    encode({"op": "sample", "us": [1.0]}),  # fewer samples than asked
    encode({"op": "sample", "us": [float("nan"), 1.0]}),  # NaN
    encode({"op": "digests", "us": [1.0, 1.0]}),  # an answer to another question
    b"not json\n",
    b"",  # nothing: the reply times out
])
def test_malformed_or_missing_replies_break_the_link(reply):
    remote, thread = _fake_candidate(reply)
    with pytest.raises(LinkBroken):
        remote.sample(2)
    thread.join(timeout=5)


def test_digests_must_be_one_hex_pair_per_set():
    remote, thread = _fake_candidate(encode({"op": "digests", "digests": [{"out": "ab", "in": "cd"}]}))
    remote.n_sets = 1
    with pytest.raises(LinkBroken, match="malformed digests"):
        remote.digests()
    thread.join(timeout=5)


def test_both_sides_prepare_and_digest_at_once_and_stay_in_step(linked):
    """Pair.both asks the remote side first and reads its reply after the local side's work: the server
    works while the local side does (its command is sent before the local side starts), and a local failure
    still reads the reply, so the next command gets its own."""
    case = _case()
    remote = linked(rowscale, _job(case))
    order: list[str] = []

    class Local(TimingSide):
        def prepare(self, *args):
            order.append("local prepare")
            return super().prepare(*args)

    sent = remote.send

    def send(op, **fields):
        order.append(f"remote {op}")
        sent(op, **fields)

    remote.send = send
    pair = Pair(Local("orig", rowscale, case, "cpu"), remote)
    info, _ = pair.both("prepare", "cold", [0, 10001], 0)
    assert order == ["remote prepare", "local prepare"] and info["input_sets"] == 2
    pair.orig.sample(1)
    remote.sample(1)
    orig, cand = pair.both("digests")
    assert orig[0] == cand[0] and len(cand) == 2

    class Failing(TimingSide):
        def digests(self):
            raise RuntimeError("the original's digest failed")

    failing = Pair(Failing("orig", rowscale, case, "cpu"), remote)
    with pytest.raises(RuntimeError, match="digest failed"):
        failing.both("digests")
    assert len(remote.sample(2)) == 2  # the digests' reply was read: this reply is the sample's
    remote.exit()


def test_the_clock_splits_both_sides_work(linked):
    case = _case()
    remote = linked(rowscale, _job(case))
    pair = Pair(TimingSide("orig", rowscale, case, "cpu"), remote)
    pair.both("prepare", "cold", [0, 10001], 0)
    pair.both("digests")
    names = set(pair.clock.rounded())
    assert {"prepare_orig_s", "prepare_cand_s", "digests_orig_s", "digests_cand_s"} <= names
    remote.exit()
