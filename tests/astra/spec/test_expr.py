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


@pytest.mark.parametrize("expr,needle", [
    ("log2(0)", "log2(0) is undefined"),
    ("log2('x')", "log2 needs a number"),
    ("ceil_div(x, 0)", "division by zero"),
    ("round_up(x, 0)", "division by zero"),
    ("x / 0", "division by zero"),
    ("0 ** -1", "division by zero"),
    ("min()", "min expected at least 1 argument"),
    ("max(1, 'a')", "max()"),
    ("x < 'a'", "cannot compare int with str"),
    ("'a' in 3", "cannot compare str with int"),
    ("-'a'", "bad operand type"),
    ("abs('a')", "abs()"),
    ("(-8) ** 0.5", "a result of type complex"),
    ("1e308 * 10", "not a finite number"),
    ("10.0 ** 400", "numeric overflow"),
    ("x @ 2", "unsupported syntax"),
    ("x << 64", "shift amount 64 is outside 0..63"),
    ("x >> -1", "shift amount -1 is outside 0..63"),
    ("1.5 & x", "bitwise operators need integers, not float"),
    ("x | 'a'", "bitwise operators need integers, not str"),
    ("True << 1", "bitwise operators need integers, not bool"),
    ("~1.0", "~ needs an integer, not float"),
    ("(2 ** 63) << 63", "larger than 2**64"),
    ("(1 << 63) << 63 << 63 << 63", "larger than 2**64"),
    ("10 ** 10 ** 10", "power too large"),
    ("2 ** 65", "power too large"),
    ("(2 ** 64) * (2 ** 64)", "larger than 2**64"),
    ("'a' * 10 ** 10", "repetition too long"),
    ("(1,) * 5000", "repetition too long"),
    ("'ab' * 2048 + 'c'", "longer than 4096"),
    ("9" * 5000, "longer than 4000 characters"),
    ("(" * 300 + "1" + ")" * 300, ""),
])
def test_every_failure_is_an_expr_error_named_and_fast(expr, needle):
    import time

    from astra.errors import AstraError

    began = time.monotonic()
    with pytest.raises(ExprError) as err:
        evaluate(expr, {"x": 3})
    assert time.monotonic() - began < 1.0
    assert needle in str(err.value)
    assert str(err.value).startswith(repr(expr)[:20])
    assert isinstance(err.value, AstraError) and err.value.exit_code == 5


def test_bounds_are_inclusive():
    assert evaluate("2 ** 64", {}) == 2**64
    assert evaluate("'a' * 4096", {}) == "a" * 4096


def test_bitwise_operators():
    names = {"hidden": 4096, "flags": 0b1011}
    assert evaluate("hidden & (hidden - 1) == 0", names) is True  # a power of two
    assert evaluate("flags & 2", names) == 2 and evaluate("flags | 4", names) == 15
    assert evaluate("flags ^ 0b1111", names) == 0b0100 and evaluate("~flags", names) == -12
    assert evaluate("1 << 63", names) == 2**63 and evaluate("hidden >> 12", names) == 1
    assert evaluate("(hidden >> 3) << 3 == hidden", names) is True
    assert evaluate("(flags & 1 == 1) | False", names) is True  # & | ^ also combine booleans
    assert render("K<{hidden >> 7}>", names) == "K<32>"
