"""The spec fields real SGLang kernels need (docs/spec-format.md): optional tensors (`present`), strided
views (`row_stride`), the `scratch` role, tolerance entries keyed by an output's dtype, `shapes.exclude`,
review markers in `astra spec-check`, and the source check of check/bench/optimize."""

from __future__ import annotations

import copy
import hashlib
import os
import re
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
import yaml

from astra.errors import SpecError
from astra.spec import jobs
from astra.spec import model as spec
from astra.spec.expr import FUNCTIONS
from astra.spec.source_check import require_same_source

ROOT = Path(__file__).resolve().parents[3]


@pytest.fixture
def qknorm_raw():
    return yaml.safe_load(spec.spec_path("qknorm").read_text())


def _write(tmp_path, raw, name="qknorm", text=None):
    folder = tmp_path / name
    folder.mkdir(exist_ok=True)
    (folder / "kernel.yaml").write_text(text if text is not None else yaml.safe_dump(raw, sort_keys=False))
    (folder / "reference.py").write_text("def reference(args, dims):\n    return {}\n")
    return folder / "kernel.yaml"


def _arg(raw, name):
    return next(a for a in raw["arguments"] if a["name"] == name)


def _problems(tmp_path, raw) -> list[str]:
    with pytest.raises(SpecError) as err:
        spec.load(_write(tmp_path, raw))
    assert err.value.exit_code == 5
    return err.value.problems


def _case(case_list, dtype="bfloat16", **dims):
    return next(c for c in case_list if c.dtype == dtype and all(c.dims[k] == v for k, v in dims.items()))


# ---------------------------------------------------------------- present, row_stride, scratch: resolved


def test_present_row_stride_and_scratch_resolve_into_the_job(tmp_path, qknorm_raw):
    raw = copy.deepcopy(qknorm_raw)
    fused = "(q_heads + 2 * kv_heads) * head_dim"
    _arg(raw, "q")["row_stride"] = fused
    _arg(raw, "k")["row_stride"] = fused
    _arg(raw, "k_weight")["present"] = "head_dim != 64"
    raw["arguments"].insert(4, {"name": "ws", "kind": "tensor", "shape": ["tokens"], "dtype": "int32",
                                "role": "scratch", "init": {"dist": "const", "value": 0}, "present": True})
    case_list, _ = jobs.cases(spec.load(_write(tmp_path, raw)))
    case = _case(case_list, tokens=127, q_heads=3, kv_heads=2, head_dim=128)
    args = {a.name: a for a in case.args}
    assert args["q"].row_stride == args["k"].row_stride == (3 + 2 * 2) * 128
    assert args["q"].shape == [127, 3, 128] and args["q_weight"].row_stride is None
    assert args["k_weight"].present is True and args["ws"].role == "scratch" and args["ws"].present
    small = {a.name: a for a in _case(case_list, tokens=127, q_heads=4, kv_heads=1, head_dim=64).args}
    assert small["k_weight"].present is False and small["k_weight"].shape == []
    assert [a.name for a in _case(case_list, tokens=127, head_dim=64).tensors()] == ["q", "k", "q_weight", "ws"]


def test_an_alias_takes_its_targets_presence_and_stride(tmp_path):
    raw = yaml.safe_load(spec.spec_path("rmsnorm").read_text())
    _arg(raw, "input")["row_stride"] = "hidden * 3"
    _arg(raw, "out")["alias"] = "input"
    case = jobs.cases(spec.load(_write(tmp_path, raw, name="rmsnorm")))[0][0]
    args = {a.name: a for a in case.args}
    assert args["out"].role == "alias" and args["out"].row_stride == args["input"].row_stride == 3 * case.dims["hidden"]
    _arg(raw, "out")["present"] = False
    assert any("an alias is the very tensor of 'input'; give `present` there" in p for p in _problems(tmp_path, raw))


@pytest.mark.parametrize("key, value, needle", [
    ("present", 3, "`present` must be true, false or an expression over dims"),
    ("present", "widgets > 1", "present 'widgets > 1' uses unknown name(s) ['widgets']"),
    ("present", "head_dim", "present 'head_dim' gives 128, not true or false"),
    ("row_stride", -4, "`row_stride` must be a positive integer or an expression over dims"),
    ("row_stride", "head_dim", "q: row_stride 'head_dim' is 128, below the 4096 elements of one row (32 x 128)"),
    ("row_stride", "head_dim - head_dim", "is not positive"),
    ("row_stride", "q_heads * gadgets", "unknown name(s) ['gadgets']"),
])
def test_bad_present_and_row_stride_are_explained(tmp_path, qknorm_raw, key, value, needle):
    raw = copy.deepcopy(qknorm_raw)
    _arg(raw, "q")[key] = value
    problems = _problems(tmp_path, raw)
    assert any(needle in p for p in problems), problems


