"""Linear layers whose weight packs several checkpoint projections along the output dimension.

One matmul for q/k/v (and one for gate/up) instead of three (two). The loader writes each
checkpoint tensor into its row range: shard i occupies rows [sum(output_sizes[:i]), sum(output_sizes[:i+1])).
"""
from __future__ import annotations

from torch import Tensor, nn


class PackedLinear(nn.Linear):
    def __init__(self, in_features: int, output_sizes: list[int], bias: bool = False):
        super().__init__(in_features, sum(output_sizes), bias=bias)
        self.output_sizes = list(output_sizes)

    def shard_rows(self, shard: int) -> tuple[int, int]:
        """(start, stop) rows of shard `shard` in the packed weight [sum(output_sizes), in_features]."""
        start = sum(self.output_sizes[:shard])
        return start, start + self.output_sizes[shard]

    def split(self, out: Tensor) -> tuple[Tensor, ...]:
        """[..., sum(output_sizes)] -> one tensor per shard."""
        return out.split(self.output_sizes, dim=-1)
