"""`astra survey` on recorded verdicts built here (CPU only): mixes, the ranking formula, floors missing from
older verdicts, gates sinking cold kernels, resume, the report files, the page in a headless browser and
the CLI's --report-only end to end. The numbers are SYNTHETIC (shaped like an H100's): no GPU ran."""

from __future__ import annotations

import functools
import json
import math
import os
import re
import shutil
import struct
import subprocess
from pathlib import Path
from types import SimpleNamespace

import pytest

from astra.errors import AstraError, BadInput
from astra.spec.resolve import spec_sha256
from astra.survey import mixes, rank, reach, report, run, summary
from astra.survey.bench import BenchSettings, serial_run
from astra.survey.mixes import load_mix, parse_mix, suite_weights
from astra.survey.store import Store, default_label, make_record, stale_reason
from harness.stats import Stats
from harness.verdict import CaseResult, ModeTiming, Verdict
from tests.astra.test_cli import assert_one_line_error
from tests.astra.test_cli import astra as astra_cli

REPO = Path(__file__).resolve().parents[2]
CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser") or shutil.which("google-chrome")
GPU = "NVIDIA H100 80GB HBM3"
TOKENS = [1, 8, 32, 128, 256, 1024, 4096, 16384]
PEAK_BPS, COPY_BPS = 3.35e12, 2.9e12  # H100: HBM3 peak; measured read+write (practical)
LAUNCH_US = {"graph": 0.84, "cold": 2.3}
FAMILIES = {"rmsnorm": [("Llama-3.1-8B/tp1", {"hidden": 4096}), ("DeepSeek-V3/tp8", {"hidden": 7168})],
            "silu_and_mul": [("Llama-3.1-8B/tp1", {"d": 14336}), ("Qwen3-32B/tp1", {"d": 25600})],
            "qknorm": [("Qwen3-32B/tp1", {"q_heads": 64, "kv_heads": 8, "head_dim": 128})]}


def _bytes(name: str, tokens: int, dims: dict) -> int:
    if name == "silu_and_mul":
        return 3 * tokens * dims["d"] * 2
    width = dims.get("hidden") or (dims.get("q_heads", 0) + dims.get("kv_heads", 0)) * dims.get("head_dim", 0)
    return 2 * tokens * width * 2