def test_present_and_row_stride_belong_to_tensors(tmp_path, qknorm_raw):
    raw = copy.deepcopy(qknorm_raw)
    _arg(raw, "eps")["row_stride"] = 8
    assert any("(eps): `row_stride` applies to tensor arguments only" in p for p in _problems(tmp_path, raw))


def test_scratch_role_is_valid_for_tensors_only_and_cannot_be_aliased(tmp_path, qknorm_raw):
    raw = copy.deepcopy(qknorm_raw)
    _arg(raw, "eps")["role"] = "scratch"
    assert any("a scalar argument can only be an input" in p for p in _problems(tmp_path, raw))
    raw = copy.deepcopy(qknorm_raw)
    _arg(raw, "q")["role"] = "scratch"
    raw["arguments"].append({"name": "q_out", "kind": "tensor", "shape": ["tokens", "q_heads", "head_dim"],
                             "role": "out", "alias": "q"})
    assert any("alias 'q' names a scratch tensor" in p for p in _problems(tmp_path, raw))


# ---------------------------------------------------------------- tolerance keyed by output dtype


def test_tolerance_entries_for_other_float_dtypes_are_accepted_and_checked(tmp_path, qknorm_raw):
    raw = copy.deepcopy(qknorm_raw)
    raw["tolerance"]["float8_e4m3fn"] = {"atol": 0.25, "rtol": 0.25, "floor": 0.1}
    raw["tolerance"]["float32"] = {"atol": 1e-5, "rtol": 1e-5, "floor": 1e-6}
    job = jobs.make_job(spec.load(_write(tmp_path, raw)), SimpleNamespace(csrc_dir=tmp_path, include_dir=tmp_path))
    assert job.tolerance["float8_e4m3fn"]["atol"] == 0.25 and set(job.tolerance) >= {"bfloat16", "float32"}
    raw["tolerance"]["float32"] = {"atol": -1, "rtol": 1e-5, "floor": 1e-6}
    raw["tolerance"]["int32"] = {"atol": 0, "rtol": 0, "floor": 0}
    raw["tolerance"]["float12"] = {"atol": 0, "rtol": 0, "floor": 0}
    problems = _problems(tmp_path, raw)
    assert "tolerance.float32.atol must be a non-negative number" in problems
    assert "tolerance.int32: int32 outputs are compared exactly; remove this entry" in problems
    assert any(p.startswith("tolerance: unknown key `float12`") for p in problems)


# ---------------------------------------------------------------- shapes.exclude


def test_exclude_drops_the_named_cases(tmp_path, qknorm_raw):
    raw = copy.deepcopy(qknorm_raw)
    every = [c.id for c in jobs.cases(spec.load(spec.spec_path("qknorm")))[0]]
    gone = "edge/float16/tokens=1,q_heads=1,kv_heads=1,head_dim=64"
    assert gone in every
    raw["shapes"]["exclude"] = [{"case": gone, "reason": "RuntimeError: unsupported head_dim"}]
    loaded = spec.load(_write(tmp_path, raw))
    case_list, _ = jobs.cases(loaded)
    assert [c.id for c in case_list] == [i for i in every if i != gone]
    assert loaded.excluded == {gone: "RuntimeError: unsupported head_dim"}


@pytest.mark.parametrize("exclude, needle", [
    ({"case": "x"}, "shapes.exclude must be a list"),
    (["edge/float16/tokens=1"], "shapes.exclude[0] must be a mapping {case:"),
    ([{"case": "edge/float16/tokens=1"}], "shapes.exclude[0].reason must be a non-empty string"),
    ([{"case": "", "reason": "r"}], "shapes.exclude[0].case must be a non-empty string (a case id"),
    ([{"case": "edge/float16/tokens=1", "reason": "r", "why": "x"}], "shapes.exclude[0]: unknown key `why`"),
    ([{"case": "edge/float16/tokens=99", "reason": "r"}],
     "shapes.exclude: no case has id 'edge/float16/tokens=99' (did the shapes change?)"),
    ([{"case": "edge/float16/tokens=1,q_heads=1,kv_heads=1,head_dim=64", "reason": r} for r in "ab"],
     "is excluded twice"),
])
def test_bad_exclusions_are_explained(tmp_path, qknorm_raw, exclude, needle):
    raw = copy.deepcopy(qknorm_raw)
    raw["shapes"]["exclude"] = exclude
    problems = _problems(tmp_path, raw)
    assert any(needle in p for p in problems), problems


def test_excluding_every_case_is_refused(tmp_path, qknorm_raw):
    raw = copy.deepcopy(qknorm_raw)
    raw["shapes"]["exclude"] = [{"case": c.id, "reason": "no"} for c in jobs.cases(spec.load("qknorm"))[0]]
    assert "shapes.exclude leaves no case to check; remove entries or add shapes" in _problems(tmp_path, raw)


