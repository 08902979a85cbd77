"""GPU side of Astra: build, check and time one candidate kernel per process (stdlib, torch, tvm_ffi only)."""
