"""`astra survey` on recorded verdicts (CPU only): the store and resume, the reach looked up later, local GPU
workers (faked), the report files, the page in a headless browser and the CLI's --report-only end to end.
Numbers are SYNTHETIC (tests/astra/survey/survey_records.py); the ranking itself is tested in test_survey_rank.py."""

from __future__ import annotations

import functools
import json
import os
import re
import shutil
import struct
import subprocess
from pathlib import Path

import pytest

from astra.errors import AstraError
from astra.spec.resolve import spec_sha256
from astra.survey import rank, reach, report, run
from astra.survey.bench import BenchSettings, serial_run
from astra.survey.mixes import load_mix
from astra.survey.store import Store, default_label, stale_reason
from tests.astra.cli.test_cli import assert_one_line_error
from tests.astra.cli.test_cli import astra as astra_cli
from tests.astra.survey.survey_records import GPU, decode_heavy, near, prefill_heavy, record, verdict
from tests.toolchain import needs_nvcc

REPO = Path(__file__).resolve().parents[3]
CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser") or shutil.which("google-chrome")

# ---------------------------------------------------------------- store and resume


@pytest.fixture
def specs(tmp_path, monkeypatch):
    """Three reviewed specs (copies of the repository's) in a spec directory of their own, a fresh ASTRA_HOME."""
    root = tmp_path / "specs"
    for name in ("rmsnorm", "silu_and_mul", "qknorm"):
        shutil.copytree(REPO / "extracted_kernels" / name, root / name)
    monkeypatch.setenv("ASTRA_SPECS", str(root))
    monkeypatch.setenv("ASTRA_HOME", str(tmp_path / "home"))
    return root


def _fake_bench(calls: list, name, spec_file, version, src, settings):
    calls.append(name)
    if name == "boom":
        raise AstraError("the original failed to build")
    return verdict(name, decode_heavy)


def _survey(targets, store, calls, **kw):
    return run.survey(targets, store, run=functools.partial(serial_run, bench=functools.partial(_fake_bench, calls)),
                      reach_of=lambda spec, v, s: reach.unknown("not looked up in tests"), gpu=GPU, **kw)


def test_resume_benches_only_what_the_store_lacks(specs, tmp_path):
    targets = run.select(["rmsnorm", "silu_and_mul", "qknorm"])
    assert [t.kind for t in targets] == ["reviewed"] * 3
    store = Store(tmp_path / "survey")
    calls: list[str] = []
    _survey(targets[:2], store, calls)  # a survey that stopped after two kernels
    assert sorted(p.name for p in store.root.iterdir()) == ["qknorm.json", "rmsnorm.json"]
    calls.clear()
    outcome = _survey(targets, store, calls)
    assert calls == ["silu_and_mul"] and sorted(outcome.current) == ["qknorm", "rmsnorm"]
    rec = store.read("silu_and_mul")
    assert rec["spec_sha256"] == spec_sha256(specs / "silu_and_mul" / "kernel.yaml") and rec["gpu"] == GPU
    assert rec["sglang_version"] == "0.5.23" and rec["verdict"]["status"] == "correct" and rec["wall_s"] >= 0
    with (specs / "qknorm" / "kernel.yaml").open("a") as fh:
        fh.write("# edited\n")  # a changed spec is benched again
    calls.clear()
    _survey(targets, store, calls)
    assert calls == ["qknorm"]
    for name in ("rmsnorm", "silu_and_mul"):  # records from another GPU are stale
        store.write({**store.read(name), "gpu": "NVIDIA H200"})
    calls.clear()
    _survey(targets, store, calls)
    assert sorted(calls) == ["rmsnorm", "silu_and_mul"]
    calls.clear()
    _survey(targets, store, calls, force=True)
    assert len(calls) == 3
    assert not list(store.root.glob("*.tmp")) and not list(store.root.glob(".*"))


def test_reach_unknown_on_the_gpu_box_is_looked_up_when_reported(specs, tmp_path):
    """A survey benched where sglang/srt could not be fetched records reach "unknown"; `--report-only`
    on a machine that has the runtime looks it up and writes it back to the store."""
    store = Store(tmp_path / "survey")
    unknown = record("rmsnorm", decode_heavy, reach_status="unknown")
    store.write(unknown)
    store.write(record("silu_and_mul", decode_heavy, reach_status="cold"))
    asked: list[str] = []

    def reach_of(spec, version, src):
        asked.append(spec.module)
        return {**unknown["reach"], "status": "gated", "verdict": "gated (looked up)"}

    lines: list[str] = []
    out = run.refresh_unknown_reach(store.records(), store, reach_of=reach_of, say=lines.append)
    assert asked == ["rmsnorm"] and out["rmsnorm"]["reach"]["status"] == "gated"
    assert out["silu_and_mul"]["reach"]["status"] == "cold"  # known reach is kept as benched
    assert store.read("rmsnorm")["reach"]["status"] == "gated" and "1 record(s)" in lines[0]
    assert store.read("rmsnorm")["verdict"] == unknown["verdict"]


