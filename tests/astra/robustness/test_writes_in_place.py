"""What a command writes stays where it belongs: a module name from a hostile tree cannot put `astra
extract`'s snapshot (or draft) outside $ASTRA_HOME, and `recheck` never writes its report over a patch it
reads."""

import os

import pytest

from astra import paths
from astra.sglang import tree as sglang_tree
from astra.spec import extract
from tests.astra.robustness.run_astra import ANSWER_S, astra, checkout, files_under, home, loader, refused

HOSTILE = "../../../../elsewhere"


def _hostile_tree(root):
    tree = checkout(root)
    (tree / "python/sglang/kernels/jit/csrc/elementwise/k.cuh").write_text(
        "#pragma once\nstruct K { static void run(int x) {} };\n")
    loader(tree, "evil", f"from x import load_jit\n\ndef f():\n    return load_jit({HOSTILE!r}, "
                         "cuda_files=['elementwise/k.cuh'], cuda_wrappers=[('run', 'K::run')])\n")
    return tree


def test_a_snapshot_named_by_a_hostile_module_stays_in_astra_home(tmp_path, monkeypatch):
    root = tmp_path / "a" / "b" / "c" / "home"  # `snapshots/../../../../elsewhere` would be tmp_path/a/elsewhere
    monkeypatch.setenv("ASTRA_HOME", str(root))
    tree = sglang_tree.from_source(_hostile_tree(tmp_path / "tree"))
    kernel = tree.csrc_dir / "elementwise" / "k.cuh"
    snap = extract.snapshot(tree, HOSTILE, [kernel])
    assert snap.resolve().is_relative_to((root / "snapshots").resolve()) and (snap / "manifest.json").is_file()
    assert not (tmp_path / "a" / "elsewhere").exists()
    assert paths.safe_name("..") == "_" and paths.safe_name("../x") == "_x" and paths.safe_name("a/b{c}") == "a_b_c_"


def test_extract_of_a_hostile_module_writes_only_under_astra_home(tmp_path):
    """The real command (libclang reads the kernel: this takes longer than the refusals elsewhere)."""
    root = home(tmp_path / "a" / "b" / "c")
    tree = _hostile_tree(tmp_path / "tree")
    before = files_under(tmp_path) - files_under(root)
    answer = astra("extract", HOSTILE, "--no-build-check", "--sglang-src", str(tree), env={"ASTRA_HOME": str(root)})
    assert answer.code == 0 and "Traceback" not in answer.err, answer.err
    written = [line.split(":", 1)[1].split("(")[0].strip() for line in answer.out.splitlines()
               if line.startswith(("spec draft:", "snapshot:"))]
    assert len(written) == 2 and all(os.path.realpath(p).startswith(os.path.realpath(root)) for p in written)
    assert files_under(tmp_path) - files_under(root) == before
    assert not (tmp_path / "a" / "elsewhere").exists()


@pytest.mark.parametrize("flag", ["--markdown", "--json"])
def test_recheck_never_writes_over_a_patch_it_reads(tmp_path, flag):
    patch = tmp_path / "k.patch"
    patch.write_text("From 0 Mon Sep 17 00:00:00 2001\nSubject: a patch\n")
    answer = astra("recheck", str(patch), "--no-gpu", flag, str(patch), "--sglang-src", str(checkout(tmp_path / "t")))
    refused(answer, 12, f"{flag} {patch}: is the patch {patch} being rechecked; write the report to another file")
    assert patch.read_text() == "From 0 Mon Sep 17 00:00:00 2001\nSubject: a patch\n"


def test_recheck_reports_need_a_file_each(tmp_path):
    out = tmp_path / "report"
    answer = astra("recheck", str(tmp_path / "k.patch"), "--json", str(out), "--markdown", str(out))
    refused(answer, 12, f"--json and --markdown both name {out}")
    assert answer.seconds < ANSWER_S
