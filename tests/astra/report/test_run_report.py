"""The static HTML report of a run, opened in a real headless browser (Debian's chromium): it must
render, give a screenshot, and log nothing to the console (the page has no script at all, so any
console message means something broke: a blocked resource, a parse error)."""

import shutil
import struct
import subprocess

import pytest

from astra.optimize.rundir import HistoryEntry, RunDir
from astra.report import run_html as run_report
from tests.astra.report.test_check_report import _verdict

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser") or shutil.which("google-chrome")


@pytest.fixture
def run():
    run = RunDir.create("rmsnorm", "0.5.23", "offline", "// original")
    run.save_baseline(_verdict())
    for name, accepted in (("bounds:256", False), ("const:kBlockSize=512", True)):
        n = run.add_candidate(f"// {name}", {"name": name, "description": name})
        run.save_verdict(n, _verdict())
        state = run.state()
        state.history.append(HistoryEntry(n=n, round=0, name=name, status="correct", score=1.11, accepted=accepted,
                                          why="faster overall" if accepted else "not faster"))
        if accepted:
            state.best, state.best_score = n, 1.11
        state.stopped = "1 round(s) done"
        run.save(state)
    return run


def test_report_content(run):
    page = run_report.render(run)
    assert "<h2>Trajectory</h2>" in page and "const:kBlockSize=512" in page
    assert 'class="kept"' in page
    assert "Llama-3.1-8B/tp1/bfloat16/tokens=1,hidden=4096" in page
    assert "<svg" in page and "polyline" in page
    assert "<script" not in page and "http" not in page.replace("http://www.w3.org/2000/svg", "")


@pytest.mark.skipif(CHROMIUM is None, reason="needs chromium (CI installs Debian's chromium)")
def test_report_opens_in_a_headless_browser(run, tmp_path):
    path = run_report.write(run)
    shot = tmp_path / "report.png"
    proc = subprocess.run(
        [CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
         "--disable-background-networking", "--disable-component-update", "--disable-sync",
         f"--user-data-dir={tmp_path / 'profile'}", "--enable-logging=stderr", "--v=0",
         "--window-size=1200,1600", f"--screenshot={shot}", path.as_uri()],
        capture_output=True, text=True, timeout=120)
    console = [line for line in proc.stderr.splitlines() if ":CONSOLE" in line]
    assert console == [], console
    assert shot.exists(), proc.stderr[-2000:]
    png = shot.read_bytes()
    assert png[:8] == b"\x89PNG\r\n\x1a\n"
    width, height = struct.unpack(">II", png[16:24])
    assert (width, height) == (1200, 1600)
    assert len(png) > 20_000  # a rendered page with tables and a chart, not a blank one


def test_report_shows_each_roles_input_and_output(run):
    import json

    record = {"role": "planning", "model": "m", "prompt_tokens": 11, "completion_tokens": 5, "seconds": 0.4,
              "messages": [{"role": "user", "content": "Target band: <decode> please"}],
              "reply": '{"band": "decode", "idea": "wider vectors"}'}
    run.transcript.write_text(json.dumps(record) + "\nnot json\n")
    folder = run.root / "agent" / "round-000"
    folder.mkdir(parents=True)
    (folder / "IDEA.txt").write_text("use 8-wide loads\n")
    (folder / "agent.log").write_text("edited candidate.cuh\n")
    page = run_report.render(run)
    assert "#1 planning (m): 11 + 5 tokens" in page
    assert "Target band: &lt;decode&gt; please" in page and "wider vectors" in page  # escaped input, the output
    assert "round-000: use 8-wide loads" in page and "edited candidate.cuh" in page
