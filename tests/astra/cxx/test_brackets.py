"""astra.cxx.brackets: one rule for which bracket closes which, on text and on token spellings."""

from __future__ import annotations

import pytest

from astra.cxx.brackets import closing, enclosing, levels, opening, spans, split_top
from astra.cxx.text import blank


def test_angle_brackets_are_comparisons_inside_parentheses():
    assert closing("<(a<b)>", 0) == 6
    assert closing("<(a > b), 4> x", 0) == 11
    entry = "Kernel<std::conditional_t<(N > 4), A, B>, 2>::run"
    assert closing(entry, 6) == entry.index(">::")
    assert split_top("(a < b), c > d") == ["(a < b)", "c > d"]
    assert split_top("f(x < y, z), g(a > b)") == ["f(x < y, z)", "g(a > b)"]


def test_nested_templates_close_with_double_angles_in_text_and_in_tokens():
    assert closing("A<B<C>>", 1) == 6 and closing("A<B<C>>", 3) == 5
    tokens = ["A", "<", "B", "<", "C", ">>", ",", "D"]
    assert closing(tokens, 1) == 5 and closing(tokens, 3) == 5
    assert split_top(tokens) == [["A", "<", "B", "<", "C", ">>"], ["D"]]
    assert split_top("std::pair<int, std::array<int, 4>>, x") == ["std::pair<int, std::array<int, 4>>", "x"]


def test_a_less_than_is_a_comparison_when_spelled_as_one_or_when_nothing_closes_it():
    assert split_top('n < 4, "msg"') == ["n < 4", '"msg"']  # spaced on both sides
    assert split_top('n<4, "msg"') == ["n<4", '"msg"']  # no `>` closes it
    assert split_top(["n", "<", "4", ",", '"msg"']) == [["n", "<", "4"], ['"msg"']]
    assert split_top("kN < 4 && kM > 2, m") == ["kN < 4 && kM > 2", "m"]
    assert split_top("a << 2, b <= c, d") == ["a << 2", "b <= c", "d"]
    assert split_top("x->y, z >= 1, w") == ["x->y", "z >= 1", "w"]
    assert split_top("is_same_v<A, B>, x") == ["is_same_v<A, B>", "x"]


def test_a_semicolon_or_an_outer_closer_ends_an_angle_list():
    assert closing("a < b; c > d", 2) is None
    assert closing("f(a < b) > c", 4) is None  # scanning from the `<`: the `)` closes something outside
    assert closing("template <int N> struct S {", 9) == 15


def test_brackets_inside_strings_and_comments_count_once_the_text_is_blanked():
    text = 'f(")", /* ) ] */ g(\'(\'), h) // )\n'
    assert closing(text, 1) != closing(blank(text), 1)
    assert closing(blank(text), 1) == text.index("h)") + 1
    assert split_top(blank('a, "b, c", d')) == ["a", '"    "', "d"]


def test_closers_skip_a_mismatch_and_unclosed_brackets_give_none():
    assert closing("(a ] b)", 0) == 6
    assert closing("(a (b)", 0) is None
    assert closing("{a; (b) }", 0, limit=5) is None
    with pytest.raises(ValueError):
        closing("abc", 0)


def test_opening_reads_backwards_and_enclosing_lists_what_is_open():
    code = "f(a[1], (b < c))"
    assert opening(code, len(code) - 1) == 1 and opening(code, 5) == 3
    assert opening(["(", "x", "[", "]", ")"], 4) == 0
    assert enclosing("void f() { if (x) { y", 21) == [9, 18]
    assert enclosing("template <int N> struct S { int a[N", 35) == [26, 33]


def test_levels_give_each_item_its_depth_and_role():
    assert list(levels("a<b>(c)")) == [(0, 0, ""), (1, 0, "open"), (2, 1, ""), (3, 0, "close"),
                                       (4, 0, "open"), (5, 1, ""), (6, 0, "close")]


def test_spans_and_separators():
    assert spans("a, (b, c), d") == [(0, 1), (2, 9), (10, 12)]
    assert spans("f(x, y)", 2, 6) == [(2, 3), (4, 6)]
    assert split_top("") == [] and split_top("  ") == [] and split_top("a,") == ["a"]
    assert split_top("{1, 2,}") == ["{1, 2,}"] and split_top("1, , 2") == ["1", "", "2"]
    assert split_top("a && (b && c) && d<e && f>", "&&") == ["a", "(b && c)", "d<e && f>"]
    assert split_top("ns::Cls<a::b, c>::run", "::") == ["ns", "Cls<a::b, c>", "run"]
