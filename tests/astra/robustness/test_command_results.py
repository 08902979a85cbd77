"""Commands that said the wrong thing: `parse-check` exited 0 with a failure, `spec-check --draft NAME` judged
the reviewed spec instead of the draft, `extract --export` and `eval --kernels` took names that are not there
or twice."""

import shutil

from astra.spec import model as spec_mod
from tests.astra.robustness.run_astra import ANSWER_S, astra, checkout, home, loader, refused


def test_parse_check_fails_on_one_failure_in_twenty_one(tmp_path):
    """(1 in 21 is under the 5% it used to forgive.) libclang parses every source: this is the work, not a
    refusal, so its time is not held to the refusals' bound."""
    root = checkout(tmp_path / "tree")
    csrc = root / "python" / "sglang" / "kernels" / "jit" / "csrc" / "elementwise"
    calls = []
    for i in range(20):
        (csrc / f"k{i}.cuh").write_text(f"#pragma once\nstruct K{i} {{ static void run(int x) {{}} }};\n")
        calls.append(f"def f{i}():\n    return load_jit('m{i}', cuda_files=['elementwise/k{i}.cuh'])\n")
    (csrc / "bad.cuh").write_text("#pragma once\nstruct Bad { int x = ; };\n")
    calls.append("def fb():\n    return load_jit('bad', cuda_files=['elementwise/bad.cuh'])\n")
    loader(root, "many", "from x import load_jit\n\n" + "\n".join(calls))
    answer = astra("parse-check", "--sglang-src", str(root))
    assert answer.code == 1 and "Traceback" not in answer.err, answer.out + answer.err
    assert "FAIL elementwise/bad.cuh" in answer.out and "20/21 sm_90a-buildable sources" in answer.out


def test_spec_check_draft_judges_the_draft(tmp_path):
    root = home(tmp_path)
    draft = root / "drafts" / "rmsnorm"
    draft.mkdir(parents=True)
    reviewed = spec_mod.spec_path("rmsnorm")
    shutil.copy(reviewed.parent / "reference.py", draft / "reference.py")
    (draft / "kernel.yaml").write_text(reviewed.read_text().replace("dtypes: [bfloat16, float16]",
                                                                    "dtypes: [bfloat16]  # TODO(review): fp16?"))
    answer = astra("spec-check", "--draft", "rmsnorm", env={"ASTRA_HOME": str(root)})
    assert answer.code == 0 and answer.err == "", answer.err
    first, note = answer.out.splitlines()[:2]
    assert first.startswith(f"ok   rmsnorm (draft {draft / 'kernel.yaml'}): 58 cases") and first.endswith("bfloat16")
    assert note.startswith("     note: line ") and "fp16?" in note and answer.seconds < ANSWER_S
    reviewed_answer = astra("spec-check", "rmsnorm", env={"ASTRA_HOME": str(root)})  # without --draft: the reviewed
    assert reviewed_answer.out.startswith("ok   rmsnorm: 116 cases"), reviewed_answer.out


def test_eval_names_each_kernel_once():
    refused(astra("eval", "--kernels", "rmsnorm,qknorm,rmsnorm", "--dry-run", "--offline"), 12,
            "--kernels rmsnorm,qknorm,rmsnorm: rmsnorm named more than once")


def test_extract_export_that_is_not_there(tmp_path):
    root = checkout(tmp_path / "tree")
    loader(root, "demo", "from x import load_jit\n\ndef f():\n    return load_jit('demo', "
                         "cuda_files=['elementwise/k.cuh'], cuda_wrappers=[('run', 'K::run')])\n")
    (root / "python/sglang/kernels/jit/csrc/elementwise/k.cuh").write_text("#pragma once\nstruct K {};\n")
    home_dir = home(tmp_path)
    answer = astra("extract", "demo", "--export", "nope", "--no-build-check", "--sglang-src", str(root),
                   env={"ASTRA_HOME": str(home_dir)})
    refused(answer, 12, "--export nope: module demo has no export of that name (its exports: run)")
    assert not (home_dir / "drafts" / "demo").exists() and not (home_dir / "snapshots").exists()
