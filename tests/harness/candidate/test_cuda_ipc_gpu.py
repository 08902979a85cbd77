"""CUDA IPC between two processes (harness.candidate.cuda_ipc): the judge copies exactly the bytes the other
process exported, and refuses a range outside the allocation or a handle that does not open."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
import torch

if not torch.cuda.is_available():
    pytest.skip("needs a CUDA GPU", allow_module_level=True)

from harness.candidate.cuda_ipc import Imports, IpcError  # noqa: E402

pytestmark = pytest.mark.gpu

EXPORTER = """
import json, sys, torch
from harness.candidate import cuda_ipc
assert cuda_ipc.available()
pad = torch.zeros(1000, dtype=torch.uint8, device="cuda")  # the exported tensor does not start its allocation
data = (torch.arange(1 << 20, device="cuda") % 251).to(torch.uint8)
print(json.dumps({**cuda_ipc.export(data), "nbytes": data.numel()}), flush=True)
sys.stdin.readline()  # alive until the judge has copied
"""


def test_the_judge_copies_what_the_other_process_exported():
    child = subprocess.Popen([sys.executable, "-c", EXPORTER], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                             text=True)
    try:
        shared = json.loads(child.stdout.readline())
        device = torch.device("cuda", torch.cuda.current_device())
        expected = (torch.arange(1 << 20, device=device) % 251).to(torch.uint8)
        with Imports() as imports:
            got = imports.copy(shared["handle"], shared["offset"], shared["nbytes"], device)
            assert torch.equal(got, expected) and imports.copies == 1
            size = imports.opened[shared["handle"]][1]
            with pytest.raises(IpcError, match="outside the allocation"):
                imports.copy(shared["handle"], size - 10, 20, device)
            with pytest.raises(IpcError, match="outside the allocation"):
                imports.copy(shared["handle"], -1, 1, device)
        with Imports() as imports, pytest.raises(IpcError):
            imports.copy("00" * 64, 0, 16, device)  # no process exported this
    finally:
        child.stdin.write("\n")
        child.stdin.close()
        child.wait(timeout=60)
    assert child.returncode == 0
