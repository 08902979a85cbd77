"""astra.cxx.text: comments and the contents of literals blanked, every offset and line break kept."""

from __future__ import annotations

from astra.cxx.text import blank


def _spaced(text: str, *parts: str) -> str:
    """`text` with each of `parts` (in order, each after the last) replaced by as many spaces."""
    pos = 0
    for part in parts:
        at = text.index(part, pos)
        text = text[:at] + " " * len(part) + text[at + len(part):]
        pos = at + len(part)
    return text


def _same_shape(text: str, code: str) -> bool:
    return len(code) == len(text) and [i for i, c in enumerate(code) if c == "\n"] == \
        [i for i, c in enumerate(text) if c == "\n"]


def test_comments_become_spaces_and_literals_keep_their_quotes():
    text = 'int a = f("x, (y"); // a ) comment {\n/* b\n ] */ char c = \'{\';\n'
    code = blank(text)
    assert _same_shape(text, code)
    assert code == _spaced(text, "x, (y", "// a ) comment {", "/* b", " ] */", "{")


def test_a_line_comment_runs_on_past_a_trailing_backslash():
    text = "// one \\\n two {\nint x;"
    assert blank(text) == "        \n      \nint x;"


def test_raw_strings_end_only_at_their_own_delimiter():
    text = 'auto s = R"py(a ")" b\n{ c)py"; int y;'
    code = blank(text)
    assert _same_shape(text, code)
    assert code.startswith('auto s = R"') and code.endswith('"; int y;') and "{" not in code
    assert blank('x = u8R"(q)"; z') == 'x = u8R"   "; z'


def test_digit_separators_are_not_character_literals():
    text = "constexpr int kBig = 1'000'000; int h = 0xFF'FF; char q = '}';"
    assert blank(text) == "constexpr int kBig = 1'000'000; int h = 0xFF'FF; char q = ' ';"


def test_escapes_and_an_unclosed_literal_stop_where_cxx_stops_them():
    assert blank(r'f("a\"b{"); g();') == 'f("' + " " * 5 + '"); g();'
    assert blank("#error don't {\nint x;") == "#error don'   \nint x;"  # ends at the line break
    assert blank("a /* never closed {") == "a                  "


def test_blanking_twice_changes_nothing():
    text = 'x = "a" /* c */ + \'b\'; // d\ny = R"(e)";'
    assert blank(blank(text)) == blank(text)
