import pytest

from astra.spec.expr import ExprError, evaluate, names_in, render


def test_arithmetic_and_functions():
    names = {"tokens": 128, "hidden": 4096, "dtype": "bfloat16"}
    assert evaluate("(4 * tokens * hidden + hidden) * elt(dtype)", names) == (4 * 128 * 4096 + 4096) * 2
    assert evaluate("ceil_div(hidden, 3)", names) == 1366
    assert evaluate("'Warp' if hidden in (64, 128, 256) else 'Block'", names) == "Block"


def test_render_template_with_booleans():
    names = {"hidden": 512, "dtype": "float16"}
    assert render("K<{hidden}, {hidden > 256}, {cpp_dtype(dtype)}>::run", names) == "K<512, true, fp16_t>::run"


@pytest.mark.parametrize("expr,msg", [
    ("tokens +", "not a valid expression"),
    ("missing * 2", "unknown name 'missing'"),
    ("__import__('os')", "unknown function"),
    ("tokens.real", "unsupported syntax"),
    ("elt('complex7')", "unknown dtype"),
])
def test_errors_name_the_problem(expr, msg):
    with pytest.raises(ExprError, match=msg):
        evaluate(expr, {"tokens": 1})


def test_names_in():
    assert names_in("tokens * hidden + elt(dtype)") == {"tokens", "hidden", "dtype"}
