"""Rotary position embedding (NeoX / transformers "rotate_half" layout), cos/sin precomputed per position."""
from __future__ import annotations

import torch
from torch import Tensor, nn

from engine.layers import fused


def rope_inv_freq(head_dim: int, theta: float) -> Tensor:
    """[head_dim // 2] float32 inverse frequencies, bit-identical to transformers' default rope."""
    return 1.0 / (theta ** (torch.arange(0, head_dim, 2, dtype=torch.int64).float() / head_dim))


class RotaryEmbedding(nn.Module):
    """Applies RoPE to q [T, Hq, D] and k [T, Hkv, D] at integer positions [T].

    The cos/sin table [max_positions, D] is kept in float32; the rotation is done in float32 and
    cast back, so bf16 runs lose no precision in the angles at long positions.
    """

    def __init__(self, head_dim: int, max_positions: int, theta: float):
        super().__init__()
        if head_dim % 2:
            raise ValueError(f"rotary embedding needs an even head_dim, got {head_dim}")
        self.head_dim = head_dim
        self.max_positions = max_positions
        freqs = torch.outer(torch.arange(max_positions, dtype=torch.float32), rope_inv_freq(head_dim, theta))
        emb = torch.cat([freqs, freqs], dim=-1)                      # [max_positions, D]
        # Not persistent: derived from the config, never read from a checkpoint.
        self.register_buffer("cos_sin", torch.stack([emb.cos(), emb.sin()]), persistent=False)  # [2, P, D]

    def forward(self, positions: Tensor, q: Tensor, k: Tensor) -> tuple[Tensor, Tensor]:
        return fused.rope(q, k, self.cos_sin, positions)
