"""RMSNorm, with the residual add fused in (one pass over the hidden states per sub-layer)."""
from __future__ import annotations

import torch
from torch import Tensor, nn


class RMSNorm(nn.Module):
    """y = x / sqrt(mean(x^2) + eps) * weight, computed in float32 and cast back (as transformers does).

    forward(x) -> y; forward(x, residual) -> (norm(x + residual), x + residual), so a decoder layer
    carries the residual stream without a separate add kernel.
    """

    def __init__(self, hidden_size: int, eps: float = 1e-6):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(hidden_size))

    def _norm(self, x: Tensor, dtype: torch.dtype) -> Tensor:
        var = x.pow(2).mean(dim=-1, keepdim=True)
        return self.weight * (x * torch.rsqrt(var + self.eps)).to(dtype)

    def forward(self, x: Tensor, residual: Tensor | None = None):
        dtype = x.dtype
        if residual is None:
            return self._norm(x.float(), dtype)
        x = x.float() + residual.float()
        residual = x.to(dtype)
        return self._norm(x, dtype), residual
