"""The tests' ASTRA_HOME and the caches its homes share.

The test home (`.astra-test-home`, or `$ASTRA_TEST_HOME`) keeps what is slow to make and keyed by content:
unpacked SGLang wheels, nvcc builds, template checks, libclang's precompiled header and the runtime's
call-site index. A test that needs a home of its own (drafts, runs, probe records written where it can
read them back) gets a fresh folder whose cache folders are links to the test home's, so it starts
empty where its claim is, and does not pay again for a parse or a build that another test made from
the same bytes. Under pytest-xdist each worker gets such a home too, so two workers never write the
same run, draft or record.
"""

from __future__ import annotations

import os
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
TEST_HOME = Path(os.environ.get("ASTRA_TEST_HOME", str(REPO / ".astra-test-home")))

# Folders of ASTRA_HOME whose entries are keyed by their inputs' content (astra/paths.py lists the folders),
# written atomically, and so safe to share between homes and between processes.
SHARED_CACHES = ("sglang", "builds", "template-checks", "clang-pch", "srt-index")


def cached_home(path: Path) -> Path:
    """`path` as a fresh ASTRA_HOME whose content-keyed caches are the test home's."""
    path.mkdir(parents=True, exist_ok=True)
    for name in SHARED_CACHES:
        shared = TEST_HOME / name
        shared.mkdir(parents=True, exist_ok=True)
        link = path / name
        if not link.is_symlink():
            link.symlink_to(shared, target_is_directory=True)
    return path


def session_home() -> Path:
    """The home of this test process: the test home itself, or a home of its own per xdist worker."""
    worker = os.environ.get("PYTEST_XDIST_WORKER")
    return cached_home(TEST_HOME / "workers" / worker) if worker else TEST_HOME
