"""Astra: a CUDA-to-CUDA optimizer for the kernels of LLM serving frameworks (SGLang first)."""

__version__ = "0.1.0"
DEFAULT_SGLANG_VERSION = "0.5.23"
