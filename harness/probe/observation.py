"""Probing the ORIGINAL kernel of a drafted spec: which cases it accepts and what it really does with them.

A draft's roles are guesses from names; the probe replaces them with observation. Per case (`probe_case`;
the launch is a Python callable, so CPU tests drive it with functions of their own), on seed-0 inputs from
`harness.judge.inputs.make_inputs`:

1. every tensor argument is snapshotted and the kernel runs once (`harness.judge.correctness.call` with every role
   neutral: nothing is poisoned or restored, since the roles are what is being found out). An exception
   is the kernel refusing the case: "rejected", with its own message (`kernel_message`: the first line,
   plus the "Root cause" line of SGLang's TensorMatcher errors);
2. written: every tensor whose bytes changed (in that run or the next);
3. a second run on identical fresh inputs: a written tensor that differs while every other written tensor
   agrees is `scratch`; outputs that differ only in the order of values along their last dim (a top-k's
   indices; rows compared as sets of tuples with the written tensors of their shape) are `unordered`;
   any other difference makes the case nondeterministic;
4. per written, non-scratch tensor, a run on identical inputs with that tensor poisoned
   (`harness.judge.inputs.poison_`): every result identical to the first run's -> `out` (its prior content is
   never read), else `inout` (a run that raises counts as a difference). Unwritten tensors are `in`;
5. finite: no NaN/Inf in a float output when every float input was finite; constant: an output of more
   than one element holding one bit pattern everywhere (reported as suspicious, not decisive);
6. every other trial the judge of `astra check` will run (later seeds; large, small, extreme data) is
   accepted: a case the original fails on some trial is rejected with that trial named.

A case the original accepts but where it writes no output (or only scratch) is `noop`: excluded, since a
candidate that does nothing would pass it (the module still needs a kept case that writes).

`decide` is the one rule for a module: probed when at least one case is kept, every kept case is
deterministic on its outputs and finite, the roles agree across cases, and compute-sanitizer
(memcheck over the smallest kept case) is clean. Case statuses: kept, rejected (the kernel refused it),
crashed (the process died, or the CUDA context was lost), hung (no result in time), noop (accepted, but
nothing written), error (the harness
could not make the case's inputs, or ran out of memory: the draft needs fixing).
"""

from __future__ import annotations

import time
from dataclasses import replace
from typing import Any, Callable, Sequence

import torch

from harness.job import Case, Options
from harness.judge.compare import sort_rows_together, unchanged
from harness.judge.correctness import call, describe, trial_inputs, trials_for
from harness.judge.inputs import clone_inputs, make_inputs, poison_

Launch = Callable[[Sequence[Any]], Any]
CASE_STATUSES = ("kept", "rejected", "crashed", "hung", "error", "noop")
ROLE_ORDER = ("in", "scratch", "out", "inout")  # merging across cases: a later role wins over an earlier one
MESSAGE_MAX = 400
_INT_VIEW = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}


def kernel_message(error: BaseException | str) -> str:
    """The kernel's own reason in one line: the type and first line, plus a "Root cause" line if any."""
    text = str(error).strip()
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    head = lines[0] if lines else ""
    if head.endswith(":") and len(lines) > 1 and "Root cause" not in lines[1]:
        head = f"{head} {lines[1]}"  # "Failed at file:line:" with the reason on the next line
    if isinstance(error, BaseException):
        head = f"{type(error).__name__}: {head}"
    cause = next((line.lstrip("- ") for line in lines[1:] if "Root cause" in line), None)
    message = f"{head} ({cause})" if cause else head
    return message if len(message) <= MESSAGE_MAX else message[: MESSAGE_MAX - 3] + "..."


def neutral(case: Case) -> Case:
    """`case` with every tensor role "in" (aliases kept): `harness.judge.correctness.call` then poisons and restores
    nothing, so each run sees exactly the inputs it was given."""
    return replace(case, args=[a if a.role == "alias" or a.kind != "tensor" else replace(a, role="in")
                               for a in case.args])


def tensor_names(case: Case, inputs: dict[str, Any]) -> list[str]:
    """The case's tensor arguments that are tensors in `inputs` (an absent optional argument is not)."""
    return [a.name for a in case.args if a.kind == "tensor" and isinstance(inputs.get(a.name), torch.Tensor)]


def is_constant(tensor: torch.Tensor) -> bool:
    """More than one element, every one the same bit pattern (NaN-safe: bytes compared)."""
    if tensor.numel() <= 1 or tensor.element_size() not in _INT_VIEW:
        return False
    flat = tensor.detach().contiguous().reshape(-1).view(_INT_VIEW[tensor.element_size()])
    return bool((flat == flat[0]).all())


