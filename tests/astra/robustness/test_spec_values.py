"""A kernel spec's values that used to be accepted silently (or blew the stack) are mistakes with one line each
(exit 5): unbounded tolerances, a key given twice, bytes that are not positive, a dtype twice, a suite too large
to run, an expression nested too deep; a long flat expression within the documented 4,000 characters works,
and a dim listed in `flags` takes 0 and 1."""

import copy

import pytest

from astra.spec import model as spec_mod
from astra.spec.expr import MAX_EXPR, evaluate
from tests.astra.robustness.run_astra import ANSWER_S, astra, refused, rmsnorm_raw, spec_folder


def check(env):
    """`astra check` loads the spec before anything else: a malformed one is exit 5."""
    return astra("check", "rmsnorm", "--candidate", "/nonexistent.cuh", env=env)


def changed(change) -> dict:
    raw = copy.deepcopy(rmsnorm_raw())
    change(raw)
    return raw


def _set(path, value):
    def change(raw):
        target = raw
        for key in path[:-1]:
            target = target[key]
        target[path[-1]] = value
    return change


CASES = [
    (_set(("tolerance", "bfloat16", "atol"), float("inf")),
     "tolerance.bfloat16.atol must be a finite number, not inf"),
    (_set(("tolerance", "float16", "rtol"), float("nan")), "tolerance.float16.rtol must be a finite number, not nan"),
    (_set(("bytes",), "0"), "bytes '0' gives 0; the bytes the kernel must move are a positive number"),
    (_set(("bytes",), "-tokens * hidden"), "bytes '-tokens * hidden' gives -4096"),
    (_set(("dtypes",), ["bfloat16", "float16", "bfloat16"]), "dtypes: bfloat16 is listed twice"),
    (_set(("shapes", "tokens"), list(range(1, 90_001))),
     "shapes: 540,010 shapes x 2 dtype(s) = 1,080,020 cases; a suite is at most 4,096 cases"),
    (_set(("derived",), {"deep": "-(" * 150 + "1" + ")" * 150}), "nested more than 100 levels deep"),
]


@pytest.mark.parametrize("change,needle", CASES, ids=[needle[:40] for _, needle in CASES])
def test_a_bad_value_is_one_line_exit_5(tmp_path, change, needle):
    refused(check(spec_folder(tmp_path, changed(change))), 5, "kernel.yaml: ", needle)


def test_a_top_level_key_given_twice_is_refused(tmp_path):
    text = spec_mod.spec_path("rmsnorm").read_text()
    text += "tolerance:\n  bfloat16: {atol: 1.0, rtol: 1.0, floor: 1.0}\n"  # a looser copy at the end
    refused(check(spec_folder(tmp_path, text=text)), 5, "not valid YAML at line",
            "key `tolerance` appears twice in one mapping", "the later value would silently win")


def test_a_flat_expression_of_4000_characters_is_evaluated(tmp_path):
    flat = "+".join(["1"] * ((MAX_EXPR + 1) // 2))
    assert len(flat) == MAX_EXPR - 1 and evaluate(flat, {}) == (MAX_EXPR + 1) // 2
    env = spec_folder(tmp_path, changed(_set(("derived",), {"flat": flat})))
    answer = astra("spec-check", "rmsnorm", env=env)
    assert answer.code == 0 and answer.out.startswith("ok   rmsnorm: 116 cases"), answer.out + answer.err
    assert answer.seconds < ANSWER_S


# ---- a dim that is a 0/1 switch: `flags`


def _with_neox(raw: dict, value: int, flags: list | None) -> dict:
    """rmsnorm with a dim `neox`: 1 for every model, `value` in the first edge shape, 1 in the others."""
    raw = copy.deepcopy(raw)
    raw["dims"]["neox"] = "1: the GPT-NeoX rotary layout, 0: GPT-J"
    for entry in raw["shapes"]["models"]:
        entry["dims"]["neox"] = "1"
    for i, entry in enumerate(raw["shapes"]["edge"]):
        entry["neox"] = value if i == 0 else 1
    if flags is not None:
        raw["flags"] = flags
    return raw


def test_a_flag_dim_takes_zero(tmp_path):
    answer = astra("spec-check", "rmsnorm", env=spec_folder(tmp_path, _with_neox(rmsnorm_raw(), 0, ["neox"])))
    assert answer.code == 0 and answer.out.startswith("ok   rmsnorm: 116 cases"), answer.out + answer.err
    assert answer.seconds < ANSWER_S


@pytest.mark.parametrize("value,flags,needle", [
    (0, None, "shapes.edge[0].neox: 0 is not a positive integer"),
    (2, ["neox"], "shapes.edge[0].neox: 2 is not 0 or 1 (a flag)"),
    (1, ["nexo"], "flags: 'nexo' is not one of the dims (tokens, hidden, neox)"),
    (1, ["tokens"], "flags: 'tokens' is the token dim"),
    (1, "neox", "`flags` must be a list of dim names"),
    (1, ["neox", "neox"], "flags: 'neox' is listed twice"),
])
def test_flags_are_checked(tmp_path, value, flags, needle):
    refused(check(spec_folder(tmp_path, _with_neox(rmsnorm_raw(), value, flags))), 5, needle)


def test_a_model_field_that_gives_a_flag_2_is_named():
    raw = _with_neox(rmsnorm_raw(), 1, ["neox"])
    raw["shapes"]["models"][0]["dims"]["neox"] = "tp + 1"
    with pytest.raises(spec_mod.ExprError, match="dims.neox = 'tp \\+ 1'.*2 is not 0 or 1"):
        spec_mod.KernelSpec(spec_mod.spec_path("rmsnorm"), raw).shape_cases()
