"""Every bad input gets one line and its documented exit code (docs/exit-codes.md), never a traceback;
bombs (huge powers, alias bombs, huge files) are answered within seconds."""

import copy
import os
import subprocess
import sys
import time

import pytest
import yaml

from astra.spec import model as spec_mod
from tests.astra.sglang.test_sglang_tree import _fake_checkout

FAST_S = 5.0


def astra(*args, env=None, timeout=60):
    began = time.monotonic()
    proc = subprocess.run([sys.executable, "-m", "astra.cli", *args], capture_output=True, text=True,
                          env={**os.environ, **(env or {})}, timeout=timeout)
    return proc.returncode, proc.stdout, proc.stderr, time.monotonic() - began


def one_line(code, err, expected_code, *needles):
    assert code == expected_code, err
    assert "Traceback" not in err
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    for needle in needles:
        assert needle in lines[0], err
    return lines[0]


@pytest.fixture(scope="module")
def rmsnorm_raw():
    return yaml.safe_load(spec_mod.spec_path("rmsnorm").read_text())


def _spec_dir(tmp_path, raw=None, text=None, name="rmsnorm"):
    folder = tmp_path / name
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "kernel.yaml").write_text(text if text is not None else yaml.safe_dump(raw))
    (folder / "reference.py").write_text("def reference(args, dims):\n    return {}\n")
    return {"ASTRA_SPECS": str(tmp_path)}


def _check(env, name="rmsnorm"):
    """`astra check` loads the spec before anything else: a malformed one is exit 5."""
    return astra("check", name, "--candidate", "/nonexistent.cuh", env=env)


# ---- spec files


def _mutate(raw, path, value):
    raw = copy.deepcopy(raw)
    target = raw
    for key in path[:-1]:
        target = target[key]
    if value is _DELETE:
        del target[path[-1]]
    else:
        target[path[-1]] = value
    return raw


_DELETE = object()

SPEC_CASES = [
    (("shapes",), 5, "`shapes` must be a mapping"),
    (("shapes", "models"), [5], "shapes.models[0] must be a mapping with `model`"),
    (("shapes", "tokens"), [-1], "shapes.tokens: -1 is not a positive integer"),
    (("shapes", "tokens"), [0, 8], "shapes.tokens: 0 is not a positive integer"),
    (("shapes", "edge"), [{"tokens": 0, "hidden": 64}], "shapes.edge[0].tokens: 0 is not a positive integer"),
    (("shapes", "models"), [{"model": "Llama-3.1-8B", "dims": {"hidden": "hidden_size - 10**6"}}],
     "is not positive"),
    (("shapes", "modles"), [], "shapes: unknown key `modles`; did you mean `models`?"),
    (("referense",), "reference.py", "top level: unknown key `referense`; did you mean `reference`?"),
    (("build", "cuda_file"), [], "build: unknown key `cuda_file`; did you mean `cuda_files`?"),
    (("source", "sha265"), "x", "source: unknown key `sha265`; did you mean `sha256`?"),
    (("arguments", 0, "shpe"), ["tokens"], "unknown key `shpe`; did you mean `shape`?"),
    (("shapes", "models", 0, "tkoens"), [1], "shapes.models[0]: unknown key `tkoens`; did you mean `tokens`?"),
    (("tolerance", "bfloat16", "atl"), 0.1, "tolerance.bfloat16: unknown key `atl`; did you mean `atol`?"),
    (("bytes",), "log2(0)", "log2(0) is undefined"),
    (("bytes",), "ceil_div(tokens, 0)", "division by zero"),
    (("bytes",), "min()", "min expected at least 1 argument"),
    (("bytes",), "10**10**10", "power too large"),
    (("bytes",), "'a' * 10**10", "repetition too long"),
    (("shapes", "constraints"), ["hidden < 'wide'"], "cannot compare"),
]


@pytest.mark.parametrize("path,value,needle", SPEC_CASES, ids=[c[2][:40] for c in SPEC_CASES])
def test_malformed_spec_is_one_line_exit_5(tmp_path, rmsnorm_raw, path, value, needle):
    code, _, err, seconds = _check(_spec_dir(tmp_path, _mutate(rmsnorm_raw, path, value)))
    one_line(code, err, 5, needle, "kernel.yaml")
    assert seconds < FAST_S + 2  # interpreter start-up included


def test_non_mapping_top_level(tmp_path):
    code, _, err, _ = _check(_spec_dir(tmp_path, text="- just\n- a list\n"))
    one_line(code, err, 5, "must hold a mapping of fields", "not list")


def test_alias_bomb_is_refused_before_expansion(tmp_path):
    lines = ['a: &a ["lol","lol","lol","lol","lol","lol","lol","lol","lol"]']
    for i, name in enumerate("bcdefghi"):
        prev = "abcdefghi"[i]
        lines.append(f"{name}: &{name} [" + ",".join([f"*{prev}"] * 9) + "]")
    code, _, err, seconds = _check(_spec_dir(tmp_path, text="\n".join(lines) + "\n"))
    one_line(code, err, 5, "anchors (&a) are not allowed")
    assert seconds < FAST_S


def test_huge_spec_is_refused_with_its_size(tmp_path):
    text = "name: rmsnorm\ndescription: |\n" + ("  " + "x" * 98 + "\n") * 170_000  # about 17 MB
    code, _, err, seconds = _check(_spec_dir(tmp_path, text=text))
    one_line(code, err, 5, "17,", "bytes", "at most 1,048,576 bytes")
    assert seconds < FAST_S