def all_finite(tensor: torch.Tensor) -> bool:
    """No NaN or Inf (float8 is widened first; non-float tensors are finite)."""
    if not tensor.is_floating_point():
        return True
    if tensor.dtype not in (torch.float16, torch.bfloat16, torch.float32, torch.float64):
        tensor = tensor.float()
    return bool(torch.isfinite(tensor).all())


class _Runner:
    """Fresh seed-`seed` inputs for every run of one case, one neutral call each; `known` and `on_poison`
    as `probe_case` takes them."""

    def __init__(self, launch: Launch, case: Case, device: torch.device, seed: int, known: dict[str, str],
                 on_poison: Callable[[str], None] | None) -> None:
        self.launch, self.case, self.device, self.seed = launch, case, device, seed
        self.known, self.on_poison = known, on_poison
        self.neutral = neutral(case)

    def inputs(self) -> dict[str, Any]:
        return make_inputs(self.case, self.seed, self.device)

    def run(self, inputs: dict[str, Any], what: str) -> tuple[dict[str, Any], str | None]:
        """(every argument after the call, the kernel's message if it raised)."""
        raised: list[BaseException] = []

        def recording(call_args: Sequence[Any]) -> Any:  # keeps the whole exception: its "Root cause" line
            try:
                return self.launch(call_args)
            except Exception as error:
                raised.append(error)
                raise

        args = dict(inputs)
        error = call(recording, args, self.neutral, self.device, f"{self.case.id}: probe {what}")
        return args, (kernel_message(raised[0]) if error is not None and raised else error)


def new_result(case: Case) -> dict[str, Any]:
    return {"id": case.id, "status": "kept", "message": "", "written": [], "roles": {}, "deterministic": None,
            "finite": None, "constant_outputs": [], "notes": [], "seconds": 0.0}


def probe_case(launch: Launch, case: Case, device: torch.device | str, seed: int = 0, *, single: bool = False,
               known: dict[str, str] | None = None, on_poison: Callable[[str], None] | None = None) -> dict[str, Any]:
    """What the kernel does with `case` (see the module docstring). `single`: only the first run (what
    compute-sanitizer watches). `on_poison(name)` is called before the run with `name` poisoned, so a
    process that dies there can say which tensor did it; `known` maps tensors already found to be read
    (the original crashed or hung with them poisoned: their content is read, e.g. as indices) to that
    finding, and they are not poisoned again. Raises `harness.judge.correctness.ContextLost` when a run left the CUDA
    context unusable: the caller must record the case and start a fresh process."""
    start = time.monotonic()
    device = torch.device(device)
    result = new_result(case)
    runner = _Runner(launch, case, device, seed, dict(known or {}), on_poison)
    try:
        inputs = runner.inputs()
    except (ValueError, RuntimeError) as error:
        result.update(status="error", message=f"inputs could not be made: {kernel_message(error)}")
        return result
    names = tensor_names(case, inputs)
    before = clone_inputs({name: inputs[name] for name in names})
    first, error = runner.run(inputs, "run 1")
    if error is not None:
        result.update(status="rejected", message=error)
        result["seconds"] = round(time.monotonic() - start, 3)
        return result
    written = [name for name in names if not unchanged(before[name], first[name])]
    if not single:
        _observe(runner, result, names, before, first, written)
        _judge_trials(runner, result)
        if result["status"] == "kept" and not outputs_of(result):
            what = f"writes only scratch {', '.join(result['written'])}" if result["written"] else "writes no tensor"
            result.update(status="noop", message=f"the original {what} on this case: it cannot tell a candidate "
                                                 "from one that does nothing")
    else:
        result["written"] = written
    result["seconds"] = round(time.monotonic() - start, 3)
    return result


