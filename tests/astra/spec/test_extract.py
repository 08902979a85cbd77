"""`astra extract` on real SGLang 0.5.23 modules: drafts that validate, snapshots with hashes."""

import json

import pytest

from astra.errors import AstraError
from astra.sglang import registry
from astra.spec import extract
from astra.spec import model as spec
from tests.astra_home import cached_home

pytestmark = pytest.mark.network


@pytest.fixture
def specs_dir(tmp_path, monkeypatch):
    """Drafts land in $ASTRA_HOME/drafts; the test reads them as specs from there."""
    monkeypatch.setenv("ASTRA_HOME", str(cached_home(tmp_path / "home")))
    monkeypatch.setenv("ASTRA_SPECS", str(tmp_path / "home" / "drafts"))
    return tmp_path / "home" / "drafts"


def test_draft_goes_to_astra_home_never_the_repository(sglang_0523, specs_dir):
    from astra import paths

    result = extract.extract(sglang_0523, "qknorm")
    assert result.draft.parent.parent == paths.drafts_dir() == specs_dir
    assert not (paths.SPECS_DIR / "qknorm" / "kernel.draft.yaml").exists()


def test_draft_validates_and_snapshot_has_hashes(sglang_0523, specs_dir):
    result = extract.extract(sglang_0523, "fused_add_rmsnorm")
    assert result.draft == specs_dir / "fused_add_rmsnorm" / "kernel.yaml"
    loaded = spec.load("fused_add_rmsnorm")  # validates: raises SpecError on any mistake
    assert loaded.entry == "fused_add_rmsnorm"
    assert [a.name for a in loaded.arguments] == ["input", "residual", "weight", "eps"]
    assert loaded.raw["build"]["wrappers"][0]["entry"] == "FusedAddRMSNormKernel<false, {cpp_dtype(dtype)}>::run"
    manifest = json.loads((result.snapshot / "manifest.json").read_text())
    assert manifest["sglang_version"] == "0.5.23"
    key = "sglang/kernels/jit/csrc/elementwise/fused_add_rmsnorm.cuh"
    assert len(manifest["files"][key]) == 64
    assert any(path.startswith("sglang/kernels/jit/include/") for path in manifest["files"])
    assert "TODO(review)" in result.draft.read_text()


def test_second_extract_keeps_a_reviewed_draft(sglang_0523, specs_dir):
    """A machine draft is redrafted in place; one a person edited (header gone) is kept, and the new
    draft goes beside it."""
    first = extract.extract(sglang_0523, "clamp_position")
    assert extract.extract(sglang_0523, "clamp_position").draft == first.draft
    first.draft.write_text(first.draft.read_text().split("\n", 1)[1])  # reviewed: the header removed
    again = extract.extract(sglang_0523, "clamp_position")
    assert again.draft.name == "kernel.draft.yaml"


def test_extract_works_across_buildable_modules(sglang_0523, specs_dir):
    """A sample of every 16th sm_90a-buildable module (all 193 pass in about 140 s; see the notes)."""
    buildable = [m for m in registry.modules(sglang_0523) if m.sm90a in ("yes", "built")]
    drafted, refused = [], []
    for module in buildable[::16]:
        try:
            result = extract.extract(sglang_0523, module.name, build_check=False)
        except AstraError as err:  # a module the inference cannot describe says why, in one line
            assert "cannot draft a spec" in str(err) or "cannot find source" in str(err), str(err)
            refused.append(module.name)
            continue
        assert result.draft.exists() and result.files, module.name
        drafted.append(module.name)
    assert len(drafted) >= 0.8 * (len(drafted) + len(refused)), refused


def test_a_kernel_kept_beside_its_loader_gets_a_portable_path(sglang_0523, specs_dir):
    """residual_gate_add lives in kda_kernels/csrc, not jit/csrc: the draft names it relative to jit/csrc
    (an absolute path held on the machine that extracted it only), and the job finds it in this tree."""
    from astra.spec import jobs
    from astra.spec.source_check import require_same_source

    result = extract.extract(sglang_0523, "diffusion_residual_gate_add", build_check=False)
    loaded = spec.load(result.draft)
    assert loaded.kernel_file == "../../kda_kernels/csrc/diffusion/residual_gate_add.cuh"
    require_same_source(loaded, sglang_0523)  # the sha256 of the file the path names
    job = jobs.make_job(loaded, sglang_0523)
    assert job.kernel_file == str(sglang_0523.csrc_dir.parent.parent / "kda_kernels/csrc/diffusion/residual_gate_add.cuh")
    raw = dict(loaded.raw, source={**loaded.raw["source"], "kernel_file": job.kernel_file})
    problems = spec.validate(raw, result.draft)
    assert any("absolute path" in p and "re-extract" in p for p in problems)