def verdict(name: str, slowdown, *, floors: bool = True, tokens=TOKENS, dtypes=("bfloat16", "float16"),
            status: str = "correct") -> dict:
    """A bench verdict as `astra bench --json` writes it, plus per-case floors (bytes at peak / at the measured
    copy rate, plus the empty launch); time = practical floor x slowdown(tokens, view)."""
    cases = []
    for label, dims in FAMILIES[name]:
        for dtype in dtypes:
            for t in tokens:
                nbytes = _bytes(name, t, dims)
                case = CaseResult(id=f"{label}/{dtype}/" + ",".join(f"{k}={v}" for k, v in {"tokens": t, **dims}.items()),
                                  band="decode" if t <= 256 else "prefill" if t >= 4096 else "middle", label=label,
                                  dtype=dtype, dims={"tokens": t, **dims}, timed=True, bytes=nbytes)
                extra = {}
                for view in ("graph", "cold"):
                    practical = LAUNCH_US[view] + nbytes / COPY_BPS * 1e6
                    time_us = practical * slowdown(t, view)
                    case.timings[view] = ModeTiming(orig=Stats(time_us, time_us * 0.98, time_us * 1.03, 200, 0.002),
                                                    cand=Stats(time_us, time_us * 0.98, time_us * 1.03, 200, 0.002),
                                                    speedup=1.0)
                    extra[view] = {"physical_us": max(LAUNCH_US[view] * 0.8, nbytes / PEAK_BPS * 1e6),
                                   "practical_us": practical, "orig_us": time_us, "cand_us": time_us,
                                   "orig_x_practical": time_us / practical, "cand_x_practical": time_us / practical}
                data = case.to_dict()
                if floors:
                    data.update(floors=extra, bytes_read=nbytes * 2 // 3, bytes_written=nbytes // 3)
                cases.append(data)
    v = Verdict(status=status, reason="original against itself", correct=status == "correct", name=name,
                env={"gpu": GPU, "copy_bandwidth_Bps": COPY_BPS}, phases={"total_s": 42.0}).to_dict()
    v["cases"] = cases
    return v


def record(name: str, slowdown, *, reach_status: str = "warm", sha: str = "0" * 64, **kw) -> dict:
    gates = {"warm": [], "gated": ["can_use_fused_inplace_qknorm: head_dim in [64, 128, 256, 512, 1024]"],
             "cold": [], "unknown": []}[reach_status]
    return make_record(name=name, kind="reviewed", spec_file=f"extracted_kernels/{name}/kernel.yaml",
                       spec_sha256=sha, module=name, token_dim="tokens", sglang_version="0.5.23", gpu=GPU,
                       wall_s=40.0, verdict=verdict(name, slowdown, **kw), error=None,
                       reach={"status": reach_status, "verdict": f"{reach_status} (recorded)", "sites": 1, "calls": 1,
                              "gates": gates, "more_gates": 0, "sites_at": []})


def decode_heavy(t, view):  # far from the floor at small batches (latency-bound), near it at large ones
    return 4.0 if t <= 64 else 1.1


def prefill_heavy(t, view):  # at the floor for decode batches, 10% above it on large prefill chunks
    return 1.0 if t <= 1024 else 1.1


def near(t, view):
    return 1.02


# ---------------------------------------------------------------- mixes


def test_builtin_mixes_and_nearest_token_counts():
    builtin = mixes.builtin_mixes()
    assert set(builtin) == {"decode", "prefill", "balanced"}
    for mix in builtin.values():
        assert mix.description and math.isclose(sum(mix.weights.values()), 1.0)
    decode = load_mix(None)
    assert decode.name == "decode"
    assert sum(w for t, w in decode.weights.items() if t <= 64) >= 0.7  # most weight on decode batches
    w = suite_weights(decode.weights, TOKENS)
    assert math.isclose(sum(w.values()), 1.0) and set(w) == set(TOKENS)
    assert math.isclose(w[8], 0.35)  # 8 and 16 (16 is as near 8 as 32 in log2: ties go to the smaller)
    assert w[16384] == 0.0
    assert suite_weights({3000: 1.0}, [1, 1024, 4096]) == {1: 0.0, 1024: 0.0, 4096: 1.0}


def test_mix_files(tmp_path):
    plain = tmp_path / "mix.json"
    plain.write_text(json.dumps({"1": 3, "4096": 1}))
    mix = load_mix(str(plain))
    assert mix.weights == {1: 3.0, 4096: 1.0} and mix.for_kernel("anything") == ({1: 3.0, 4096: 1.0}, True, None)
    observed = tmp_path / "observed.yaml"
    observed.write_text("steps: 100\nrmsnorm: {1: 6100, 8: 0}\n'*': {1024: 50}\n")
    mix = load_mix(str(observed))
    weights, normalise, note = mix.for_kernel("rmsnorm")
    assert weights == {1: 61.0, 8: 0.0} and normalise is False and note is None
    assert mix.for_kernel("qknorm") == ({1024: 0.5}, False, "not in mix " + str(observed) + ": its '*' counts used")
    assert parse_mix({"rmsnorm": {1: 2}}, "m").for_kernel("qknorm")[0] == {}
    for bad, needle in (({"x": 1}, "not a token count"), ({1: -1}, "non-negative"), ({1: 0}, "every weight is zero"),
                        ({"a": {1: 1}, "steps": 0}, "steps")):
        with pytest.raises(BadInput, match=needle):
            parse_mix(bad, "f")
    with pytest.raises(BadInput, match="neither a built-in mix"):
        load_mix(str(tmp_path / "nope.yaml"))


# ---------------------------------------------------------------- ranking


def test_recoverable_time_is_the_weighted_mean_excess_over_families():
    rec = record("rmsnorm", decode_heavy, tokens=[1, 4096])
    row = rank.rank_kernel(rec, "graph", parse_mix({1: 3, 4096: 1}, "m"))
    assert row.status == "ranked" and row.cases == 8  # 2 families x 2 dtypes x 2 token counts
    pts, _ = rank.points(rec, "graph")
    excess = {t: [p.time_us - p.practical_us for p in pts if p.tokens == t] for t in (1, 4096)}
    expected = 0.75 * sum(excess[1]) / 4 + 0.25 * sum(excess[4096]) / 4
    assert math.isclose(row.recoverable_us, expected) and math.isclose(row.score, expected)
    assert math.isclose(row.geomean_x, math.exp(0.75 * math.log(4.0) + 0.25 * math.log(1.1)))
    assert row.worst["x"] == pytest.approx(4.0) and row.worst["tokens"] == 1
    assert [c["tokens"] for c in row.curve] == [1, 4096] and row.curve[0]["families"] == 4
    cold = rank.rank_kernel(rec, "cold", parse_mix({1: 3, 4096: 1}, "m"))
    assert cold.recoverable_us > row.recoverable_us  # the cold view's launch costs more


def test_the_mix_decides_the_order():
    records = {"rmsnorm": record("rmsnorm", decode_heavy), "silu_and_mul": record("silu_and_mul", prefill_heavy),
               "qknorm": record("qknorm", near)}
    by_decode = [k.name for k in rank.rank(records, "graph", load_mix("decode")).kernels]
    by_prefill = [k.name for k in rank.rank(records, "graph", load_mix("prefill")).kernels]
    assert by_decode[0] == "rmsnorm" and by_prefill[0] == "silu_and_mul"
    assert by_decode[-1] == by_prefill[-1] == "qknorm"
    observed = parse_mix({"steps": 10, "qknorm": {1: 10000}}, "trace")  # only qknorm was seen
    ranking = rank.rank(records, "graph", observed)
    assert ranking.kernels[0].name == "qknorm"
    assert all(k.recoverable_us == 0.0 for k in ranking.kernels[1:])
    assert any("not observed" in n for n in ranking.kernels[1].notes)


def test_a_time_only_bench_ranks_like_a_checked_one():
    """The survey times originals without comparing their outputs with themselves (status "timed"); the
    ranking reads the same times and floors either way."""
    checked = rank.rank_kernel(record("rmsnorm", decode_heavy), "graph", load_mix("decode"))
    timed = rank.rank_kernel(record("rmsnorm", decode_heavy, status="timed"), "graph", load_mix("decode"))
    assert timed.status == checked.status == "ranked" and timed.score == pytest.approx(checked.score)
    assert not any(n.startswith("bench ") for n in timed.notes)  # no warning: "timed" is a bench that went well
    crashed = rank.rank_kernel(record("rmsnorm", decode_heavy, status="crashed"), "graph", load_mix("decode"))
    assert crashed.notes[0].startswith("bench crashed")
    assert BenchSettings().outputs_checked is False  # the survey's default


def test_cases_without_floors_are_skipped_with_a_note():
    old = record("rmsnorm", decode_heavy, floors=False)  # a verdict from before floors were recorded
    mixed = record("silu_and_mul", decode_heavy)
    for case in mixed["verdict"]["cases"][:5]:
        del case["floors"]
    failed = make_record(name="qknorm", kind="draft", spec_file="x", spec_sha256="1" * 64, module="qknorm",
                         token_dim="tokens", sglang_version="0.5.23", gpu=GPU, wall_s=3.0, verdict=None,
                         error="no CUDA GPU here", reach=None)
    ranking = rank.rank({"qknorm": failed, "rmsnorm": old, "silu_and_mul": mixed}, "graph", load_mix("decode"))
    assert [(k.name, k.status) for k in ranking.kernels] == [
        ("silu_and_mul", "ranked"), ("rmsnorm", "unranked"), ("qknorm", "failed")]
    assert ranking.kernels[0].cases == 27 and "5 case(s) without a practical floor" in ranking.kernels[0].notes[0]
    assert "32 case(s) without a practical floor" in ranking.kernels[1].notes[0]
    assert "no CUDA GPU here" in ranking.kernels[2].notes[0]


# ---------------------------------------------------------------- gates


def _site(kind="call", gates=(), requires=()):
    return SimpleNamespace(kind=kind, gates=list(gates), requires=list(requires), file="sglang/srt/models/utils.py",
                           line=523)


def _reach(sites, srt=True):
    return SimpleNamespace(sites=sites, srt=srt, verdict="recorded")


def test_reach_status_from_the_srt_sites():
    assert reach.summarize(_reach([_site(gates=["_is_cuda", "not _is_hip", "_is_cuda or _is_hip"])]))["status"] == "warm"
    assert not reach.platform_only("_is_hip or head_dim == 128")
    gated = reach.summarize(_reach([_site(gates=["_is_cuda", "attn_tp_size == 1"]),
                                    _site(kind="reference")]))  # a reference does not count where a call exists
    assert gated["status"] == "gated" and gated["gates"] == ["attn_tp_size == 1"]
    assert reach.summarize(_reach([]))["status"] == "cold"
    assert reach.summarize(_reach([], srt=False))["status"] == "unknown"
    assert reach.label({"status": "cold"}) == "cold: no call site in sglang/srt"
    assert reach.label(gated).startswith("gated: attn_tp_size == 1")


def test_cold_and_gated_kernels_sink():
    records = {"rmsnorm": record("rmsnorm", decode_heavy, reach_status="cold"),  # the most recoverable time...
               "silu_and_mul": record("silu_and_mul", lambda t, v: 1.6 if t <= 64 else 1.0, reach_status="warm"),
               "qknorm": record("qknorm", lambda t, v: 2.5 if t <= 64 else 1.0, reach_status="gated")}
    ranking = rank.rank(records, "graph", load_mix("decode"))
    raw = {k.name: k.recoverable_us for k in ranking.kernels}
    assert raw["rmsnorm"] > max(raw["silu_and_mul"], raw["qknorm"])
    assert [k.name for k in ranking.kernels][-1] == "rmsnorm"  # ...but no call site in sglang/srt: it sinks
    cold = ranking.kernels[-1]
    assert cold.factor == reach.REACH_FACTORS["cold"] and math.isclose(cold.score, 0.1 * cold.recoverable_us)
    assert cold.gates == "cold: no call site in sglang/srt"
    text = summary.text(ranking)
    assert "cold: no call site in sglang/srt" in text and "gated: can_use_fused_inplace_qknorm" in text


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


@pytest.mark.skipif(shutil.which("nvcc") is None, reason="needs nvcc")
def test_prebuild_compiles_into_the_cache_the_workers_read(specs, tmp_path, monkeypatch):
    from astra.survey.bench import BenchTask, prebuild

    monkeypatch.setenv("ASTRA_HOME", str(tmp_path / "home"))
    lines: list[str] = []
    failed = prebuild([BenchTask("silu_and_mul", str(specs / "silu_and_mul" / "kernel.yaml"), None, None),
                       BenchTask("nope", str(tmp_path / "missing.yaml"), None, None)], lines.append)
    assert list(failed) == ["nope"]
    assert "building" in lines[0] and "0 kernel(s) with a failed build" in lines[-1]
    assert list((tmp_path / "home" / "builds").rglob("*.so"))
