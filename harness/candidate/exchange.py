"""What the candidate process hands the judge, on disk, and how the judge reads it without trusting it.

Layout of the work directory (the judge creates it; the candidate process writes, the judge reads and
deletes):

    signatures.json        {variant: {export: "typed signature" | null}}
    case-00003/            one directory per case, renamed into place complete (written as .tmp-case-00003/)
        manifest.json      {"case": id, "trials": [{"kind", "seed", "error", "tensors": {name: {shape, dtype}}}],
                            "determinism": [digest, digest] | null,   (harness.judge.digest)
                            "chain": {"error": str} | {"launches": [{"tensors": ...}, {"tensors": ...}]} | null}
        t0-a2.bin          raw bytes of tensor argument 2 after trial 0's call (C order, no header; a
                           strided view's whole storage, shape[0] * row_stride elements)
        c1-a2.bin          the same after two launches back to back, of the second launch (harness.back_to_back)
                           (on a GPU, a tensor entry may instead carry {"ipc": {handle, offset}}: the bytes stay
                           in the candidate process's memory until the judge has copied them and deleted the
                           case's directory; harness.candidate.cuda_ipc)
    timed-outputs/s7-a2.bin   timing: the outputs of timed set 7 the judge asked for (harness.timed_outputs)
    done                   the outputs phase finished every case

Beside it, in the process's control directory (readable, not writable, by the process): `go.json`,
{"cand_so": {variant: path}}, written by the judge for a process it started while the modules were still
building, once they are built and scanned.

No pickle, no torch.save: tensors are raw bytes (in a file or on the GPU), everything else JSON. The judge computes every file
name itself and checks each manifest entry against the job (case id, trial list, tensor names, shape,
dtype, byte size): anything else is `Malformed`, which makes that case incorrect with the reason.
The candidate waits while more than `BACKLOG` finished cases are on disk (the judge deletes each
case's directory after judging it), so a large suite never fills the disk.
"""

from __future__ import annotations

import json
import math
import os
import shutil
import time
from pathlib import Path
from typing import Any, Callable

import torch

from harness.candidate import cuda_ipc
from harness.candidate.cuda_ipc import IpcError
from harness.job import Case
from harness.judge.inputs import storage_numel, torch_dtype, view_strides
from harness.timing.stats import Stats

BACKLOG = 2
MAX_ERROR_CHARS = 300
SIGNATURES = "signatures.json"
GO = "go.json"
DONE = "done"


class Malformed(ValueError):
    """What the candidate process wrote does not match the job."""


def case_dir(work: Path, index: int) -> Path:
    return Path(work) / f"case-{index:05d}"


def tensor_file(trial: int, arg_index: int, prefix: str = "t") -> str:
    return f"{prefix}{trial}-a{arg_index}.bin"


def stored_args(case: Case, outputs_only: bool = False) -> list[tuple[int, str]]:
    """(index, name) of every tensor argument written back: present ones, not `scratch` (never judged),
    aliases once (they are the same tensor); with `outputs_only`, the `out` and `inout` ones."""
    return [(i, a.name) for i, a in enumerate(case.args)
            if a.kind == "tensor" and a.present and a.role not in ("alias", "scratch")
            and (not outputs_only or a.role in ("out", "inout"))]


def write_tensors(directory: Path, prefix: str, index: int, case: Case, args: dict[str, Any],
                  outputs_only: bool = False, kept: list[torch.Tensor] | None = None) -> dict[str, dict[str, Any]]:
    """The stored tensors of `args`: {name: {shape, dtype}} plus, with `kept` (a CUDA IPC exchange: the tensors
    are appended to it and must outlive the judge's read), {"ipc": {handle, offset}}; else their raw bytes are
    written to {prefix}{index}-a{arg}.bin."""
    tensors: dict[str, dict[str, Any]] = {}
    for arg_index, name in stored_args(case, outputs_only):
        tensor, arg = args[name], case.args[arg_index]
        stored = tensor
        if arg.row_stride is not None:  # the whole storage: the judge checks the gaps too
            stored = tensor.as_strided((storage_numel(arg),), (1,), 0)
        flat = stored.detach().contiguous().reshape(-1).view(torch.uint8)
        tensors[name] = {"shape": list(tensor.shape), "dtype": str(tensor.dtype).removeprefix("torch.")}
        shared = cuda_ipc.export(flat) if kept is not None else None
        if shared is not None:
            kept.append(flat)
            tensors[name]["ipc"] = shared
        else:
            flat.cpu().numpy().tofile(Path(directory) / tensor_file(index, arg_index, prefix))
    return tensors


def write_json_atomic(path: Path, data: Any) -> None:
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(json.dumps(data))
    os.replace(tmp, path)


# ---------------------------------------------------------------- the candidate's side