def _observe(runner: _Runner, result: dict, names: list[str], before: dict, first: dict, written: list[str]) -> None:
    """Steps 2 to 5 of the module docstring, into `result`."""
    second_inputs = runner.inputs()
    second_before = clone_inputs({name: second_inputs[name] for name in names})
    second, error = runner.run(second_inputs, "run 2")
    differ: list[str] = []
    if error is not None:
        result["notes"].append(f"the second identical run raised: {error}")
        result["deterministic"] = False
    else:
        written += [name for name in names if name not in written and not unchanged(second_before[name], second[name])]
        differ = [name for name in names if not _same(runner, result, name, first, second)]
        order_only = _order_only(runner, differ, written, first, second)
        if order_only:
            result["unordered"] = order_only
            result["notes"].append(f"the order along the last dim differs between identical runs, the rows as sets "
                                   f"do not: unordered {', '.join(order_only)}")
            differ = []
    del second, second_before
    scratch = differ if len(differ) == 1 and len(written) > 1 else []
    if result["deterministic"] is None:
        result["deterministic"] = not [name for name in differ if name not in scratch]
    if differ and not result["deterministic"]:
        result["notes"].append(f"outputs differ between two identical runs: {', '.join(differ)}")
    aliases = {a.name: a.alias for a in runner.case.args if a.alias}
    compared = [name for name in names if name not in scratch]
    roles: dict[str, str] = {}
    for name in names:
        if name in aliases:
            roles[name] = "alias"
        elif name not in written:
            roles[name] = "in"
        elif name in scratch:
            roles[name] = "scratch"
        else:
            roles[name] = _poisoned_role(runner, result, name, first, compared)
    outputs = [name for name in written if roles.get(name) in ("out", "inout", "alias")]
    result["written"], result["roles"] = written, roles
    result["constant_outputs"] = [name for name in outputs if is_constant(first[name])]
    floats_in = [before[name] for name in names if before[name].is_floating_point()]
    float_out = [name for name in outputs if first[name].is_floating_point()]
    if float_out and all(all_finite(t) for t in floats_in):
        bad = [name for name in float_out if not all_finite(first[name])]
        result["finite"] = not bad
        if bad:
            result["notes"].append(f"NaN/Inf from finite inputs in: {', '.join(bad)}")


def _judge_trials(runner: _Runner, result: dict) -> None:
    """Step 6: every other trial `astra check` runs on this case (the later seeds; large, small and
    extreme data): the original must accept each one, or the case is one the judge would fail on the
    original itself (an index that data makes out of range, a check on values). A raise rejects the
    case with that trial named; a crash loses the context, and the caller records the case as crashed."""
    for trial in trials_for(runner.case, list(Options().seeds)):
        if trial == ("seed", runner.seed):
            continue
        _, error = runner.run(trial_inputs(runner.case, trial, runner.device), describe(trial))
        if error is not None:
            result.update(status="rejected", message=f"{describe(trial)}: {error}")
            return


def _poisoned_role(runner: _Runner, result: dict, name: str, first: dict, compared: list[str]) -> str:
    """`out` when poisoning `name` before the call changes nothing the call leaves behind, else `inout`."""
    if name in runner.known:
        result["notes"].append(f"with {name} poisoned the original {runner.known[name]}: its prior content is read")
        return "inout"
    if runner.on_poison is not None:
        runner.on_poison(name)
    inputs = runner.inputs()
    poison_(inputs[name])
    after, error = runner.run(inputs, f"with {name} poisoned")
    if error is not None:
        result["notes"].append(f"with {name} poisoned the kernel raised ({error}): its prior content is read")
        return "inout"
    changed = [other for other in compared if not _same(runner, result, other, first, after)]
    return "inout" if changed else "out"


def _groups(runner: _Runner, result: dict, tensors: dict) -> list[list[str]]:
    """The unordered outputs, by shape: the spec's (`unordered: true`) and those this probe found."""
    marked = {a.name for a in runner.case.tensors() if a.unordered} | set(result.get("unordered") or [])
    groups: dict[tuple, list[str]] = {}
    for name in (n for n in tensors if n in marked and tensors[n] is not None):
        groups.setdefault(tuple(tensors[name].shape), []).append(name)
    return list(groups.values())


def _same(runner: _Runner, result: dict, name: str, first: dict, other: dict) -> bool:
    """`name` holds the same bytes after both runs; an unordered output the same rows as sets (with the
    outputs of its shape sorted together)."""
    group = next((g for g in _groups(runner, result, first) if name in g), None)
    if group is None:
        return unchanged(first[name], other[name])
    a, b = sort_rows_together([first[n] for n in group]), sort_rows_together([other[n] for n in group])
    return unchanged(a[group.index(name)], b[group.index(name)])


def _order_only(runner: _Runner, differ: list[str], written: list[str], first: dict, second: dict) -> list[str]:
    """The written outputs to treat as unordered when every difference between two identical runs is the
    order of values along the last dim: each differing tensor (rows: at least 2-D, 2 or more per row),
    sorted with every written tensor of its shape as rows of tuples, agrees with the other run. [] otherwise.
    A 1-D tensor never: its "row" is the whole output (a list grouped by expert in any order inside each
    group would pass as a bare multiset, whatever the grouping)."""
    found: list[str] = []
    for name in differ:
        t = first[name]
        if name not in written or t.dim() < 2 or t.shape[-1] < 2:
            return []
        group = [n for n in written if first[n] is not None and tuple(first[n].shape) == tuple(t.shape)]
        a, b = sort_rows_together([first[n] for n in group]), sort_rows_together([second[n] for n in group])
        if not all(unchanged(x, y) for x, y in zip(a, b)):
            return []
        found += [n for n in group if n not in found]
    return found


