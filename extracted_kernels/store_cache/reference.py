"""float64 reference for SGLang's store_cache (KV-cache scatter, in place on both caches).

k_cache[indices[i]] = k[i] and v_cache[indices[i]] = v[i] for every token i whose index differs
from reserved_skip_index; all other cache rows are unchanged.
"""

import torch


def reference(args: dict, dims: dict) -> dict:
    k_cache = args["k_cache"].to(torch.float64).clone()
    v_cache = args["v_cache"].to(torch.float64).clone()
    k = args["k"].to(torch.float64)
    v = args["v"].to(torch.float64)
    indices = args["indices"].to(device=k_cache.device).round().long()  # may arrive upcast to float64
    keep = indices != int(args["reserved_skip_index"])
    k_cache[indices[keep]] = k[keep.to(k.device)].to(k_cache.device)
    v_cache[indices[keep]] = v[keep.to(v.device)].to(v_cache.device)
    return {"k_cache": k_cache, "v_cache": v_cache}