def wait_for_room(work: Path, backlog: int = BACKLOG, poll_s: float = 0.02) -> None:
    """Block while more than `backlog` finished cases wait on disk for the judge."""
    while sum(1 for p in Path(work).glob("case-*")) > backlog:
        time.sleep(poll_s)


class CaseWriter:
    """One case's results, trial by trial (tensors go to disk as each trial ends, or, with `ipc`, stay on the GPU
    in `kept` under CUDA IPC handles: harness.candidate.cuda_ipc), renamed into place complete by `finish`.
    `released()`: the judge has deleted the case's directory, so the kept tensors may be freed."""

    def __init__(self, work: Path, index: int, case: Case, ipc: bool = False) -> None:
        self.final = case_dir(work, index)
        self.tmp = self.final.with_name(f".tmp-{self.final.name}")
        shutil.rmtree(self.tmp, ignore_errors=True)
        self.tmp.mkdir()
        self.case = case
        self.kept: list[torch.Tensor] | None = [] if ipc else None
        self.manifest: dict[str, Any] = {"case": case.id, "trials": [], "determinism": None, "chain": None}

    def released(self) -> bool:
        return not self.final.exists() and not self.tmp.exists()

    def add_trial(self, kind: str, seed: int, error: str | None, args: dict[str, Any] | None) -> None:
        """Trial results: the launch error, or every tensor argument after the call."""
        t = len(self.manifest["trials"])
        entry: dict[str, Any] = {"kind": kind, "seed": seed, "error": error, "tensors": {}}
        if error is None and args is not None:
            entry["tensors"] = write_tensors(self.tmp, "t", t, self.case, args, kept=self.kept)
        self.manifest["trials"].append(entry)

    def add_chain(self, error: str | None, launches: list[dict[str, Any]] | None) -> None:
        """Two launches back to back (harness.back_to_back): the error, or each launch's tensor arguments after both."""
        if error is not None or launches is None:
            self.manifest["chain"] = {"error": error or "an error without a message"}
            return
        self.manifest["chain"] = {"launches": [{"tensors": write_tensors(self.tmp, "c", i, self.case, args, kept=self.kept)}
                                               for i, args in enumerate(launches)]}

    def finish(self, determinism: list[str] | None) -> None:
        self.manifest["determinism"] = determinism
        (self.tmp / "manifest.json").write_text(json.dumps(self.manifest))
        os.rename(self.tmp, self.final)


# ---------------------------------------------------------------- the judge's side


def wait_for(path: Path, alive: Callable[[], bool], timeout_s: float, poll_s: float = 0.02) -> bool:
    """Wait until `path` exists; False once `alive()` is False (checked once more after) or time is up."""
    deadline = time.monotonic() + timeout_s
    while not path.exists():
        if not alive():
            return path.exists()
        if time.monotonic() > deadline:
            return False
        time.sleep(poll_s)
    return True


def read_manifest(directory: Path, case: Case, trials: list[tuple[str, int]]) -> dict[str, Any]:
    """The manifest of one case, checked against the case and the judge's trial list."""
    try:
        manifest = json.loads((directory / "manifest.json").read_text())
    except (OSError, ValueError) as error:
        raise Malformed(f"unreadable manifest: {error}") from error
    if not isinstance(manifest, dict) or manifest.get("case") != case.id:
        raise Malformed("manifest names another case")
    entries = manifest.get("trials")
    if not isinstance(entries, list) or [(e.get("kind"), e.get("seed")) if isinstance(e, dict) else None
                                         for e in entries] != [tuple(t) for t in trials]:
        raise Malformed("manifest trials differ from the judge's trial list")
    det = manifest.get("determinism")
    if det is not None and not (isinstance(det, list) and len(det) == 2 and all(isinstance(d, str) for d in det)):
        raise Malformed("malformed determinism digests")
    chain = manifest.get("chain")
    if chain is not None and not (isinstance(chain, dict) and (
            isinstance(chain.get("error"), str) or (isinstance(chain.get("launches"), list)
                                                    and len(chain["launches"]) == 2
                                                    and all(isinstance(e, dict) for e in chain["launches"])))):
        raise Malformed("malformed back-to-back launches")
    return manifest


def trial_error(entry: dict[str, Any]) -> str | None:
    """The candidate's launch error of one trial (a string, clipped), or None."""
    error = entry.get("error")
    if error is None:
        return None
    if not isinstance(error, str):
        raise Malformed("error is not a string")
    return error[:MAX_ERROR_CHARS] or "an error without a message"


