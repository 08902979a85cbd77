"""float64 reference for SGLang's silu_and_mul (export run_activation with op "silu").

input [tokens, 2*d]: first d columns are the gate, last d the up projection.
out [tokens, d] = silu(gate) * up, silu(x) = x * sigmoid(x).
"""

import torch


def reference(args: dict, dims: dict) -> dict:
    x = args["input"].to(torch.float64)
    d = x.shape[-1] // 2
    gate, up = x[..., :d], x[..., d:]
    # x * sigmoid(x) equals x / (1 + exp(-x)) and does not overflow for very negative x.
    return {"out": gate * torch.sigmoid(gate) * up}