# ---------------------------------------------------------------- bytes read and written


def test_bytes_are_split_by_roles_on_the_committed_specs():
    rmsnorm = _case(jobs.cases(spec.load("rmsnorm"))[0], tokens=1024, hidden=4096)
    assert rmsnorm.bytes_split == "roles" and rmsnorm.bytes == rmsnorm.bytes_read + rmsnorm.bytes_written
    assert (rmsnorm.bytes_read, rmsnorm.bytes_written) == ((1024 * 4096 + 4096) * 2, 1024 * 4096 * 2)
    fused = jobs.cases(spec.load("fused_add_rmsnorm"))[0][0]  # input and residual in place: read and written
    assert fused.bytes_split == "roles" and fused.bytes_written == 2 * fused.dims["tokens"] * fused.dims["hidden"] * 2
    store = _case(jobs.cases(spec.load("store_cache"))[0], tokens=1024)  # 8 MB scattered into 2 x 64 MiB of cache
    assert store.bytes_read + store.bytes_written == store.bytes == 4 * 1024 * store.dims["kv_heads"] * store.dims["head_dim"] * 2 + 8 * 1024
    assert store.bytes_split == "spec"  # the spec names what the scatter reads and writes
    assert (store.bytes_read, store.bytes_written) == (2 * 1024 * store.dims["kv_heads"] * store.dims["head_dim"] * 2 + 8 * 1024,
                                                       2 * 1024 * store.dims["kv_heads"] * store.dims["head_dim"] * 2)


def test_roles_are_scaled_to_bytes_when_the_spec_gives_only_bytes(tmp_path):
    raw = yaml.safe_load(spec.spec_path("store_cache").read_text())
    del raw["bytes_read"], raw["bytes_written"]  # left with bytes: the 2 x 64 MiB caches counted as roles are scaled down
    store = _case(jobs.cases(spec.load(_write(tmp_path, raw, name="store_cache")))[0], tokens=1024)
    assert store.bytes_read + store.bytes_written == store.bytes
    assert store.bytes_split.startswith("roles, scaled to bytes (less than")


def test_explicit_bytes_read_and_written_reach_the_job(tmp_path, qknorm_raw):
    raw = copy.deepcopy(qknorm_raw)
    raw["bytes_read"] = "(tokens * (q_heads + kv_heads) * head_dim + 2 * head_dim) * elt(dtype)"
    raw["bytes_written"] = "tokens * (q_heads + kv_heads) * head_dim * elt(dtype)"
    case = jobs.cases(spec.load(_write(tmp_path, raw)))[0][0]
    q, kv, d = case.dims["q_heads"], case.dims["kv_heads"], case.dims["head_dim"]
    assert case.bytes_split == "spec" and case.bytes_written == case.dims["tokens"] * (q + kv) * d * 2
    assert case.bytes_read + case.bytes_written == case.bytes


@pytest.mark.parametrize("change, needle", [
    ({"bytes_read": "tokens"}, "`bytes_read` needs `bytes_written` too"),
    ({"bytes_read": "bytes", "bytes_written": "0"}, "uses unknown name(s) ['bytes']"),
    ({"bytes_read": [1], "bytes_written": "0"}, "`bytes_read` must be an expression"),
    ({"bytes_read": "tokens", "bytes_written": "tokens"}, "not bytes"),
    ({"bytes_read": "0 - tokens", "bytes_written": "tokens"}, "non-negative integers"),
    ({"bytes_writen": "tokens"}, "did you mean `bytes_written`?"),
])
def test_bad_bytes_read_and_written_are_explained(tmp_path, qknorm_raw, change, needle):
    raw = {**copy.deepcopy(qknorm_raw), **change}
    problems = _problems(tmp_path, raw)
    assert any(needle in p for p in problems), problems
    assert len([p for p in problems if "bytes" in p]) == 1  # one mistake, one message (not one per shape)


# ---------------------------------------------------------------- the documented expression functions


def test_the_doc_lists_exactly_the_expression_functions():
    doc = (ROOT / "docs" / "spec-format.md").read_text()
    section = doc.split("### Functions", 1)[1].split("\n#", 1)[0]
    documented = re.findall(r"^- `(\w+)\(", section, flags=re.M)
    assert sorted(documented) == sorted(FUNCTIONS) and len(documented) == len(set(documented))
    assert "& | ^ << >> ~" in doc


# ---------------------------------------------------------------- spec-check and TODO(review)


def _astra(*args, env=None):
    proc = subprocess.run([sys.executable, "-m", "astra.cli", *args], capture_output=True, text=True,
                          env={**os.environ, **(env or {})}, timeout=120, cwd=ROOT)
    return proc.returncode, proc.stdout, proc.stderr


