"""`astra passes` on two real SGLang 0.5.23 modules, without builds: every pass reports every module."""

import json
import subprocess
import sys


def test_passes_without_builds_on_real_modules(sglang_0523, tmp_path):
    out = tmp_path / "passes.json"
    proc = subprocess.run([sys.executable, "-m", "astra.cli", "passes", "--sglang", "0.5.23", "--no-build",
                           "--module", "rmsnorm", "--module", "clamp_position", "--json", str(out)],
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr
    data = json.loads(out.read_text())
    assert data["sglang"] == "0.5.23" and data["built"] is False and data["modules"] == 2
    assert set(data["passes"]) == {"vectorize", "reuse", "warp_reduce", "fast_math", "coarsen", "split",
                                  "parallelize", "launch_bounds", "fastdiv", "pdl_chain",
                                  "batch_loads"}
    for name, outcome in data["passes"].items():
        assert sorted(outcome["applies"] + list(outcome["refused"])) == ["clamp_position", "rmsnorm"], name
        assert outcome["builds"] == [] and outcome["build_failed"] == {}
        assert all(reason and "\n" not in reason for reason in outcome["refused"].values())
    # the weight row is not read once per CTA: the loop stores through a call (gmem.store) given a pointer
    assert "rmsnorm" in data["passes"]["reuse"]["refused"]
    assert set(data["reach"]) <= {"clamp_position", "rmsnorm"} and data["reach"]
    table = proc.stdout.splitlines()
    assert table[-1].startswith("2 sm_90a-buildable modules of SGLang 0.5.23")
    assert any(line.startswith("fast_math") for line in table)


def test_unknown_pass_is_refused_with_the_catalog(sglang_0523):
    proc = subprocess.run([sys.executable, "-m", "astra.cli", "passes", "unroll_everything", "--sglang", "0.5.23",
                           "--no-build", "--module", "rmsnorm"], capture_output=True, text=True, timeout=600)
    assert proc.returncode != 0 and "no pass named unroll_everything" in proc.stderr
    assert "vectorize" in proc.stderr and "Traceback" not in proc.stderr
