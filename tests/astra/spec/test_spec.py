"""Spec validation (one message per mistake) and resolution into harness cases."""

import copy

import pytest
import yaml

from astra.errors import SpecError
from astra.spec import jobs
from astra.spec import model as spec


@pytest.fixture
def rmsnorm_raw():
    return yaml.safe_load(spec.spec_path("rmsnorm").read_text())


def _write(tmp_path, raw, name="rmsnorm"):
    folder = tmp_path / name
    folder.mkdir()
    (folder / "kernel.yaml").write_text(yaml.safe_dump(raw))
    if raw.get("reference"):
        (folder / raw["reference"]).write_text("def reference(args, dims):\n    return {}\n")
    return folder / "kernel.yaml"


# General-purpose kernels SGLang calls at every batch size: their suites time all three bands. Specs reviewed
# from drafts time only the token counts at which SGLang dispatches to the kernel (inkling_rel_proj: t <= 32).
EVERY_BAND = ("silu_and_mul", "fused_add_rmsnorm", "rmsnorm", "qknorm", "per_token_group_quant", "store_cache")


def test_committed_specs_validate():
    for name in spec.available():
        loaded = spec.load(name)
        case_list, variants = jobs.cases(loaded)
        assert case_list and variants
        bands = {c.band for c in case_list if c.timed}
        assert bands and bands <= {"decode", "middle", "prefill"}, name
        if name in EVERY_BAND:
            assert bands == {"decode", "middle", "prefill"}, name


def test_every_mistake_gets_its_own_message(tmp_path, rmsnorm_raw):
    raw = copy.deepcopy(rmsnorm_raw)
    raw["dtypes"] = ["bfloat16", "float12"]
    raw["arguments"][0]["role"] = "sideways"
    raw["arguments"][1]["shape"] = ["hidden", "widgets"]
    raw["source"]["sha256"] = "xyz"
    with pytest.raises(SpecError) as err:
        spec.load(_write(tmp_path, raw))
    problems = err.value.problems
    assert any("unknown dtype 'float12'" in p for p in problems)
    assert any("role must be one of" in p and "sideways" in p for p in problems)
    assert any("unknown name(s) ['widgets']" in p for p in problems)
    assert any("sha256 must be 64" in p for p in problems)
    assert len(problems) >= 4


def test_constraint_violation_names_the_shape(tmp_path, rmsnorm_raw):
    raw = copy.deepcopy(rmsnorm_raw)
    raw["shapes"]["edge"] = [{"tokens": 3, "hidden": 4097}]
    with pytest.raises(SpecError, match=r"1 problem\(s\).*\n  - shape edge \{.*4097.*\}: violates constraint"):
        spec.load(_write(tmp_path, raw))


def test_alias_makes_an_inplace_call(tmp_path, rmsnorm_raw):
    raw = copy.deepcopy(rmsnorm_raw)
    out = next(a for a in raw["arguments"] if a["name"] == "out")
    out["alias"] = "input"
    loaded = spec.load(_write(tmp_path, raw))
    case = jobs.cases(loaded)[0][0]
    roles = {a.name: (a.role, a.alias) for a in case.args if a.kind == "tensor"}
    assert roles["input"] == ("inout", None) and roles["out"] == ("alias", "input")


def test_bad_alias_is_explained(tmp_path, rmsnorm_raw):
    raw = copy.deepcopy(rmsnorm_raw)
    next(a for a in raw["arguments"] if a["name"] == "out")["alias"] = "weight"
    with pytest.raises(SpecError, match="an alias must have the shape and dtype of 'weight'"):
        spec.load(_write(tmp_path, raw))
