"""Where Astra looks for things: an SGLang tree, a release, ASTRA_HOME, the loader files of a tree. A hostile
value is one line and its exit code; a hostile loader file is listed as skipped, never a traceback."""

import json
import os

from tests.astra.robustness.run_astra import ANSWER_S, astra, checkout, home, loader, refused


def loads(module: str, before: str = "") -> str:
    """A loader file's text: `before`, then a function that loads `module`."""
    return (f"from x import load_jit\n\n{before}\n\ndef f():\n"
            f"    return load_jit('{module}', cuda_files=['elementwise/a.cuh'])\n")


def test_sglang_src_in_a_symlink_loop(tmp_path):
    (tmp_path / "a").symlink_to(tmp_path / "b")
    (tmp_path / "b").symlink_to(tmp_path / "a")
    refused(astra("list", "--sglang-src", str(tmp_path / "a")), 3, "--sglang-src", "not a usable path",
            "Symlink loop")


def test_astra_home_of_a_user_that_does_not_exist():
    refused(astra("runs", env={"ASTRA_HOME": "~nosuchuser/x"}), 12,
            "ASTRA_HOME ~nosuchuser/x: the home directory it names cannot be found")


def test_a_release_with_a_trailing_newline_is_no_version(tmp_path):
    root = home(tmp_path)
    before = set(os.listdir(root / "sglang"))
    refused(astra("list", "--sglang", "0.5.23\n", env={"ASTRA_HOME": str(root)}), 12,
            "--sglang '0.5.23\\n' is not a version number")
    assert set(os.listdir(root / "sglang")) == before  # no folder named after it


def test_a_loader_with_an_expression_of_100k_terms_is_skipped(tmp_path):
    root = checkout(tmp_path / "tree")
    loader(root, "big", loads("big", "X = " + "+".join(["1"] * 100_000)))
    loader(root, "deep", loads("deep", "X = " + "-(" * 120 + "1" + ")" * 120))
    loader(root, "fine", loads("fine"))
    answer = astra("list", "--sglang-src", str(root))
    assert answer.code == 0 and answer.err == "", answer.err
    skipped = sorted(line for line in answer.out.splitlines() if line.startswith("skipped "))
    assert skipped[0].startswith("skipped sglang/kernels/ops/demo/big.py: RecursionError"), skipped
    assert skipped[1] == "skipped sglang/kernels/ops/demo/deep.py: nested more than 100 levels deep", skipped
    assert "\nfine " in answer.out and answer.seconds < ANSWER_S


def test_loader_files_that_are_fifos_or_endless_are_skipped(tmp_path):
    root = checkout(tmp_path / "tree")
    loader(root, "fine", loads("fine"))
    os.mkfifo(root / "python" / "sglang" / "kernels" / "ops" / "demo" / "fifo.py")
    (root / "python" / "sglang" / "kernels" / "ops" / "demo" / "zero.py").symlink_to("/dev/zero")
    answer = astra("list", "--sglang-src", str(root))
    assert answer.code == 0 and answer.err == "", answer.err
    assert "skipped sglang/kernels/ops/demo/fifo.py: a FIFO (named pipe), not a regular file" in answer.out
    assert "skipped sglang/kernels/ops/demo/zero.py: a character device, not a regular file" in answer.out
    assert answer.seconds < ANSWER_S


def test_names_sglang_builds_at_run_time_are_marked_as_templates(tmp_path):
    root = checkout(tmp_path / "tree")
    loader(root, "store", "from x import load_jit\n\ndef f(name, w):\n    return load_jit(f'store_{name}', "
                          "cuda_files=['elementwise/a.cuh'], cuda_wrappers=[(f'{w}', 'K::run')])\n")
    loader(root, "fine", loads("fine"))
    answer = astra("list", "--sglang-src", str(root))
    assert answer.code == 0 and answer.seconds < ANSWER_S, answer.err
    rows = {line.split()[0]: line for line in answer.out.splitlines() if line.startswith(("store_", "fine"))}
    assert "store_{name} [template]" in rows["store_{name}"] and "{w} [template]" in rows["store_{name}"]
    assert "[template]" not in rows["fine"]
    assert "[template]: a name SGLang builds at run time" in answer.out
    listed = json.loads(astra("list", "--json", "--sglang-src", str(root)).out)["modules"]
    assert {m["name"]: m["name_is_template"] for m in listed} == {"fine": False, "store_{name}": True}
