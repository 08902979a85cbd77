"""Output on a terminal that cannot show `…` or `é` (LC_ALL=C, PYTHONIOENCODING=ascii): the characters are
printed as escapes, the command ends as it would elsewhere, never with a UnicodeEncodeError."""

import pytest

from tests.astra.robustness.run_astra import ANSWER_S, astra, checkout, loader, refused, rmsnorm_raw, spec_folder

ASCII_TERMINALS = {
    "PYTHONIOENCODING=ascii": {"PYTHONIOENCODING": "ascii"},
    "LC_ALL=C": {"LC_ALL": "C", "LANG": "C", "PYTHONIOENCODING": "", "PYTHONUTF8": "0", "PYTHONCOERCECLOCALE": "0"},
}


@pytest.fixture(params=list(ASCII_TERMINALS), ids=list(ASCII_TERMINALS))
def terminal(request):
    return ASCII_TERMINALS[request.param]


def test_list_cuts_long_cells_with_an_escaped_ellipsis(tmp_path, terminal):
    root = checkout(tmp_path / "tree")
    loader(root, "demo", "from x import load_jit\n\ndef f():\n    return load_jit('demo', cuda_files=["
                         f"'elementwise/{'a' * 80}.cuh'])\n")
    answer = astra("list", "--sglang-src", str(root), env=terminal)
    assert answer.code == 0 and answer.err == "", answer.err
    assert "\\u2026" in answer.out and "demo" in answer.out and answer.seconds < ANSWER_S


def test_spec_check_and_check_print_foreign_letters_as_escapes(tmp_path, terminal):
    raw = rmsnorm_raw()
    raw["référence"] = raw.pop("reference")
    env = {**spec_folder(tmp_path, raw), **terminal}
    answer = astra("spec-check", "rmsnorm", env=env)
    assert answer.code == 1 and "Traceback" not in answer.err, answer.err
    assert "unknown key `r\\xe9f\\xe9rence`" in answer.out and answer.seconds < ANSWER_S
    refused(astra("check", "rmsnorm", "--candidate", "/nonexistent.cuh", env=env), 5, "r\\xe9f\\xe9rence")
