"""`astra check --quick` is a screen: the first dtype, the median timed shape of each band with every edge shape,
one seed, graph view only, no sanitizer (astra.verify.runner.quick_cases), on a reviewed spec's real suite."""

from __future__ import annotations

from astra.spec import jobs
from astra.spec import model as spec_mod
from astra.verify.runner import CheckOptions, quick_cases


def test_quick_keeps_one_median_timed_shape_per_band_and_every_edge(sglang_0523):
    spec = spec_mod.load("fused_add_rmsnorm")
    full = jobs.make_job(spec, sglang_0523, candidate_source="// candidate", options=CheckOptions().harness_options())
    first = full.cases[0].dtype
    timed = [c for c in full.cases if c.timed and c.dtype == first]
    quick = quick_cases(jobs.make_job(spec, sglang_0523, candidate_source="// candidate",
                                      options=CheckOptions(quick=True).harness_options()))
    kept = [c for c in quick.cases if c.timed]
    assert {c.dtype for c in quick.cases} == {first}
    assert sorted(c.band for c in kept) == sorted({c.band for c in timed})  # one per band
    for case in kept:
        band = sorted((c for c in timed if c.band == case.band), key=lambda c: c.bytes)
        assert case.bytes == band[len(band) // 2].bytes  # the median by bytes
    assert [c.id for c in quick.cases if not c.timed] == [c.id for c in full.cases if not c.timed and c.dtype == first]
    assert quick.options.seeds == [0] and not quick.options.extra_trials
    assert quick.options.modes == ["graph"] and not quick.options.sanitizer
    assert len(quick.cases) < len(full.cases) / 2


def test_a_quick_screen_is_not_evidence_for_a_patch():
    from astra.patches.emit import refusal
    from astra.verify.runner import SCREEN_NOTE
    from tests.astra.patches import patch_helpers as h

    verdict = h.synthetic_verdict()
    assert refusal(verdict) is None  # the same numbers from a full check make a patch
    verdict.notes.append(SCREEN_NOTE)
    why = refusal(verdict)
    assert why is not None and "--quick" in why and "without --quick" in why
