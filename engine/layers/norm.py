"""RMSNorm, with the residual add fused in (one pass over the hidden states per sub-layer)."""
from __future__ import annotations

import torch
from torch import Tensor, nn

from engine.layers import fused


class RMSNorm(nn.Module):
    """y = x / sqrt(mean(x^2) + eps) * weight, computed in float32 and cast back (as transformers does).

    forward(x) -> y; forward(x, residual) -> (norm(x + residual), x + residual), so a decoder layer
    carries the residual stream without a separate add kernel.
    """

    def __init__(self, hidden_size: int, eps: float = 1e-6):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(hidden_size))

    def forward(self, x: Tensor, residual: Tensor | None = None):
        if residual is None:
            return fused.rms_norm(x, self.weight, self.eps)
        return fused.add_rms_norm(x, residual, self.weight, self.eps)