def test_a_failed_bench_is_recorded_and_retried(specs, tmp_path):
    shutil.copytree(specs / "rmsnorm", specs / "boom")
    text = (specs / "boom" / "kernel.yaml").read_text().replace("name: rmsnorm", "name: boom", 1)
    (specs / "boom" / "kernel.yaml").write_text(text)
    store, calls = Store(tmp_path / "survey"), []
    outcome = _survey(run.select(["boom"]), store, calls)
    assert outcome.failed == ["boom"] and "failed to build" in store.read("boom")["error"]
    assert stale_reason(store.read("boom"), spec_sha256="x", sglang_version=None, gpu=None).startswith("the last")
    _survey(run.select(["boom"]), store, calls)
    assert calls == ["boom", "boom"]


def test_a_record_timed_in_fewer_views_is_redone():
    full = record("rmsnorm", decode_heavy)
    assert {v for c in full["verdict"]["cases"] for v in c["timings"]} == {"graph", "cold"}
    graph_only = json.loads(json.dumps(full))
    for case in graph_only["verdict"]["cases"]:
        del case["timings"]["cold"]
    asked = dict(spec_sha256="0" * 64, sglang_version="0.5.23", gpu=GPU)
    assert stale_reason(graph_only, **asked, views=("graph",)) is None
    assert stale_reason(full, **asked, views=("graph", "cold")) is None
    assert stale_reason(graph_only, **asked, views=("graph", "cold")) == \
        "not timed in the cold view (surveyed with fewer --modes)"


def test_survey_redoes_a_graph_only_record_when_both_views_are_asked(specs, tmp_path):
    store, calls = Store(tmp_path / "survey"), []
    _survey(run.select(["rmsnorm"]), store, calls)
    rec = store.read("rmsnorm")
    for case in rec["verdict"]["cases"]:  # as `survey --modes graph` left it
        case["timings"].pop("cold", None)
    store.write(rec)
    _survey(run.select(["rmsnorm"]), store, calls, settings=BenchSettings(modes=("graph",)))
    assert calls == ["rmsnorm"]  # graph asked, graph recorded: current
    lines: list[str] = []
    _survey(run.select(["rmsnorm"]), store, calls, say=lines.append)  # both views (the default) asked
    assert calls == ["rmsnorm", "rmsnorm"]
    assert "rmsnorm: to bench (not timed in the cold view (surveyed with fewer --modes))" in lines


def _gpu_bench(name, spec_file, version, src, settings):  # top level: runs in a pool worker
    import os

    if name == "boom":
        raise AstraError("the original failed to build")
    out = verdict(name, decode_heavy)
    out["env"] = {**out.get("env", {}), "gpu": GPU, "visible": os.environ.get("CUDA_VISIBLE_DEVICES")}
    return out


def test_survey_on_two_gpu_workers_writes_every_record(specs, tmp_path):
    """The local pool (astra.scale) with two GPU slots: each kernel benched on one slot, every record
    written as it arrives, a raising bench recorded as that kernel's error."""
    from astra.scale import LocalExecutor
    from astra.survey.bench import executor_run

    shutil.copytree(specs / "rmsnorm", specs / "boom")
    text = (specs / "boom" / "kernel.yaml").read_text().replace("name: rmsnorm", "name: boom", 1)
    (specs / "boom" / "kernel.yaml").write_text(text)
    store = Store(tmp_path / "survey")
    with LocalExecutor(cpus=1, gpus=2) as pool:
        outcome = run.survey(run.select(["rmsnorm", "silu_and_mul", "qknorm", "boom"]), store,
                             run=executor_run(pool, bench=_gpu_bench), gpu=GPU,
                             reach_of=lambda spec, v, s: reach.unknown("not looked up in tests"))
    assert outcome.failed == ["boom"] and "failed to build" in store.read("boom")["error"]
    seen = {store.read(n)["verdict"]["env"]["visible"] for n in ("rmsnorm", "silu_and_mul", "qknorm")}
    assert seen <= {"0", "1"} and seen
    assert all(store.read(n)["verdict"]["status"] == "correct" for n in ("rmsnorm", "silu_and_mul", "qknorm"))


