"""SwiGLU activation over a packed [gate | up] projection."""
from __future__ import annotations

from torch import Tensor, nn

from engine.layers import fused


class SiluAndMul(nn.Module):
    """x: [..., 2 * I] laid out as [gate | up] -> silu(gate) * up: [..., I]."""

    def forward(self, x: Tensor) -> Tensor:
        return fused.silu_and_mul(x)