def read_trial(directory: Path, trial: int, entry: dict[str, Any], case: Case, device: torch.device,
               prefix: str = "t", outputs_only: bool = False,
               imports: cuda_ipc.Imports | None = None) -> dict[str, torch.Tensor]:
    """Every tensor argument of one trial (`prefix` "t"; "c": a back-to-back launch; "s": a timed set, outputs
    only), from raw bytes or, where the entry names a CUDA IPC handle, copied from the candidate's allocation
    through `imports`; validated against the job; aliases filled."""
    tensors = entry.get("tensors") if isinstance(entry, dict) else None
    expected = stored_args(case, outputs_only)
    if not isinstance(tensors, dict) or sorted(tensors) != sorted(name for _, name in expected):
        raise Malformed(f"trial {trial}: tensors {sorted(tensors) if isinstance(tensors, dict) else tensors!r} "
                        f"are not the case's {sorted(name for _, name in expected)}")
    out: dict[str, torch.Tensor] = {}
    for arg_index, name in expected:
        arg, meta = case.args[arg_index], tensors[name]
        dtype = torch_dtype(arg.dtype)
        shape = [int(d) for d in arg.shape]
        if not isinstance(meta, dict) or meta.get("shape") != shape:
            raise Malformed(f"trial {trial}: {name} has shape {meta.get('shape') if isinstance(meta, dict) else '?'}, "
                            f"expected {shape}")
        if meta.get("dtype") != str(dtype).removeprefix("torch."):
            raise Malformed(f"trial {trial}: {name} has dtype {meta.get('dtype')}, expected {arg.dtype}")
        nbytes = storage_numel(arg) * dtype.itemsize
        if "ipc" in meta:
            flat = _shared_bytes(meta["ipc"], nbytes, imports, device, f"trial {trial}: {name}")
            values = flat.view(dtype)
            out[name] = values.as_strided(shape, view_strides(arg)) if arg.row_stride is not None else values.reshape(shape)
            continue
        path = Path(directory) / tensor_file(trial, arg_index, prefix)
        size = path.stat().st_size if path.is_file() and not path.is_symlink() else -1
        if size != nbytes:
            raise Malformed(f"trial {trial}: {name} holds {size} bytes, expected {nbytes}")
        flat = torch.empty(nbytes, dtype=torch.uint8)
        if nbytes:
            with open(path, "rb") as handle:  # straight into the tensor's memory: one copy from the page cache
                got = handle.readinto(memoryview(flat.numpy()))
            if got != nbytes:
                raise Malformed(f"trial {trial}: {name} gave {got} bytes on reading, expected {nbytes}")
        values = flat.view(dtype).to(device)
        out[name] = values.as_strided(shape, view_strides(arg)) if arg.row_stride is not None else values.reshape(shape)
    for arg in case.tensors():
        if arg.role == "alias" and arg.alias in out:
            out[arg.name] = out[arg.alias]
    return out


def _shared_bytes(shared: Any, nbytes: int, imports: cuda_ipc.Imports | None, device: torch.device,
                  where: str) -> torch.Tensor:
    """The bytes a CUDA IPC entry {handle, offset} names, copied into the judge's memory (harness.candidate.cuda_ipc)."""
    if imports is None or device.type != "cuda":
        raise Malformed(f"{where}: outputs shared on the GPU, where a file was expected")
    if not (isinstance(shared, dict) and isinstance(shared.get("handle"), str) and isinstance(shared.get("offset"), int)
            and len(shared["handle"]) == 2 * cuda_ipc.HANDLE_BYTES):
        raise Malformed(f"{where}: malformed CUDA IPC entry")
    try:
        return imports.copy(shared["handle"], shared["offset"], nbytes, device)
    except (IpcError, ValueError) as error:
        raise Malformed(f"{where}: {error}") from error


def read_signatures(work: Path) -> dict[str, dict[str, str | None]]:
    """The candidate's export signatures, checked to be {variant: {export: str | None}}."""
    try:
        data = json.loads((Path(work) / SIGNATURES).read_text())
    except (OSError, ValueError) as error:
        raise Malformed(f"unreadable signatures: {error}") from error
    if not isinstance(data, dict) or not all(
            isinstance(v, dict) and all(isinstance(s, (str, type(None))) for s in v.values()) for v in data.values()):
        raise Malformed("malformed signatures")
    return data


def valid_stats(data: Any) -> Stats:
    """A Stats from untrusted JSON: every number finite, times positive, p10 <= median <= p90."""
    if not isinstance(data, dict):
        raise Malformed("timing is not an object")
    try:
        stats = Stats.from_dict(data)
        values = [float(stats.median_us), float(stats.p10_us), float(stats.p90_us)]
        count, spread = int(stats.n), float(stats.rel_stderr if stats.rel_stderr is not None else math.inf)
    except (KeyError, TypeError, ValueError) as error:
        raise Malformed(f"malformed timing: {error}") from error
    if not all(math.isfinite(v) and v > 0 for v in values) or count < 1 or spread < 0 or math.isnan(spread):
        raise Malformed(f"implausible timing {data}")
    if not values[1] <= values[0] <= values[2]:
        raise Malformed(f"timing percentiles out of order {data}")
    return stats
