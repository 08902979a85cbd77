"""float64 reference for SGLang's fused_add_rmsnorm (in place on input and residual).

Per row: s = input + residual; residual <- s; input <- s / sqrt(mean(s^2) + eps) * weight.
"""

import torch


def reference(args: dict, dims: dict) -> dict:
    x = args["input"].to(torch.float64)
    r = args["residual"].to(torch.float64)
    w = args["weight"].to(torch.float64)
    eps = float(args["eps"])
    s = x + r
    inv_rms = torch.rsqrt(s.pow(2).mean(dim=-1, keepdim=True) + eps)
    return {"input": s * inv_rms * w, "residual": s}