def test_spec_that_is_not_utf8(tmp_path):
    env = _spec_dir(tmp_path, text="")
    (tmp_path / "rmsnorm" / "kernel.yaml").write_bytes(b"name: \xff\xfe\x00\n")
    code, _, err, _ = _check(env)
    one_line(code, err, 5, "not UTF-8")


def test_committed_specs_still_validate():
    code, out, err, _ = astra("spec-check")
    assert code == 0, out + err
    assert out.count("ok   ") == len(spec_mod.available()) >= 6


# ---- command-line values


@pytest.mark.parametrize("args,needle", [
    (["--rounds", "-1"], "--rounds -1: must be a positive integer"),
    (["--rounds", "0"], "--rounds 0: must be a positive integer"),
    (["--wall-min", "0"], "--wall-min 0.0: must be a positive number"),
    (["--wall-min", "nan"], "--wall-min nan: must be a positive number"),
    (["--budget-tokens", "-5"], "--budget-tokens -5: must be a positive integer"),
    (["--budget-usd", "-0.5"], "--budget-usd -0.5: must be a positive number"),
])
def test_optimize_values(args, needle):
    code, _, err, _ = astra("optimize", "rmsnorm", "--dry-run", "--offline", *args)
    one_line(code, err, 12, needle)


def test_optimize_options_refuse_the_same_values_in_the_library():
    from astra.errors import AstraError
    from astra.optimize.options import OptimizeOptions

    for bad in ({"rounds": 0}, {"wall_min": -1.0}, {"budget_tokens": -1}, {"budget_usd": float("nan")},
                {"resume": " "}):
        with pytest.raises(AstraError):
            OptimizeOptions(**bad)


def test_empty_sglang_src():
    code, _, err, _ = astra("list", "--sglang-src", "")
    one_line(code, err, 12, "--sglang-src: empty")


def test_eval_with_no_kernels():
    code, _, err, _ = astra("eval", "--kernels", " , ")
    one_line(code, err, 12, "--kernels: name at least one spec")


def test_build_negative_jobs(tmp_path):
    code, _, err, _ = astra("build", "add_constant", "--jobs", "-1", "--sglang-src", str(_fake_checkout(tmp_path)))
    one_line(code, err, 12, "--jobs -1")


def test_build_set_without_equals(tmp_path):
    code, _, err, _ = astra("build", "x", "--set", "kWarps", "--sglang-src", str(_fake_checkout(tmp_path)))
    one_line(code, err, 12, "--set 'kWarps': give NAME=VALUE")


def test_json_naming_a_directory(tmp_path):
    code, _, err, _ = astra("build", "x", "--json", str(tmp_path), "--sglang-src", str(_fake_checkout(tmp_path / "s")))
    one_line(code, err, 12, "is a directory")


def test_check_json_naming_a_directory(tmp_path):
    cand = tmp_path / "k.cuh"
    cand.write_text("// kernel\n")
    code, _, err, _ = astra("check", "rmsnorm", "--candidate", str(cand), "--json", str(tmp_path))
    one_line(code, err, 12, f"--json {tmp_path}: is a directory")


def test_bench_report_naming_a_file(tmp_path):
    report = tmp_path / "r.md"
    report.write_text("")
    code, _, err, _ = astra("bench", "rmsnorm", "--report", str(report))
    one_line(code, err, 12, "--report", "is a file, not a folder")


@pytest.mark.parametrize("data,needle", [
    (b"\x7fELF\x02\x01\x01\x00\x00\x00binary", "a binary file, not CUDA source"),
    (b"// caf\xe9 au lait\n", "not UTF-8 text"),
])
def test_binary_or_non_utf8_candidate(tmp_path, data, needle):
    cand = tmp_path / "k.cuh"
    cand.write_bytes(data)
    code, _, err, _ = astra("check", "rmsnorm", "--candidate", str(cand))
    one_line(code, err, 12, needle)


@pytest.mark.parametrize("data,needle", [
    (b"\x00\x01\x02\xff binary", "not JSON"),
    (b"[1, 2, 3]", "not a verdict"),
    (b'{"status": "correct", "cases": "lol"}', "--verdict"),
])
def test_binary_or_wrong_verdict(tmp_path, data, needle):
    cand = tmp_path / "k.cuh"
    cand.write_text("// kernel\n")
    verdict = tmp_path / "v.json"
    verdict.write_bytes(data)
    code, _, err, _ = astra("patch", "rmsnorm", "--candidate", str(cand), "--verdict", str(verdict),
                            "--out", str(tmp_path / "p"))
    one_line(code, err, 12, needle)


def test_show_a_run_that_does_not_exist():
    code, _, err, _ = astra("show", "no-such-run")
    one_line(code, err, 12, "no run 'no-such-run'")


# ---- SGLang trees


def test_unparsable_loader_file_is_named_by_list(tmp_path):
    root = _fake_checkout(tmp_path)
    ops = root / "python" / "sglang" / "kernels" / "jit" / "demo"
    ops.mkdir(parents=True)
    (ops / "broken.py").write_text("from x import load_jit\n\ndef f(:\n    return load_jit('m')\n")
    (ops / "fine.py").write_text("from x import load_jit\n\ndef f():\n    return load_jit('m', cuda_files=['a.cuh'])\n")
    code, out, err, _ = astra("list", "--sglang-src", str(root))
    assert code == 0 and "Traceback" not in err, err
    skipped = [line for line in out.splitlines() if line.startswith("skipped ")]
    assert skipped == ["skipped sglang/kernels/jit/demo/broken.py: SyntaxError at line 3"], out
