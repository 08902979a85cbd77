"""A spec draft inferred from evidence: the C++ entry's checks (astra.sglang.cxx_facts), the call
site's template arguments, the wrapper's Python (astra.sglang.wrapper_facts) and SGLang's runtime
call sites (astra.sglang.srt_gates). Names only break ties; every guess left is a `TODO(review)`
note, and the GPU probe (`astra probe`) decides whether the draft describes the kernel.

The inference is in four modules; this one gathers their public names:

- astra.spec.draft_dims: dims from SymbolicSizes, TensorMatchers and template arguments
  (`bind_template`, `dims_from_facts`, `translate`, `token_dim_of`);
- astra.spec.argument_kinds: dtypes and fills of the arguments (`tensor_dtype`, `scalar_dtype`,
  `tensor_init`);
- astra.spec.host_relations: the host checks as derived dims and constraints (`cond_env`,
  `host_relations`);
- astra.spec.constraint_fit: dim values that meet the constraints (`satisfy`, `violated`).

Values come from model configurations by meaning (astra.spec.meanings); astra.spec.draft assembles
the spec.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from astra.cxx.brackets import split_top
from astra.spec.argument_kinds import CPP_TO_DTYPE, INDEX_NAMES, LEN_NAMES, scalar_dtype, tensor_dtype, tensor_init
from astra.spec.constraint_fit import satisfy, violated
from astra.spec.draft_dims import Dims, bind_template, dims_from_facts, ident, token_dim_of, translate
from astra.spec.host_relations import Relations, cond_env, host_relations, meaning_names, scalar_placeholder

__all__ = ["CPP_TO_DTYPE", "Dims", "Draft", "Relations", "bind_template", "cond_env", "dims_from_facts",
           "host_relations", "meaning_names", "satisfy", "scalar_dtype", "split_args", "tensor_dtype",
           "tensor_init", "token_dim_of", "translate", "violated"]

# the names these had when they lived here
_Dims, _ident, _tensor_dtype, _scalar_placeholder = Dims, ident, tensor_dtype, scalar_placeholder
_INDEX_NAMES, _LEN_NAMES = INDEX_NAMES, LEN_NAMES


@dataclass
class Draft:
    spec: dict
    notes: list[str] = field(default_factory=list)


def split_args(text: str) -> list[str]:
    return split_top(text)
