"""astra.cxx.entry: a wrapper's C++ entry string read into its names and template arguments."""

from __future__ import annotations

from astra.cxx.entry import Segment, entry_parts, owner_names, segments


def test_class_and_function_with_their_arguments():
    assert entry_parts("ns::Cls<a, b>::run<c>") == ("Cls", "run", ["a", "b"], ["c"])
    assert entry_parts("FusedAddRMSNormKernel<{args}>::run") == ("FusedAddRMSNormKernel", "run", ["{args}"], [])
    assert entry_parts("fn<T, 4>") == (None, "fn", [], ["T", "4"])
    assert entry_parts("&ns::fn") == ("ns", "fn", [], [])
    assert entry_parts("plain") == (None, "plain", [], [])


def test_arguments_split_where_cxx_splits_them():
    assert entry_parts("K<std::pair<int, int>, (a < b), {dim}>::run") == \
        ("K", "run", ["std::pair<int, int>", "(a < b)", "{dim}"], [])
    assert entry_parts("ns::K<(a > b), 4>::run") == ("K", "run", ["(a > b)", "4"], [])
    assert entry_parts("Outer<Inner<2>>::run") == ("Outer", "run", ["Inner<2>"], [])


def test_segments_give_the_span_of_each_argument_list():
    entry = "&ns::Kernel<{vec}, 32>::run<false>"
    parts = segments(entry)
    assert [p.name for p in parts] == ["ns", "Kernel", "run"]
    assert parts[0] == Segment("ns", None)
    assert entry[parts[1].start:parts[1].end] == "{vec}, 32" and parts[1].args == ("{vec}", "32")
    assert entry[parts[2].start:parts[2].end] == "false"


def test_owner_names_are_the_plain_names():
    assert owner_names("&ns::Cls<a, b>::run") == ["ns", "Cls", "run"]
    assert owner_names("{kernel}<4>::run") == ["run"]
