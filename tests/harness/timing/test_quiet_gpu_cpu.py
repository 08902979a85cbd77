"""harness.quiet_gpu without a GPU: the candidate's process group really stops and continues (a real child
process here), and the quiet check waits out short work and rejects work that keeps the GPU busy."""

from __future__ import annotations

import subprocess
import sys
import time

import pytest

from harness.timing.quiet_gpu import GroupPause, Interference, ProcessGone, QuietGpu

TICKER = "import time, sys\nwhile True:\n    sys.stdout.write('.'); sys.stdout.flush(); time.sleep(0.005)\n"


def _state(pid: int) -> str:
    with open(f"/proc/{pid}/stat") as stat:
        return stat.read().rsplit(")", 1)[1].split()[0]


@pytest.fixture
def ticker(tmp_path):
    out = open(tmp_path / "ticks", "wb")
    child = subprocess.Popen([sys.executable, "-c", TICKER], stdout=out, start_new_session=True)
    yield child, tmp_path / "ticks"
    child.kill()
    child.wait()
    out.close()


def test_stop_holds_the_whole_group_until_resume(ticker):
    child, ticks = ticker
    time.sleep(0.2)
    pause = GroupPause(child.pid)
    pause.stop()
    assert pause.stopped and _state(child.pid) == "T"
    held = ticks.stat().st_size
    time.sleep(0.1)
    assert ticks.stat().st_size == held  # not one tick while stopped
    assert child.poll() is None  # Popen still sees it running, not ended
    pause.resume()
    time.sleep(0.1)
    assert ticks.stat().st_size > held and _state(child.pid) != "T"
    pause.stop()  # again, and again reported
    assert _state(child.pid) == "T"
    pause.resume()


def test_a_process_that_ended_is_gone_and_left_to_its_owner(tmp_path):
    child = subprocess.Popen([sys.executable, "-c", "pass"], start_new_session=True)
    time.sleep(0.5)
    with pytest.raises(ProcessGone):
        GroupPause(child.pid).stop(timeout_s=1.0)
    assert child.wait(timeout=5) == 0  # not reaped by the pause: its exit status is still the owner's


class FakeQuiet(QuietGpu):
    """QuietGpu with scripted latencies instead of an empty kernel."""

    def __init__(self, latencies):
        self.latencies = iter(latencies)
        self.baseline_us = 10.0
        self.bound_us = 50.0
        self.waited_s = self.longest_s = 0.0

    def probe_us(self) -> float:
        return next(self.latencies, 10.0)


def test_quiet_after_three_fast_probes_in_a_row():
    quiet = FakeQuiet([10.0, 900.0, 10.0, 12.0, 11.0])
    quiet.wait()
    assert next(quiet.latencies, None) is None  # the slow one restarted the count


def test_work_that_keeps_the_gpu_busy_interferes():
    busy = FakeQuiet(iter(lambda: 2000.0, None))
    with pytest.raises(Interference, match="stayed busy"):
        busy.wait(limit_s=0.05)


def test_a_second_measurement_keeps_the_lower_baseline():
    """Measured while nvcc loads the host, then again after the build: the lower baseline, the tighter bound."""
    quiet = FakeQuiet([])
    quiet.baseline_us = float("inf")
    quiet.latencies = iter([16.0, 15.5, 18.0])
    quiet.refine(probes=3)
    assert quiet.baseline_us == 15.5 and quiet.bound_us == 65.5  # baseline + QUIET_MARGIN_US
    quiet.latencies = iter([9.5, 9.1, 30.0])
    quiet.refine(probes=3)
    assert quiet.baseline_us == 9.1 and quiet.bound_us == pytest.approx(59.1)
    quiet.latencies = iter([40.0, 41.0, 42.0])  # a slower second look never loosens the bound
    quiet.refine(probes=3)
    assert quiet.baseline_us == 9.1 and quiet.bound_us == pytest.approx(59.1)
