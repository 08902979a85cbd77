"""Which optional tensors a draft passes, chosen so that the entry's presence checks hold.

SGLang's entries state which `Optional<TensorView>` arguments go together: `!(page_table.has_value() &&
out_offsets.has_value())` ("mutually exclusive"), `!page_table_row_index.has_value() ||
page_table.has_value()` ("needs page_table"). A draft that passes every optional tensor it found checks
for is refused on every case by such a check. Over the assignments of present/absent to the optional
tensors (all of them up to `MAX_FREE`, else only the drafted one with single flips), the checks that
name `has_value` are read under each (astra.sglang.host_checks, as host_relations reads them); the
assignment kept breaks none, passes the most tensors, and differs least from the draft. When none
holds, or the drafted one already does, the draft is left as it is.
"""

from __future__ import annotations

import itertools
from typing import Callable

from astra.sglang import host_checks
from astra.sglang.cxx_facts import EntryFacts
from astra.spec.host_relations import constant

MAX_FREE = 6  # 64 assignments


def violated(facts: EntryFacts, env: host_checks.CondEnv) -> int:
    """How many presence checks read as a constant False under `env` (their guard not ruling them out)."""
    count = 0
    for check in facts.checks:
        if "has_value" not in check.cond:
            continue
        local = host_checks.CondEnv(**{**env.__dict__, "cxx": {**env.cxx, **check.locals}})
        if check.guard is not None and constant(host_checks.to_python(check.guard, local), False):
            continue
        if any(constant(part, False) for part in host_checks.conjuncts(host_checks.to_python(check.cond, local))):
            count += 1
    return count


def choose(facts: EntryFacts, drafted: dict[str, bool],
           env_for: Callable[[dict[str, bool]], host_checks.CondEnv]) -> dict[str, bool] | None:
    """The presence of each optional tensor (name -> passed), or None to keep `drafted`."""
    if not drafted or not any("has_value" in c.cond for c in facts.checks):
        return None
    if violated(facts, env_for(drafted)) == 0:
        return None
    names = sorted(drafted)
    if len(names) <= MAX_FREE:
        options = [dict(zip(names, bits)) for bits in itertools.product((True, False), repeat=len(names))]
    else:
        options = [{**drafted, name: not drafted[name]} for name in names]
    fitting = [o for o in options if violated(facts, env_for(o)) == 0]
    if not fitting:
        return None
    return max(fitting, key=lambda o: (sum(o.values()), -sum(o[n] != drafted[n] for n in names)))