def test_select_takes_probed_drafts_only(specs):
    from astra import paths

    for name, probed in (("draft_ok", True), ("draft_new", False)):
        d = paths.drafts_dir() / name
        d.mkdir(parents=True)
        (d / "kernel.yaml").write_text((specs / "rmsnorm" / "kernel.yaml").read_text().replace(
            "name: rmsnorm", f"name: {name}", 1))
        if probed:
            (d / "probe.json").write_text(json.dumps({"status": "probed", "spec_sha256": spec_sha256(d / "kernel.yaml")}))
    said: list[str] = []
    targets = run.select([], all_drafts=True, reviewed=True, say=said.append)
    assert [(t.name, t.kind) for t in targets] == [("draft_ok", "draft"), ("qknorm", "reviewed"),
                                                   ("rmsnorm", "reviewed"), ("silu_and_mul", "reviewed")]
    assert any("draft_new" in line and "unprobed" in line for line in said)
    with pytest.raises(AstraError, match="name the kernels"):
        run.select([])


def test_default_label():
    import datetime

    assert default_label("0.5.23", GPU, datetime.date(2026, 11, 22)) == "sglang-0.5.23-nvidia-h100-80gb-hbm3-2026-11-22"
    assert BenchSettings().modes == ("graph", "cold")


# ---------------------------------------------------------------- reports


def _ranking():
    records = {"rmsnorm": record("rmsnorm", decode_heavy), "silu_and_mul": record("silu_and_mul", prefill_heavy),
               "qknorm": record("qknorm", lambda t, v: 2.0, reach_status="cold"),
               "store_cache": {**record("rmsnorm", near, floors=False), "name": "store_cache"}}
    return rank.rank(records, "graph", load_mix("decode"))


def test_report_files(tmp_path):
    md, js, page = report.write(_ranking(), tmp_path / "r", store=tmp_path / "store")
    text = md.read_text()
    assert re.search(r"\| 1 \| rmsnorm \| reviewed \| [\d.]+ \| [\d.]+ \| [\d.]+ \| Llama-3.1-8B/tp1/", text)
    assert "## Not ranked" in text and "| store_cache | unranked |" in text and GPU in text
    data = json.loads(js.read_text())
    assert data["view"] == "graph" and data["mix"]["name"] == "decode" and data["meta"]["gpus"] == [GPU]
    assert [k["name"] for k in data["kernels"]][:3] == ["rmsnorm", "silu_and_mul", "qknorm"]
    assert data["kernels"][0]["curve"][0]["physical_us"] > 0
    html_text = page.read_text()
    assert html_text.count("<svg") == 4 and html_text.count("class='rank-row") == 3  # bar chart + 3 kernels
    assert "polyline" in html_text and "cold: no call site in sglang/srt" in html_text
    assert "<script" not in html_text and "http" not in html_text.replace("http://www.w3.org/2000/svg", "")


_MEASURE = """<script>
const boxes = Array.from(document.querySelectorAll('svg')).map(s => {
  const r = s.getBoundingClientRect(); return [s.getAttribute('class'), r.width, r.height]; });
const rows = Array.from(document.querySelectorAll('tr.rank-row')).map(
  tr => Array.from(tr.cells).map(td => td.textContent));
const out = document.createElement('pre'); out.id = 'measured';
out.textContent = JSON.stringify({boxes, rows}); document.body.appendChild(out);
</script></body>"""


def _chromium(tmp_path, *args):
    return subprocess.run(
        [CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
         "--disable-background-networking", "--disable-component-update", "--disable-sync",
         f"--user-data-dir={tmp_path / 'profile'}", "--enable-logging=stderr", "--v=0", *args],
        capture_output=True, text=True, timeout=120)


@pytest.mark.skipif(CHROMIUM is None, reason="needs chromium (CI installs Debian's chromium)")
def test_survey_page_renders_in_a_headless_browser(tmp_path):
    page = report.write(_ranking(), tmp_path / "r")[2]
    shot = tmp_path / "survey.png"
    proc = _chromium(tmp_path, "--window-size=1200,1600", f"--screenshot={shot}", page.as_uri())
    assert [line for line in proc.stderr.splitlines() if ":CONSOLE" in line] == []  # the page has no script
    png = shot.read_bytes()
    assert png[:8] == b"\x89PNG\r\n\x1a\n" and struct.unpack(">II", png[16:24]) == (1200, 1600)
    assert len(png) > 20_000
    measured = tmp_path / "measured.html"  # a copy with a script that measures what the browser laid out
    measured.write_text(page.read_text().replace("</body>", _MEASURE))
    proc = _chromium(tmp_path, "--window-size=1200,1600", "--dump-dom", measured.as_uri())
    found = re.search(r'<pre id="measured">(.*?)</pre>', proc.stdout, re.S)
    assert found, proc.stderr[-2000:]
    data = json.loads(found.group(1).replace("&quot;", '"').replace("&amp;", "&"))
    assert [b[0] for b in data["boxes"]] == ["chart ranking-chart"] + ["chart floor-chart"] * 3
    assert all(w > 100 and h > 100 for _, w, h in data["boxes"]), data["boxes"]
    assert [row[1] for row in data["rows"]] == ["rmsnorm", "silu_and_mul", "qknorm"]