def relative_paths(result: dict, roots: list[str]) -> dict:
    """`result` with the source roots cut out of its message and notes ("Failed at /home/u/sglang/csrc/
    elementwise/k.cuh:148" becomes "Failed at elementwise/k.cuh:148"): records and specs stay portable."""
    def cut(text: str) -> str:
        for root in roots:
            text = text.replace(root.rstrip("/") + "/", "")
        return text

    return {**result, "message": cut(result.get("message") or ""), "notes": [cut(n) for n in result.get("notes", [])]}


def outputs_of(case_result: dict) -> list[str]:
    """The tensors a kept case writes as results (out, inout, or an in-place alias), scratch excluded."""
    return [name for name, role in case_result.get("roles", {}).items()
            if role in ("out", "inout", "alias") and name in case_result.get("written", [])]


def merge_roles(kept: list[dict]) -> tuple[dict[str, str], list[str]]:
    """One role per tensor over the kept cases, and the conflicts that make a module fail.

    A tensor written in some cases and not in others takes its written role; `out` in one case and
    `inout` in another is `inout` (safe: the harness then restores its input before each call); `scratch`
    in one case but an output in another is a conflict (whether its content matters is not settled).
    """
    seen: dict[str, dict[str, str]] = {}
    for case in kept:
        for name, role in case.get("roles", {}).items():
            seen.setdefault(name, {}).setdefault(role, case["id"])
    merged, conflicts = {}, []
    for name, roles in seen.items():
        if "alias" in roles:
            merged[name] = "alias"
            continue
        if "scratch" in roles and ({"out", "inout"} & set(roles)):
            other = "inout" if "inout" in roles else "out"
            conflicts.append(f"{name} is scratch in {roles['scratch']} but {other} in {roles[other]}")
        merged[name] = max(roles, key=ROLE_ORDER.index)
    return merged, conflicts


def _first(cases: list[dict], status: str) -> dict | None:
    return next((case for case in cases if case["status"] == status), None)


def decide(cases: list[dict], sanitizer: dict | None) -> tuple[str, str]:
    """("probed" | "failed", a one-line reason) for a module's case results and memcheck report
    (`sanitizer` None: turned off by the user; the reason then says so)."""
    kept = [case for case in cases if case["status"] == "kept"]
    error = _first(cases, "error")
    if error is not None:
        return "failed", f"case {error['id']}: {error['message']}; fix the draft's shapes or init"
    if not cases:
        return "failed", "the draft has no cases"
    if not kept:
        rejected, noop = _first(cases, "rejected"), _first(cases, "noop")
        if noop is not None:  # accepted but a no-op: the draft's inputs never make it do anything
            return "failed", f"case {noop['id']}: the kernel accepts the call but {noop['message'].split(' ', 2)[-1]}"
        if rejected is not None:
            return "failed", f"kernel rejects every drafted case: {rejected['message']}"
        first = cases[0]
        return "failed", f"no case completed: {first['id']} {first['status']}: {first['message']}"
    for case in kept:
        if not outputs_of(case):
            what = "writes only scratch " + ", ".join(case["written"]) if case["written"] else "writes no tensor"
            return "failed", f"case {case['id']}: the kernel accepts the call but {what}"
        if case["deterministic"] is False:
            return "failed", f"case {case['id']}: nondeterministic: {'; '.join(case['notes'])}"
        if case["finite"] is False:
            return "failed", f"case {case['id']}: {'; '.join(case['notes'])}"
    roles, conflicts = merge_roles(kept)
    if conflicts:
        return "failed", f"roles disagree across cases: {conflicts[0]}"
    if sanitizer is not None:
        if sanitizer.get("findings"):
            finding = sanitizer["findings"][0]
            return "failed", f"{finding['tool']}: {finding['message']}"
        if sanitizer.get("unavailable"):
            return "failed", f"not probed: compute-sanitizer could not check it ({sanitizer['unavailable']})"
    written = ", ".join(f"{name} ({role})" for name, role in roles.items() if role not in ("in",))
    excluded = [case for case in cases if case["status"] != "kept"]
    reason = f"{len(kept)}/{len(cases)} cases kept; writes {written}"
    if excluded:
        counts = {status: sum(c["status"] == status for c in excluded) for status in CASE_STATUSES}
        reason += "; excluded: " + ", ".join(f"{n} {status}" for status, n in counts.items() if n)
    constant = sorted({name for case in kept for name in case["constant_outputs"]})
    if constant:
        reason += f"; constant output(s) in some case: {', '.join(constant)} (suspicious, check)"
    if sanitizer is None:
        reason += "; compute-sanitizer not run (--no-sanitizer)"
    return "probed", reason
