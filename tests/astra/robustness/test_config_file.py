"""`$ASTRA_HOME/config.yaml` is a user's file: every value is checked before any work, and a bad one is one
line with exit 13 (the LLM settings it holds), never a traceback from deep inside a run."""

import os

import pytest

from astra import config
from tests.astra.robustness.run_astra import astra, home, refused

BAD = [
    (b"model: [1, 2]\n", "`model: [1, 2]` must be a non-empty string"),
    (b"model: \xff\xfe\n", "not UTF-8 text (invalid start byte at byte 7)"),
    (b"model: m\ntimeout_s: -1\n", "`timeout_s: -1` must be a finite number above 0"),
    (b"model: m\ntimeout_s: .nan\n", "`timeout_s: nan` must be a finite number above 0"),
    (b"model: m\nbudget_tokens: x\n", "`budget_tokens: 'x'` must be a whole number above 0"),
    (b"model: m\nmax_retries: 1000\n", "`max_retries: 1000` must be a whole number from 0 to 100"),
    (b"model: a\nmodel: b\n", "key `model` appears twice in one mapping (lines 1 and 2)"),
    (b"model: [" * 100 + b"]" * 100 + b"\n", "nested more than 64 levels deep"),
]


@pytest.mark.parametrize("data,needle", BAD, ids=[needle[:30] for _, needle in BAD])
def test_a_bad_config_stops_optimize_at_once(tmp_path, data, needle):
    root = home(tmp_path)
    (root / "config.yaml").write_bytes(data)
    answer = astra("optimize", "rmsnorm", "--dry-run", env={"ASTRA_HOME": str(root)})
    refused(answer, 13, f"astra optimize: {root / 'config.yaml'}: ", needle)
    assert not (root / "runs").exists()  # refused before a run directory was made


@pytest.mark.parametrize("command", [["eval", "--kernels", "rmsnorm", "--dry-run"],
                                     ["extract", "rmsnorm", "--agent", "llm"],
                                     ["probe", "rmsnorm", "--agent", "llm"]])
def test_every_command_that_reads_it_refuses_it_first(tmp_path, command):
    root = home(tmp_path)
    (root / "config.yaml").write_text("model: m\ntemperature: 9\n")
    refused(astra(*command, env={"ASTRA_HOME": str(root)}), 13, "`temperature: 9` must be a finite number from 0 to 2")


def test_a_fifo_config_is_refused_not_waited_on(tmp_path):
    root = home(tmp_path)
    os.mkfifo(root / "config.yaml")
    refused(astra("optimize", "rmsnorm", "--dry-run", env={"ASTRA_HOME": str(root)}), 13,
            "config.yaml: a FIFO (named pipe), not a regular file")


def test_offline_runs_never_read_it(tmp_path):
    root = home(tmp_path)
    (root / "config.yaml").write_text("model: [1, 2]\n")
    answer = astra("optimize", "rmsnorm", "--dry-run", "--offline", "--rounds", "0", env={"ASTRA_HOME": str(root)})
    refused(answer, 12, "--rounds 0")  # the flag, not the file: --offline takes no setting from it


def test_good_settings_pass_through(tmp_path):
    path = tmp_path / "config.yaml"
    path.write_text("base_url: http://localhost:30000/v1\nmodel: m\ntimeout_s: 5\nmax_retries: 0\n"
                    "temperature: 0.2\nbudget_usd: null\n")
    assert config.read_config_file(path) == {"base_url": "http://localhost:30000/v1", "model": "m", "timeout_s": 5,
                                             "max_retries": 0, "temperature": 0.2, "budget_usd": None}
    path.write_text("")
    assert config.read_config_file(path) == {}
