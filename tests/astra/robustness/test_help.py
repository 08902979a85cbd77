"""`astra COMMAND --help` describes every argument of every command: each option and positional argument of
the real help text has words after it. And the help and the docs name only flags the tool has."""

from __future__ import annotations

import os
import re
import subprocess
import sys

import pytest

from tests.astra.robustness.run_astra import LIMIT_S, REPO

_ENTRY = re.compile(r"^  (\S.*?)(?:\s{2,}(\S.*))?$")  # an argument's line: its invocation, then maybe its help


def _help(*command: str) -> subprocess.CompletedProcess:
    """`astra COMMAND... --help`, the real command line in a child process."""
    return subprocess.run([sys.executable, "-m", "astra.cli", *command, "--help"], cwd=REPO, capture_output=True,
                          text=True, timeout=LIMIT_S, env={**os.environ, "COLUMNS": "100"})


def _commands() -> list[str]:
    """The commands `astra --help` lists (one per line, indented under COMMAND)."""
    text = _help().stdout
    listed = re.findall(r"^    ([a-z][a-z-]*)\s", text, flags=re.M)
    assert len(listed) > 15, text
    return listed


COMMANDS = _commands()


def undescribed(help_text: str) -> list[str]:
    """The arguments in an argparse help text with no help after them (on their line or the next)."""
    lines = help_text.splitlines()
    bare = []
    for i, line in enumerate(lines):
        entry = _ENTRY.match(line)
        if not entry or line.endswith(":") and not entry.group(2):  # a group's title is not an argument
            continue
        following = lines[i + 1] if i + 1 < len(lines) else ""
        continued = following.startswith("   ") and following.strip() != ""
        if not entry.group(2) and not continued:
            bare.append(entry.group(1))
    return bare


@pytest.mark.parametrize("command", COMMANDS)
def test_every_argument_of_every_command_has_help(command):
    answer = _help(command)
    assert answer.returncode == 0, answer.stderr
    assert "options:" in answer.stdout or "optional arguments:" in answer.stdout, answer.stdout
    assert undescribed(answer.stdout) == [], answer.stdout


def test_the_reader_of_help_finds_an_argument_without_help():
    text = "usage: astra x\n\noptions:\n  -h, --help  show this help\n  --rounds N\n  --quiet     no progress\n"
    assert undescribed(text) == ["--rounds N"]


def test_no_message_or_doc_names_a_timeout_flag_the_tool_does_not_have():
    flags = set(re.findall(r"--[a-z][a-z-]+", "\n".join(_help(c).stdout for c in COMMANDS)))
    assert "--timeout" not in flags
    texts = [p.read_text() for p in [*REPO.glob("astra/**/*.py"), REPO / "README.md", *REPO.glob("docs/*.md")]]
    assert not [t for t in texts if re.search(r"--timeout(?![-\w])", t)]


def test_every_config_file_key_is_documented():
    from astra.config import FILE_KEYS

    documented = (REPO / "docs" / "configuration.md").read_text()
    assert [key for key in FILE_KEYS if f"`{key}:`" not in documented] == []
    assert "docs/configuration.md" in (REPO / "README.md").read_text()
