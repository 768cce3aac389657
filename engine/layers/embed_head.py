"""Token embedding and LM head split along the vocabulary across tensor-parallel ranks.

The vocabulary V is padded to Vp = ceil(V / tp) * tp rows; rank r holds rows [r*Vp/tp, (r+1)*Vp/tp)
of the [V, H] table, and padding rows (past V, on the last ranks) are zero. The embedding looks up
the ids in its range, zeroes the others and all-reduces, so every rank ends with the full
[T, H] embedding. The LM head computes its [S, Vp/tp] slice of the logits and gathers the slices
to rank 0, which cuts the padding off and samples; the other ranks get None.

With tp_size = 1 there is no padding: F.embedding / F.linear over the full table, no communication.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from engine import collectives


class VocabParallelEmbedding(nn.Module):
    def __init__(self, num_embeddings: int, embedding_dim: int, tp_rank: int = 0, tp_size: int = 1):
        super().__init__()
        self.num_embeddings, self.embedding_dim = num_embeddings, embedding_dim
        self.tp_rank, self.tp_size = tp_rank, tp_size
        self.rows_per_rank = -(-num_embeddings // tp_size)                  # Vp / tp
        self.vocab_start = tp_rank * self.rows_per_rank
        # rows of the real vocabulary this rank holds (the rest of its rows are padding)
        self.num_real_rows = max(0, min(self.rows_per_rank, num_embeddings - self.vocab_start))
        self.weight = nn.Parameter(torch.empty(self.rows_per_rank, embedding_dim), requires_grad=False)

    def checkpoint_shape(self, param: str, shard: int | None) -> tuple[int, ...]:
        return (self.num_embeddings, self.embedding_dim)

    def load(self, param: str, tensor: Tensor, shard: int | None) -> None:
        n = self.num_real_rows
        self.weight.data[:n].copy_(tensor[self.vocab_start:self.vocab_start + n])
        self.weight.data[n:].zero_()

    def forward(self, ids: Tensor) -> Tensor:
        """ids [T] int64 -> [T, H]."""
        if self.tp_size == 1:
            return F.embedding(ids, self.weight)
        local = ids - self.vocab_start
        outside = (local < 0) | (local >= self.rows_per_rank)               # [T]
        y = F.embedding(local.masked_fill(outside, 0), self.weight)          # [T, H]
        y.masked_fill_(outside.unsqueeze(-1), 0)
        return collectives.all_reduce(y)


class ParallelLMHead(VocabParallelEmbedding):
    """hidden [S, H] -> logits [S, V] on rank 0 (None on other ranks). May share its weight with the
    embedding (tied embeddings): both use the same row split."""

    def forward(self, hidden: Tensor) -> Tensor | None:
        logits = F.linear(hidden, self.weight)                               # [S, Vp/tp]
        if self.tp_size == 1:
            return logits
        parts = collectives.gather_to_first(logits.contiguous(), self.tp_rank, self.tp_size)
        if parts is None:
            return None
        full = torch.cat(parts, dim=-1)                                      # [S, Vp]
        return full[:, :self.num_embeddings].contiguous() if full.shape[-1] != self.num_embeddings else full
