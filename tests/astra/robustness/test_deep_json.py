"""JSON and YAML that nest deeper than astra.input_files.MAX_NESTING (64 levels) are refused by that limit,
one line, exit 12, before any parser or walker can run out of stack."""

import json

from astra import input_files
from tests.astra.robustness.run_astra import astra, refused

DEEP = "[" * 100_000 + "]" * 100_000


def test_a_deep_serving_mix(tmp_path):
    mix = tmp_path / "mix.json"
    mix.write_text('{"1": ' + DEEP + "}")
    refused(astra("survey", "--report-only", "--mix", str(mix), "--out", str(tmp_path)), 12,
            f"--mix {mix}: not valid YAML at line 1: nested more than 64 levels deep")


def test_a_deep_survey_record(tmp_path):
    store = tmp_path / "store"
    store.mkdir()
    (store / "rmsnorm.json").write_text('{"format": "astra-survey-record/1", "name": "rmsnorm", "verdict": '
                                        + DEEP + "}")
    refused(astra("survey", "--report-only", "--out", str(store)), 12, "holds no survey record",
            "rmsnorm.json: not a survey record (nested more than 64 levels deep")


def test_a_deep_verdict(tmp_path):
    candidate = tmp_path / "k.cuh"
    candidate.write_text("// kernel\n")
    verdict = tmp_path / "v.json"
    verdict.write_text('{"status": "correct", "cases": ' + DEEP + "}")
    refused(astra("patch", "rmsnorm", "--candidate", str(candidate), "--verdict", str(verdict), "--out",
                  str(tmp_path / "p")), 12, f"--verdict {verdict}: nested more than 64 levels deep")
    assert not (tmp_path / "p").exists()


def test_the_limit_is_exact():
    at_limit = "[" * input_files.MAX_NESTING + "]" * input_files.MAX_NESTING
    assert input_files.nesting(input_files.parse_json(at_limit, "x")) == input_files.MAX_NESTING
    assert input_files.nesting(input_files.parse_yaml(at_limit, "x")) == input_files.MAX_NESTING
    for text in ("[" + at_limit + "]", json.dumps({"a": json.loads(at_limit)})):
        for parse in (input_files.parse_json, input_files.parse_yaml):
            try:
                parse(text, "x")
            except input_files.Refused as err:
                assert "nested more than 64 levels deep" in err.why
            else:
                raise AssertionError(f"{parse.__name__} took {input_files.MAX_NESTING + 1} levels")
