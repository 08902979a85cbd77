"""harness.timed_outputs on the CPU: the rules LaunchCheck applies to the digests of the timed launches (the
whole loop: test_paired_timing_cpu.py; on a GPU with adversarial kernels: tests/adversarial)."""

from __future__ import annotations

import torch

from harness.candidate.exchange import Malformed
from harness.judge.timed_outputs import Checked, LaunchCheck, value_difference
from tests.harness.judge.test_paired_timing_cpu import _case, _job

A, B, C = "a" * 64, "b" * 64, "c" * 64
IN = "e" * 64


def _values(shift: float = 0.0):
    x = torch.arange(8 * 16, dtype=torch.float32).reshape(8, 16) / 7.0
    return {"x": x, "w": torch.ones(16), "out": x + shift}


def _check(checked: Checked | None, fetch=None, seeds=(0, 10001)) -> LaunchCheck:
    case = _case()
    return LaunchCheck(case, _job(case), "graph", list(seeds), checked, lambda i: _values(),
                       fetch or (lambda indices: {i: _values() for i in indices}))


def d(out: str, inp: str = IN) -> dict[str, str]:
    return {"out": out, "in": inp}


def test_equal_digests_pass_without_fetching():
    fetched = []
    check = _check(Checked(digest=A, bit_exact=True, deterministic_orig=True, deterministic_cand=True),
                   lambda idx: fetched.append(idx) or {})
    assert check.verify("sample 3", [d(A), d(B)], [d(A), d(B)]) == [] and fetched == []


def test_a_changed_read_only_input_fails_naming_the_launch():
    failures = _check(None).verify("sample 3", [d(A), d(B)], [d(A), d(B, "f" * 64)])
    assert failures == ["graph view, timed launch 2 of 2 (inputs of seed 10001), at sample 3: the launch changed a "
                        "read-only input (the original's leave them as drawn)"]


def test_bitwise_where_the_checks_were_bit_exact():
    strict = Checked(digest=A, bit_exact=True, deterministic_orig=True, deterministic_cand=True)
    failures = _check(strict).verify("the last sample", [d(A), d(B)], [d(A), d(C)])
    assert len(failures) == 1 and "differ bit for bit from the original's" in failures[0]
    loose = Checked(digest=A, bit_exact=False, deterministic_orig=True, deterministic_cand=True)
    assert _check(loose).verify("the last sample", [d(A), d(B)], [d(A), d(C)]) == []  # equal by value


def test_values_outside_tolerance_fail_and_a_passing_pair_is_not_fetched_again():
    calls = []

    def fetch(indices):
        calls.append(list(indices))
        return {i: _values(shift=1.0 if i == 1 else 0.0) for i in indices}
    check = _check(None, fetch)
    failures = check.verify("sample 2", [d(A), d(B)], [d(C), d(C)])
    assert len(failures) == 1 and failures[0].startswith("graph view, timed launch 2 of 2") and "out:" in failures[0]
    assert check.verify("the last sample", [d(A), d(B)], [d(C), d(C)])[0].startswith("graph view, timed launch 2")
    assert calls == [[0, 1], [1]]  # set 0's pair passed by value once: not fetched again


def test_a_deterministic_candidate_must_repeat_itself_and_give_the_checked_outputs():
    checked = Checked(digest=A, bit_exact=False, deterministic_orig=True, deterministic_cand=True)
    check = _check(checked)
    assert check.verify("sample 4", [d(A), d(B)], [d(A), d(B)]) == []
    failures = check.verify("the last sample", [d(A), d(B)], [d(A), d(C)])
    assert any("differ from the same launch's at sample 4" in f for f in failures)
    other = _check(checked).verify("sample 1", [d(B), d(B)], [d(B), d(B)])
    assert other and "behaves differently when timed" in other[0]
    nondeterministic = Checked(digest=A, bit_exact=False, deterministic_orig=False, deterministic_cand=False)
    assert _check(nondeterministic).verify("sample 1", [d(B), d(B)], [d(C), d(C)]) == []  # by value, not skipped


def test_unreadable_values_fail():
    def fetch(indices):
        raise Malformed("trial 0: out holds 12 bytes")
    failures = _check(None, fetch).verify("sample 1", [d(A), d(A)], [d(B), d(A)])
    assert failures and "could not be read: trial 0: out holds 12 bytes" in failures[0]


def test_value_difference_names_the_output():
    case = _case()
    assert value_difference(case, _job(case), _values(), _values()) is None
    assert value_difference(case, _job(case), _values(), _values(1e-7)) is None
    assert value_difference(case, _job(case), _values(), _values(1.0)).startswith("by value: out: ")


def test_values_follow_the_reference_rule_where_the_spec_has_one():
    """A candidate more accurate than the original passes its checks by the reference rule: its timed launches
    are judged by the same rule, not by the original's tolerance alone."""
    case = _case()
    inputs = _values()

    def reference(args, dims):
        return {"out": args["x"] * args["w"][None, :]}
    exact = {**inputs, "out": inputs["x"] * inputs["w"]}
    sloppy_orig = {**inputs, "out": exact["out"] + 1e-3}  # the original, off by more than the tolerance
    assert value_difference(case, _job(case), sloppy_orig, exact) is not None  # tolerance alone refuses
    assert value_difference(case, _job(case), sloppy_orig, exact, inputs, reference) is None
    assert "reference" in value_difference(case, _job(case), exact, sloppy_orig, inputs, reference)


def test_an_original_that_writes_a_read_only_input_keeps_its_timed_digests_per_launch():
    """The timed sets restore only what the spec says is written: an original that also writes an `in` tensor
    leaves it changed from one launch to the next, so its timed digests are not taken once per view and seed."""
    from harness.job import ArgSpec, Case, Job, Options
    from harness.judge.correctness import judge_trial, new_result, run_side, trial_inputs

    case = Case(id="axpb/float32", band="decode", label="t", dtype="float32", dims={"tokens": 4, "hidden": 32},
                variant="v", bytes=0,
                args=[ArgSpec("y", "tensor", "out", [4, 32], "float32"),
                      ArgSpec("acc", "tensor", "inout", [4, 32], "float32"),
                      ArgSpec("x", "tensor", "in", [4, 32], "float32"),
                      ArgSpec("b", "tensor", "in", [32], "float32")])
    job = Job(name="t", entry="f", kernel_file="k.cuh", build=None, variants={}, cases=[case], tolerance={},
              options=Options())
    device = torch.device("cpu")
    inputs = trial_inputs(case, ("seed", 0), device)

    def writes_x(args):
        args[0].copy_(args[2] * 0.75 + args[3])
        args[1].add_(args[0])
        args[2].add_(1.0)  # x is `in`

    def keeps_x(args):
        args[0].copy_(args[2] * 0.75 + args[3])
        args[1].add_(args[0])

    written = {}
    for name, launch in (("writes", writes_x), ("keeps", keeps_x)):
        orig, _ = run_side(launch, inputs, case, device, "t")
        cand, _ = run_side(launch, inputs, case, device, "t")
        result = new_result(case)
        written[name] = judge_trial(result, case, job, ("seed", 0), inputs, orig, cand, None, None)
        assert result.correct, result.reasons
    assert written == {"writes": ["x"], "keeps": []}
    assert Checked(deterministic_orig=True).reusable_orig_digests
    assert not Checked(deterministic_orig=True, orig_writes_inputs=True).reusable_orig_digests
    assert not Checked(deterministic_orig=None).reusable_orig_digests
