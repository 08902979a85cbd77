"""float64 reference for SGLang's per_token_group_quant (fp8 e4m3, float32 row-major scales).

For every group of `group` consecutive columns of a row:
    amax  = max(max |x|, 1e-10)
    scale = amax / 448                      -> output_s (dequantization scale)
    q     = fp8_e4m3(x / scale)             -> output_q, nearest-even, saturating at +-448
Everything is computed in float64; the fp8 rounding is done arithmetically (no float32 step).
"""

import torch

FP8_MAX = 448.0
AMAX_FLOOR = 1e-10
_MIN_NORMAL_EXP = -6  # e4m3fn: smallest normal is 2^-6; subnormal spacing is 2^-9
_MANTISSA_BITS = 3


def round_to_e4m3(v: torch.Tensor) -> torch.Tensor:
    """Nearest-even rounding of float64 values to the e4m3fn grid, saturating to +-448."""
    a = v.abs()
    _, exp = torch.frexp(a)  # a = m * 2^exp with m in [0.5, 1): floor(log2 a) = exp - 1
    e = torch.clamp(exp.to(torch.float64) - 1, min=_MIN_NORMAL_EXP)
    ulp = torch.exp2(e - _MANTISSA_BITS)
    q = torch.round(a / ulp) * ulp  # torch.round rounds half to even
    q = torch.clamp(q, max=FP8_MAX)
    return torch.copysign(q, v)


def reference(args: dict, dims: dict) -> dict:
    x = args["input"].to(torch.float64)
    tokens, hidden = x.shape
    num_groups = args["output_s"].shape[-1]
    group = hidden // num_groups
    xg = x.reshape(tokens, num_groups, group)
    amax = xg.abs().amax(dim=-1, keepdim=True).clamp(min=AMAX_FLOOR)
    scale = amax / FP8_MAX
    q = round_to_e4m3(xg / scale)
    return {"output_q": q.reshape(tokens, hidden), "output_s": scale.reshape(tokens, num_groups)}
