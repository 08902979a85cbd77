"""float64 reference for SGLang's fused in-place QK-norm.

Each head vector (last dim) of q and k is RMS-normalized with the shared eps and scaled by its
own weight (q_weight for q, k_weight for k).
"""

import torch


def _rms_norm(x: torch.Tensor, w: torch.Tensor, eps: float) -> torch.Tensor:
    return x * torch.rsqrt(x.pow(2).mean(dim=-1, keepdim=True) + eps) * w


def reference(args: dict, dims: dict) -> dict:
    eps = float(args["eps"])
    q = _rms_norm(args["q"].to(torch.float64), args["q_weight"].to(torch.float64), eps)
    k = _rms_norm(args["k"].to(torch.float64), args["k_weight"].to(torch.float64), eps)
    return {"q": q, "k": k}
