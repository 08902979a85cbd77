"""astra.llm.templates: strict rendering of the prompt data files."""

from __future__ import annotations

import pytest

from astra.llm import templates
from astra.llm.templates import TemplateError, render, variables
from astra.optimize.edits import apply_reply

ROLES = {
    "testing_spec": ["dtypes", "models"],
    "testing_draft": ["kernel", "sglang_version", "export", "entry", "kernel_file", "draft", "notes", "source",
                      "wrapper", "call_sites"],
    "testing_repair": ["kernel", "sglang_version", "export", "entry", "kernel_file", "probe", "draft", "notes",
                       "source", "wrapper", "call_sites"],
    "testing_refused": ["problems"],
    "testing": ["kernel", "sglang_version", "kernel_file", "description", "arguments", "dims", "constraints",
                "spec_shapes", "models", "source", "max_shapes", "dim_names"],
    "profiling": ["kernel", "sglang_version", "kernel_file", "gpu", "environment", "measurements", "bands",
                  "resources", "ncu", "source"],
    "planning": ["kernel", "sglang_version", "kernel_file", "gpu", "description", "budget", "rounds_left",
                 "original_source", "best", "source", "measurements", "bands", "profile", "ncu", "failures",
                 "history", "band_choices"],
    "coding": ["kernel_file", "kernel", "sglang_version", "plan", "target_band", "band_shapes", "measurements",
               "failures", "exports", "feedback", "source"],
    "system": ["acceptance"],
}


def test_every_template_and_its_variables():
    assert templates.names() == sorted(ROLES)
    for name, expected in ROLES.items():
        assert variables(name) == expected, name
        text = render(name, **{v: f"<{v}>" for v in expected})
        assert "${" not in text
        for v in expected:
            assert f"<{v}>" in text


def test_missing_and_unused_values_are_named():
    values = {v: "x" for v in ROLES["coding"]}
    del values["plan"]
    with pytest.raises(TemplateError, match=r"'coding': missing value\(s\) for plan; it takes: kernel_file"):
        render("coding", **values)
    with pytest.raises(TemplateError, match=r"unused value\(s\) soruce \(no such placeholder\)"):
        render("coding", **{v: "x" for v in ROLES["coding"]}, soruce="x")
    with pytest.raises(TemplateError, match="no prompt template 'debugging'.*templates: coding, planning"):
        render("debugging")


def test_value_conversion_and_dollar_escape(tmp_path, monkeypatch):
    (tmp_path / "t.md").write_text("a=${a} b=${b} c=${c} d=${d} cost $$5 and $x stay\n")
    monkeypatch.setattr(templates, "PROMPTS", tmp_path)
    templates._load.cache_clear()
    try:
        text = render("t", a="s", b=3, c=None, d={"decode": [1, 2]})
        assert text.startswith("a=s b=3 c=(not available) d={\n  \"decode\": [\n    1,")
        assert text.endswith("cost $5 and $x stay\n")
        (tmp_path / "bad.md").write_text("x ${ kernel } y\n")
        with pytest.raises(TemplateError, match=r"malformed placeholder \$\{ kernel \}"):
            render("bad", kernel="k")
    finally:
        templates._load.cache_clear()


def test_coding_template_example_is_a_valid_edit():
    """The format shown to the model is the format the parser accepts."""
    text = render("coding", **{v: f"<{v}>" for v in ROLES["coding"]})
    example = text[text.index("<<<<<<< SEARCH"):text.index(">>>>>>> REPLACE") + len(">>>>>>> REPLACE")]
    result = apply_reply("exact lines from the current file\n", example)
    assert result.ok and result.new_text == "the lines that replace them\n"


def test_the_system_prompt_states_the_acceptance_rule_from_its_constants():
    from harness.judge.acceptance import MIN_GAIN, SIGNIFICANCE, SLOWDOWN_THRESHOLD, policy_text

    text = render("system", acceptance=policy_text())
    assert f"more than {100 * SLOWDOWN_THRESHOLD:g}% slower" in text
    assert f"max({100 * MIN_GAIN:g}%, {SIGNIFICANCE:g} standard errors" in text
