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


def test_report_shows_each_rounds_symptoms_plan_and_passes(run):
    from astra.optimize.rundir import RoundPlan
    from astra.report import run_text

    n = run.add_candidate("// vectorized", {"name": "pass:vectorize", "description": "vectorize: done"})
    run.save_verdict(n, _verdict())
    state = run.state()
    state.history.append(HistoryEntry(n=n, round=1, name="pass:vectorize", status="correct", score=1.2,
                                      accepted=True, why="faster overall"))
    state.plans.append(RoundPlan(1, "offline", "best #2", symptoms=[
        {"id": "uncoalesced_loads", "band": "decode", "evidence": "decode0: global loads use 25% of each 32-byte "
         "sector (8.0 sectors per request)", "source": "ncu", "facts": {}}],
        plans=[{"band": "decode", "idea": "vectorize: 16-byte loads <use whole sectors>", "expected_speedup": 1.25,
                "risk": "", "stop": False, "rationale": "decode: uncoalesced_loads: 25% (ncu)", "notes": [],
                "step": "pass:vectorize"},
               {"band": "decode", "idea": "coarsen: more rows per CTA", "expected_speedup": None, "risk": "",
                "stop": False, "rationale": "", "notes": ["no pass 'coarsen' in the catalog"], "step": "pass:coarsen"}],
        notes=["pass:reuse held back: all: spills"]))
    run.save(state)

    page = run_report.render(run)
    section = page.split("<h2>Profile and plan per round</h2>", 1)[1].split("<h2>", 1)[0]
    assert "Round 1: offline, profiled best #2" in section
    assert "global loads use 25% of each 32-byte sector" in section and ">ncu<" in section
    assert "<li>pass:vectorize [decode] vectorize: 16-byte loads &lt;use whole sectors&gt; (expected x1.25)" in section
    assert "no pass &#x27;coarsen&#x27; in the catalog" in section and "pass:reuse held back" in section
    assert '<td class="l">pass:vectorize</td>' in section and "kept" in section
    assert "const:kBlockSize=512" not in section  # a round-0 parameter candidate is not a pass of round 1

    text = run_text.summary(run)
    assert "round 1 (offline, profiled: best #2):" in text
    assert "  symptom decode: uncoalesced_loads: decode0: global loads use 25%" in text
    assert "  plan 2. pass:coarsen [decode] coarsen: more rows per CTA; no pass 'coarsen' in the catalog" in text
    assert f"  applied #{n:03d} pass:vectorize: correct, x1.200, kept" in text


def test_a_run_without_plans_has_no_plan_section(run):
    from astra.report import run_text

    assert "Profile and plan per round" not in run_report.render(run)
    assert "symptom" not in run_text.summary(run)