def test_spec_check_refuses_review_markers_unless_draft(tmp_path):
    text = spec.spec_path("qknorm").read_text()
    text = text.replace("category: layernorm", "category: layernorm  # TODO(review): category guessed")
    text = text.replace("dtypes: [bfloat16, float16]", "dtypes: [bfloat16, float16]\n# TODO(review): fp32?")
    path = _write(tmp_path, None, text=text)
    lines = text.splitlines()
    numbers = [i + 1 for i, line in enumerate(lines) if "TODO(review)" in line]
    env = {"ASTRA_SPECS": str(tmp_path)}
    code, out, err = _astra("spec-check", env=env)
    assert code == 5 and "Traceback" not in err, err
    assert f"{path}: 2 problem(s)" in err and out.startswith("FAIL qknorm: 100 cases")
    for number in numbers:
        assert f"line {number}: TODO(review) not resolved" in err
    assert "'category: layernorm  # TODO(review): category guessed'" in err and "--draft" in err
    code, out, err = _astra("spec-check", "--draft", env=env)
    assert code == 0 and err == "", err
    assert out.startswith("ok   qknorm") and out.count("note: line ") == 2


def test_spec_check_names_every_unreviewed_spec(tmp_path):
    for name in ("qknorm", "rmsnorm"):
        text = spec.spec_path(name).read_text() + "# TODO(review): tolerances\n"
        _write(tmp_path, None, name=name, text=text)
    code, _, err = _astra("spec-check", env={"ASTRA_SPECS": str(tmp_path)})
    assert code == 5 and "2 unreviewed specs: 2 problem(s)" in err, err
    assert all(f"{tmp_path / n / 'kernel.yaml'}: line " in err for n in ("qknorm", "rmsnorm"))


# ---------------------------------------------------------------- the source check


def _tree(tmp_path, loaded, text=None):
    csrc = tmp_path / "csrc"
    if text is not None:
        (csrc / loaded.kernel_file).parent.mkdir(parents=True, exist_ok=True)
        (csrc / loaded.kernel_file).write_text(text)
    return SimpleNamespace(csrc_dir=csrc, include_dir=tmp_path, version="9.9.9",
                           describe=lambda: f"SGLang 9.9.9 (checkout) at {tmp_path}")


def test_source_check_names_both_hashes_the_file_the_tree_and_the_fixes(tmp_path):
    loaded = spec.load("rmsnorm")
    with pytest.raises(SpecError) as err:
        require_same_source(loaded, _tree(tmp_path, loaded, "// an edited kernel\n"))
    (problem,) = err.value.problems
    actual = hashlib.sha256(b"// an edited kernel\n").hexdigest()
    assert loaded.raw["source"]["sha256"] in problem and actual in problem
    assert f"{loaded.kernel_file} in SGLang 9.9.9 (checkout) at {tmp_path}" in problem
    assert "`--sglang 0.5.23`" in problem and "`astra extract rmsnorm`" in problem
    with pytest.raises(SpecError, match="is not in SGLang 9.9.9"):
        require_same_source(loaded, _tree(tmp_path / "empty", loaded))


def test_check_and_bench_refuse_another_versions_kernel():
    for command in (["check", "rmsnorm", "--candidate", str(ROOT / "README.md")], ["bench", "rmsnorm"]):
        code, _, err = _astra(*command, "--sglang", "0.5.10")
        assert code == 5 and "Traceback" not in err and len(err.strip().splitlines()) == 1, err
        assert "SGLang 0.5.10" in err and "52f4acbc6c5f82dabb90ac1ef80d8e030e69be68c1790583f462a9d641eb8410" in err


def test_optimize_refuses_another_versions_kernel(tmp_path):
    from astra.optimize.driver import run_optimize
    from astra.optimize.options import OptimizeOptions

    loaded = spec.load("rmsnorm")
    with pytest.raises(SpecError, match="source.sha256 is 52f4acbc"):
        run_optimize(loaded, _tree(tmp_path, loaded, "// kernel\n"), OptimizeOptions(dry_run=True, offline=True),
                     say=lambda _: None)


def test_unordered_reaches_the_job_and_is_validated(tmp_path, qknorm_raw):
    raw = copy.deepcopy(qknorm_raw)
    _arg(raw, "q")["unordered"] = True
    case = jobs.cases(spec.load(_write(tmp_path, raw)))[0][0]
    args = {a.name: a for a in case.args}
    assert args["q"].unordered is True and args["k"].unordered is False
    _arg(raw, "q")["unordered"] = "yes"
    _arg(raw, "q_weight")["unordered"] = True
    problems = _problems(tmp_path, raw)
    assert any("`unordered` is true or false, on an `out` or `inout` tensor" in p and "'yes'" in p for p in problems)
    assert any("q_weight" in p and "on a in tensor" in p for p in problems)
