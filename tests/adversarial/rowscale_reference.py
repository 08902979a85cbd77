"""Float64 reference of the RowScale test kernels (the `reference.py` contract of docs/spec-format.md)."""


def reference(args: dict, dims: dict) -> dict:
    """out[r, c] = x[r, c] * w[c]; the in-place kernel (no `out`) writes it into x."""
    return {"out" if "out" in args else "x": args["x"] * args["w"][None, :]}
