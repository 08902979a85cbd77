"""Float64 reference of the RowScale test kernel (the `reference.py` contract of docs/spec-format.md)."""


def reference(args: dict, dims: dict) -> dict:
    """out[r, c] = x[r, c] * w[c]."""
    return {"out": args["x"] * args["w"][None, :]}
