"""Triton kernels for paged attention (KV-cache store, prefill, decode)."""
