"""float64 reference for SGLang's JIT rmsnorm: out = input / sqrt(mean(input^2) + eps) * weight."""

import torch


def reference(args: dict, dims: dict) -> dict:
    x = args["input"].to(torch.float64)
    w = args["weight"].to(torch.float64)
    eps = float(args["eps"])
    inv_rms = torch.rsqrt(x.pow(2).mean(dim=-1, keepdim=True) + eps)
    return {"out": x * inv_rms * w}
