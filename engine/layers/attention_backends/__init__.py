"""Paged attention backends: "torch" (reference), "triton" (engine/kernels), "flash_attn" (adapter).

    backend = get_attention_backend("auto", device)
    out = backend.forward(q, k, v, k_cache, v_cache, meta, scale)

See base.py for the forward contract and engine/layers/attention_metadata.py for the metadata.
"""
from __future__ import annotations

import importlib.util

import torch

from engine.layers.attention_backends.base import AttentionBackend
from engine.layers.attention_backends.torch_backend import TorchAttentionBackend

BACKEND_NAMES = ("auto", "torch", "triton", "flash_attn")


def flash_attn_available() -> bool:
    """True when the flash_attn package can be imported (it needs CUDA)."""
    if importlib.util.find_spec("flash_attn") is None:
        return False
    try:
        import flash_attn  # noqa: F401
    except Exception:   # a broken install (ABI mismatch) raises ImportError/OSError/RuntimeError
        return False
    return True


def get_attention_backend(name: str, device: torch.device | str = "cpu") -> AttentionBackend:
    """Returns the backend called `name`; "auto" = flash_attn if importable on CUDA, else triton on CUDA, else torch."""
    device = torch.device(device)
    if name == "auto":
        if device.type == "cuda":
            name = "flash_attn" if flash_attn_available() else "triton"
        else:
            name = "torch"
    if name == "torch":
        return TorchAttentionBackend()
    if name == "triton":
        from engine.layers.attention_backends.triton_backend import TritonAttentionBackend
        return TritonAttentionBackend()
    if name == "flash_attn":
        if not flash_attn_available():
            raise ValueError("attention backend 'flash_attn' needs the flash_attn package "
                             "(pip install 'servelab[flash]' on a CUDA machine); use 'triton' or 'torch'")
        from engine.layers.attention_backends.flash_attn_backend import FlashAttnBackend
        return FlashAttnBackend()
    raise ValueError(f"unknown attention backend {name!r}; allowed: {', '.join(BACKEND_NAMES)}")


__all__ = ["AttentionBackend", "BACKEND_NAMES", "get_attention_backend", "flash_attn_available"]
