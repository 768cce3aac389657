"""Rotary position embedding (NeoX / transformers "rotate_half" layout), cos/sin precomputed per position.

RoPE variants: "default" (plain inverse frequencies) and "llama3" (Llama 3.1+ frequency scaling:
long wavelengths divided by `factor`, short ones kept, a smooth blend between), as transformers'
modeling_rope_utils computes them.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch import Tensor, nn

from engine.layers import fused


def rope_inv_freq(head_dim: int, theta: float) -> Tensor:
    """[head_dim // 2] float32 inverse frequencies, bit-identical to transformers' default rope."""
    return 1.0 / (theta ** (torch.arange(0, head_dim, 2, dtype=torch.int64).float() / head_dim))


@dataclass(frozen=True)
class RopeScaling:
    """Llama 3 RoPE frequency scaling (config.json `rope_scaling` / `rope_parameters` with rope_type "llama3")."""
    factor: float
    low_freq_factor: float
    high_freq_factor: float
    original_max_position_embeddings: int
    rope_type: str = "llama3"

    @classmethod
    def from_hf(cls, rope: dict, max_positions: int) -> "RopeScaling":
        missing = [k for k in ("factor", "low_freq_factor", "high_freq_factor") if k not in rope]
        if missing:
            raise ValueError(f"config.json's llama3 rope scaling lacks {missing}")
        return cls(float(rope["factor"]), float(rope["low_freq_factor"]), float(rope["high_freq_factor"]),
                   int(rope.get("original_max_position_embeddings", max_positions)))

    def apply(self, inv_freq: Tensor) -> Tensor:
        """[D/2] inverse frequencies -> the scaled ones (same float32 ops as transformers)."""
        low_wavelen = self.original_max_position_embeddings / self.low_freq_factor
        high_wavelen = self.original_max_position_embeddings / self.high_freq_factor
        wavelen = 2 * math.pi / inv_freq
        scaled = torch.where(wavelen > low_wavelen, inv_freq / self.factor, inv_freq)
        smooth = ((self.original_max_position_embeddings / wavelen - self.low_freq_factor)
                  / (self.high_freq_factor - self.low_freq_factor))
        blended = (1 - smooth) * scaled / self.factor + smooth * scaled
        medium = ~(wavelen < high_wavelen) * ~(wavelen > low_wavelen)
        return torch.where(medium, blended, scaled)


class RotaryEmbedding(nn.Module):
    """Applies RoPE to q [T, Hq, D] and k [T, Hkv, D] at integer positions [T].

    The cos/sin table [max_positions, D] is kept in float32; the rotation is done in float32 and
    cast back, so bf16 runs lose no precision in the angles at long positions.
    """

    def __init__(self, head_dim: int, max_positions: int, theta: float, scaling: RopeScaling | None = None):
        super().__init__()
        if head_dim % 2:
            raise ValueError(f"rotary embedding needs an even head_dim, got {head_dim}")
        self.head_dim = head_dim
        self.max_positions = max_positions
        inv_freq = rope_inv_freq(head_dim, theta)                    # [D/2]
        if scaling is not None:
            inv_freq = scaling.apply(inv_freq)
        freqs = torch.outer(torch.arange(max_positions, dtype=torch.float32), inv_freq)
        emb = torch.cat([freqs, freqs], dim=-1)                      # [max_positions, D]
        # Not persistent: derived from the config, never read from a checkpoint.
        self.register_buffer("cos_sin", torch.stack([emb.cos(), emb.sin()]), persistent=False)  # [2, P, D]

    def forward(self, positions: Tensor, q: Tensor, k: Tensor) -> tuple[Tensor, Tensor]:
        return fused.rope(q, k, self.cos_sin, positions)
