"""The input/output sets that timed launches read and write: made as checked calls make theirs, restored
before every sample, digested for the judge.

A timed launch must do checked work (docs/threat-model.md, "Timing counts only checked work"). So every
launch of a sample gets a set of its own, drawn like a checked call's inputs (harness.inputs.make_inputs on
a seed of `timing_seeds`: the first is the case's first checked seed, so the judge also holds that set's
checked outputs; the others are fresh seeds of the same distributions), with its `out` tensors poisoned.
No set is used twice within a sample: a graph replay launches once per set, a cold sample launches the next
set in turn (harness.timing.timing_side), so each set holds the outputs of that side's latest launch on it.

Before every sample, OUTSIDE the timed events and identically on both sides, `restore` copies every storage
a call may write (`out`, `inout`, `scratch`, and what an alias writes) back from a pristine copy taken when
the set was made (every set before a replay; the set it launches before a cold sample): pure outputs are poisoned again, in-place tensors hold their drawn inputs again. So an
in-place kernel is never timed on its own outputs, and a launch that skips work leaves poison that the
judge sees. `digests` gives, per set, the keyed digest of its outputs (harness.judge.correctness.output_digest: what
the judge computes from a checked call's outputs) and of its read-only tensors' storages (harness.judge.digest).

Works on CPU tensors too (the CPU tests); on a GPU the restore is one multi-tensor copy.
"""

from __future__ import annotations

from typing import Any

import torch

from harness.job import Case, dtype_size
from harness.judge.correctness import output_tensors
from harness.judge.digest import digests
from harness.judge.inputs import make_inputs, poison_outputs, storage_numel, storage_of, to_call_args

TIMING_SEED_OFFSET = 10_000  # the timed sets past the first draw seeds 10001, 10002, ...


def timing_seeds(seeds: list[int], count: int) -> list[int]:
    """The seeds of `count` timed sets: the case's first checked seed, then fresh ones."""
    first = seeds[0] if seeds else 0
    return [first] + [TIMING_SEED_OFFSET + i for i in range(1, max(1, count))]


def written_names(case: Case) -> list[str]:
    """Tensor arguments whose storage a call may write: `out`, `inout`, `scratch`, and the target of an
    alias (written through the alias)."""
    targets = {a.alias for a in case.args if a.role == "alias" and a.alias}
    return [a.name for a in case.tensors() if a.role in ("out", "inout", "scratch") or a.name in targets]


def read_only_names(case: Case) -> list[str]:
    """`in` tensors that no alias writes: their bytes must survive every timed launch."""
    written = set(written_names(case))
    return [a.name for a in case.tensors() if a.role == "in" and a.name not in written]


def tensor_bytes(case: Case) -> int:
    """Device bytes of one draw of the case's tensors: every present tensor's storage (an alias once)."""
    return sum(storage_numel(a) * dtype_size(a.dtype) for a in case.tensors() if a.role != "alias")


def set_footprint(case: Case) -> int:
    """Device bytes one timed set holds: every present tensor's storage (an alias once) and the pristine
    copies of the written ones."""
    held = tensor_bytes(case)
    written = set(written_names(case))
    kept = sum(storage_numel(a) * dtype_size(a.dtype) for a in case.tensors() if a.name in written and a.role != "alias")
    return held + kept


def _bytes_of(tensor: torch.Tensor) -> torch.Tensor:
    """The whole storage behind `tensor` as a flat uint8 view (a strided view's gaps included)."""
    return storage_of(tensor).view(torch.uint8)


class TimedSets:
    """`len(seeds)` sets of one case's arguments (see the module docstring). `inputs[i]` holds set i's
    tensors by name, `call_args[i]` its positional arguments."""

    def __init__(self, case: Case, seeds: list[int], device: torch.device | str, key: int = 0) -> None:
        self.case, self.seeds, self.device, self.key = case, list(seeds), torch.device(device), key
        self.inputs: list[dict[str, Any]] = []
        self._targets: list[list[torch.Tensor]] = []  # per set
        self._pristine: list[list[torch.Tensor]] = []
        written = written_names(case)
        for seed in self.seeds:
            args = poison_outputs(make_inputs(case, seed, self.device), case.args)
            self.inputs.append(args)
            seen: set[int] = set()
            targets, pristine = [], []
            for name in written:
                tensor = args.get(name)
                if not isinstance(tensor, torch.Tensor) or id(tensor) in seen:
                    continue
                seen.add(id(tensor))
                flat = _bytes_of(tensor)
                targets.append(flat)
                pristine.append(flat.clone())
            self._targets.append(targets)
            self._pristine.append(pristine)
        self.call_args = [to_call_args(args, case.args) for args in self.inputs]

    def __len__(self) -> int:
        return len(self.inputs)

    def restore(self, index: int | None = None) -> None:
        """Enqueue (on the current stream) the copy of every written storage of set `index` (None: of every
        set) from its pristine copy: outputs poisoned, in-place tensors back to their drawn inputs, workspaces
        back to their init."""
        chosen = range(len(self.inputs)) if index is None else [index]
        targets = [t for i in chosen for t in self._targets[i]]
        pristine = [p for i in chosen for p in self._pristine[i]]
        if not targets:
            return
        foreach_copy = getattr(torch, "_foreach_copy_", None)
        if self.device.type == "cuda" and foreach_copy is not None:
            foreach_copy(targets, pristine)  # a few multi-tensor kernels, not one copy per storage
        else:
            for target, source in zip(targets, pristine):
                target.copy_(source)

    def digests(self, indices: list[int] | None = None) -> list[dict[str, str]]:
        """Per set (of `indices`, default every set, in that order): {"out": the keyed digest of its outputs
        (harness.judge.correctness.output_digest), "in": that of its read-only tensors' storages}, computed on
        the device. Call after the device finished the sample."""
        chosen = range(len(self.inputs)) if indices is None else indices
        read_only = read_only_names(self.case)
        groups = []
        for i in chosen:
            args = self.inputs[i]
            groups.append(output_tensors(self.case, args))
            groups.append([_bytes_of(args[name]) for name in read_only if isinstance(args.get(name), torch.Tensor)])
        values = digests(groups, self.key) if groups else []  # one synchronisation for every set
        return [{"out": values[2 * k], "in": values[2 * k + 1]} for k in range(len(values) // 2)]
