"""The survey's ranking on recorded verdicts (CPU only): serving mixes, the recoverable-time formula, floors
missing from older verdicts, and srt gates sinking cold kernels. Numbers are SYNTHETIC (tests/astra/
survey/survey_records.py)."""

from __future__ import annotations

import json
import math
from types import SimpleNamespace

import pytest

from astra.errors import BadInput
from astra.survey import mixes, rank, reach, summary
from astra.survey.bench import BenchSettings
from astra.survey.mixes import load_mix, parse_mix, suite_weights
from astra.survey.store import make_record
from tests.astra.survey.survey_records import GPU, TOKENS, decode_heavy, near, prefill_heavy, record

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


def test_a_bench_of_edge_cases_only_says_why_it_is_unranked():
    edge_only = record("qknorm", decode_heavy)
    edge_only["verdict"]["cases"] = []  # a suite of `edge` cases only: the bench times none
    graph_only = record("rmsnorm", decode_heavy)
    for case in graph_only["verdict"]["cases"]:  # as `survey --modes graph` records it
        del case["timings"]["cold"]
        case["floors"].pop("cold", None)
    overcounted = record("silu_and_mul", decode_heavy)
    case = overcounted["verdict"]["cases"][0]
    case["floors"]["cold"]["physical_us"] = case["floors"]["cold"]["orig_us"] * 2  # bytes counted too high
    for near_case in overcounted["verdict"]["cases"][1:3]:  # within the bench's margins: not flagged
        cold = near_case["floors"]["cold"]
        cold.update(dram_us=cold["orig_us"] * 1.05, launch_us=cold["orig_us"] * 1.2, physical_us=cold["orig_us"] * 1.2)
    ranking_check = rank.points(overcounted, "cold")[0]
    assert [p.under_floor for p in ranking_check[:3]] == [True, False, False]
    cold = overcounted["verdict"]["cases"][3]["floors"]["cold"]
    cold.update(dram_us=cold["orig_us"] / 0.85, launch_us=0.0)  # under 0.9 x its DRAM floor: flagged
    assert rank.points(overcounted, "cold")[0][3].under_floor
    ranking = rank.rank({"qknorm": edge_only, "rmsnorm": graph_only, "silu_and_mul": overcounted}, "cold",
                        load_mix("decode"))
    notes = {k.name: (k.status, k.notes) for k in ranking.kernels}
    assert notes["qknorm"][0] == "unranked" and "`edge` cases only" in notes["qknorm"][1][0]
    assert notes["rmsnorm"][0] == "unranked" and "not timed in the cold view" in notes["rmsnorm"][1][0]
    assert notes["silu_and_mul"][0] == "ranked"
    assert any(n.startswith("2 case(s) timed below the physical floor") and "`bytes` likely overcounts" in n
               for n in notes["silu_and_mul"][1])


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




def test_a_drafts_guesses_show_in_the_spec_column(tmp_path):
    """A draft ranks on what `astra extract` guessed: the record counts the spec's TODO(review) markers when
    benched, and the table says how many; reviewed specs and records from before the count say only the kind."""
    from astra.survey.run import review_markers

    draft = tmp_path / "kernel.yaml"
    draft.write_text("# TODO(review): dim `seqlen`: meaning unknown, given 128\n"
                     "description: 'TODO(review): what it computes'\nname: k\n")
    assert review_markers(draft) == 2 and review_markers(tmp_path / "missing.yaml") is None
    guessed = {**record("rmsnorm", decode_heavy), "kind": "draft", "guesses": review_markers(draft)}
    assert rank.rank_kernel(guessed, "graph", load_mix("decode")).kind == "draft (2 guesses)"
    one = {**guessed, "guesses": 1}
    assert rank.spec_label(one) == "draft (1 guess)"
    older = {**guessed}
    older.pop("guesses")
    assert rank.spec_label(older) == "draft" and rank.spec_label(record("rmsnorm", near)) == "reviewed"
    table = summary.markdown(rank.rank({"rmsnorm": guessed}, "graph", load_mix("decode")))
    assert "| rmsnorm | draft (2 guesses) |" in table and "review a draft near the top" in table