# ---------------------------------------------------------------- CLI


def test_cli_report_only_end_to_end(tmp_path):
    store = Store(tmp_path / "home" / "surveys" / "sglang-0.5.23-nvidia-h100-80gb-hbm3-2026-11-22")
    for rec in (record("rmsnorm", decode_heavy), record("silu_and_mul", prefill_heavy),
                record("qknorm", near, reach_status="cold")):
        store.write(rec)
    env = {**os.environ, "ASTRA_HOME": str(tmp_path / "home")}
    code, out, err = astra_cli("survey", "--report-only", "--mix", "prefill", "--report", str(tmp_path / "rep"),
                               "--json", str(tmp_path / "rank.json"), "--top", "1", env=env)  # the latest store
    assert code == 0, err
    assert "mix: prefill" in out and "silu_and_mul" in out and "rmsnorm" not in out
    assert "not ranked" not in out and str(store.root) in out
    assert sorted(p.name for p in (tmp_path / "rep").iterdir()) == ["survey.html", "survey.json", "survey.md"]
    assert json.loads((tmp_path / "rank.json").read_text())["kernels"][0]["name"] == "silu_and_mul"
    code, _, err = astra_cli("survey", "rmsnorm", "--out", str(tmp_path / "s"), env=env)  # this machine has no GPU
    assert_one_line_error(code, err, 7, "no CUDA GPU here")
    assert not (tmp_path / "s").exists()
    code, _, err = astra_cli("survey", "rmsnorm", "--modes", "graph,hot", env=env)  # refused before the GPU check
    assert_one_line_error(code, err, 12, "--modes 'graph,hot': give graph, cold or graph,cold")


def test_cli_in_process(tmp_path, monkeypatch, capsys):
    from astra.cli import main

    monkeypatch.setenv("ASTRA_HOME", str(tmp_path / "home"))
    for args, needle in ((["--report-only"], "no survey under"), ([], "name the kernels"),
                         (["--report-only", "--mix", "nightly"], "neither a built-in mix"),
                         (["--report-only", "--top", "0"], "--top 0"),
                         (["--report-only", "--force"], "--force has nothing to redo")):
        assert main(["survey", *args]) == 12
        err = capsys.readouterr().err
        assert needle in err and len(err.strip().splitlines()) == 1, err
    store = Store(tmp_path / "store")
    store.write(record("rmsnorm", decode_heavy))
    store.write(record("silu_and_mul", prefill_heavy))
    (store.root / "junk.json").write_text("{not json")
    assert main(["survey", "--report-only", "--out", str(store.root), "--view", "cold", "rmsnorm"]) == 0
    out = capsys.readouterr().out
    assert "view: cold" in out and "rmsnorm" in out and "silu_and_mul" not in out
    assert "store problem: junk.json" in out
    assert main(["survey", "--report-only", "nope", "--out", str(store.root)]) == 12
    assert "has no record of nope" in capsys.readouterr().err


def test_prebuild_sees_only_what_is_to_bench_before_any_bench(specs, tmp_path):
    targets = run.select(["rmsnorm", "silu_and_mul"])
    store, calls, seen = Store(tmp_path / "survey"), [], []
    _survey(targets[:1], store, calls)
    calls.clear()
    _survey(targets, store, calls, prebuild=lambda tasks, say: seen.append(([t.name for t in tasks], list(calls))))
    assert seen == [(["silu_and_mul"], [])] and calls == ["silu_and_mul"]  # built first, then benched
    seen.clear()
    _survey(targets, store, calls, prebuild=lambda tasks, say: seen.append(tasks))
    assert seen == []  # nothing to bench: nothing to build


@needs_nvcc
def test_prebuild_compiles_into_the_cache_the_workers_read(specs, tmp_path, monkeypatch):
    from astra.survey.bench import BenchTask, prebuild

    monkeypatch.setenv("ASTRA_HOME", str(tmp_path / "home"))
    lines: list[str] = []
    failed = prebuild([BenchTask("silu_and_mul", str(specs / "silu_and_mul" / "kernel.yaml"), None, None),
                       BenchTask("nope", str(tmp_path / "missing.yaml"), None, None)], lines.append)
    assert list(failed) == ["nope"]
    assert "building" in lines[0] and "0 kernel(s) with a failed build" in lines[-1]
    assert list((tmp_path / "home" / "builds").rglob("*.so"))
