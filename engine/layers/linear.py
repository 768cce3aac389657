"""Linear layers split across tensor-parallel ranks (Megatron layout), packed projections included.

Column-parallel: W [out, in] is split along out; rank r holds rows [r*out/tp, (r+1)*out/tp) and
    produces its slice of the output features. No communication.
Row-parallel: W is split along in; rank r holds columns [r*in/tp, (r+1)*in/tp), reads its slice
    of the input features and the partial outputs are summed by an all-reduce. The bias is added
    once, by rank 0, before the sum.
Packed column layers (q/k/v -> qkv_proj, gate/up -> gate_up_proj) hold several checkpoint
    projections one after another along out, each split on its own, so rank r's weight is
    [q_r; k_r; v_r]. Packed shard i occupies local rows shard_rows(i).

With tp_size = 1 every layer is one F.linear over the full weight (what nn.Linear does) and
nothing is communicated. Loading (engine/loader.py): checkpoint_shape(param, shard) is the shape
the full checkpoint tensor must have; load(param, tensor, shard) copies this rank's slice of it.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from engine import collectives
from engine.core.kv_layout import first_kv_head, kv_heads_per_rank


def divide(n: int, tp_size: int, what: str) -> int:
    if n % tp_size:
        raise ValueError(f"{what}={n} is not divisible by tensor_parallel_size={tp_size}; choose a "
                         f"tensor_parallel_size that divides it")
    return n // tp_size


def kv_heads_of_rank(num_kv_heads: int, tp_rank: int, tp_size: int) -> tuple[int, int]:
    """(KV heads rank tp_rank holds, index of its first one): engine.core.kv_layout's split."""
    return kv_heads_per_rank(num_kv_heads, tp_size), first_kv_head(num_kv_heads, tp_rank, tp_size)


class ColumnParallelLinear(nn.Module):
    """y[..., local out] = x @ W_r^T (+ b_r). Packed when `output_sizes` has several entries.

    full_sizes[i]: rows of checkpoint projection i; output_sizes[i]: rows this rank keeps of it,
    starting at checkpoint row source_starts[i]. Unpacked layers (one projection) load with shard None.
    """

    def __init__(self, in_features: int, out_features: int, bias: bool = False, tp_rank: int = 0,
                 tp_size: int = 1):
        local = divide(out_features, tp_size, "out_features")
        self._setup(in_features, [out_features], [local], [tp_rank * local], bias, tp_rank, tp_size, packed=False)

    def _setup(self, in_features, full_sizes, local_sizes, source_starts, bias, tp_rank, tp_size, packed=True):
        nn.Module.__init__(self)
        self.in_features, self.tp_rank, self.tp_size = in_features, tp_rank, tp_size
        self.full_sizes, self.source_starts = list(full_sizes), list(source_starts)
        self.local_sizes = list(local_sizes)
        self.packed = packed            # packed: the loader fills shards 0..len(full_sizes)-1 separately
        self.weight = nn.Parameter(torch.empty(sum(local_sizes), in_features), requires_grad=False)
        self.bias = nn.Parameter(torch.empty(sum(local_sizes)), requires_grad=False) if bias else None

    def shard_rows(self, shard: int | None) -> tuple[int, int]:
        """(start, stop) local rows of packed shard `shard` (None: the whole unpacked weight)."""
        i = shard or 0
        start = sum(self.local_sizes[:i])
        return start, start + self.local_sizes[i]

    def checkpoint_shape(self, param: str, shard: int | None) -> tuple[int, ...]:
        rows = self.full_sizes[shard or 0]
        return (rows, self.in_features) if param == "weight" else (rows,)

    def load(self, param: str, tensor: Tensor, shard: int | None) -> None:
        start, stop = self.shard_rows(shard)
        src = self.source_starts[shard or 0]
        getattr(self, param).data[start:stop].copy_(tensor[src:src + stop - start])

    def forward(self, x: Tensor) -> Tensor:
        return F.linear(x, self.weight, self.bias)


class MergedColumnParallelLinear(ColumnParallelLinear):
    """Several projections of the same input packed along out (gate/up), each split across ranks."""

    def __init__(self, in_features: int, output_sizes: list[int], bias: bool = False, tp_rank: int = 0,
                 tp_size: int = 1):
        local = [divide(s, tp_size, f"output_sizes[{i}]") for i, s in enumerate(output_sizes)]
        self._setup(in_features, output_sizes, local, [tp_rank * n for n in local], bias, tp_rank, tp_size)

    @property
    def output_sizes(self) -> list[int]:
        """Local rows per packed shard (what split() cuts the output into)."""
        return self.local_sizes

    def split(self, out: Tensor) -> tuple[Tensor, ...]:
        """[..., sum(output_sizes)] -> one tensor per packed shard."""
        return out.split(self.local_sizes, dim=-1)


class QKVParallelLinear(MergedColumnParallelLinear):
    """q, k, v projections packed; query heads split evenly, KV heads split or replicated (GQA)."""

    def __init__(self, hidden_size: int, head_dim: int, num_heads: int, num_kv_heads: int, bias: bool = False,
                 tp_rank: int = 0, tp_size: int = 1):
        q_heads = divide(num_heads, tp_size, "num_attention_heads")
        kv_heads, first_kv = kv_heads_of_rank(num_kv_heads, tp_rank, tp_size)
        full = [num_heads * head_dim, num_kv_heads * head_dim, num_kv_heads * head_dim]
        local = [q_heads * head_dim, kv_heads * head_dim, kv_heads * head_dim]
        starts = [tp_rank * q_heads * head_dim, first_kv * head_dim, first_kv * head_dim]
        self._setup(hidden_size, full, local, starts, bias, tp_rank, tp_size)
        self.num_heads, self.num_kv_heads = q_heads, kv_heads          # this rank's


class RowParallelLinear(nn.Module):
    """y [..., out] = sum over ranks of x_r @ W_r^T, + b (added by rank 0 only)."""

    def __init__(self, in_features: int, out_features: int, bias: bool = False, tp_rank: int = 0,
                 tp_size: int = 1):
        super().__init__()
        self.in_features, self.out_features, self.tp_rank, self.tp_size = in_features, out_features, tp_rank, tp_size
        self.local_in = divide(in_features, tp_size, "in_features")
        self.weight = nn.Parameter(torch.empty(out_features, self.local_in), requires_grad=False)
        self.bias = nn.Parameter(torch.empty(out_features), requires_grad=False) if bias else None

    def checkpoint_shape(self, param: str, shard: int | None) -> tuple[int, ...]:
        return (self.out_features, self.in_features) if param == "weight" else (self.out_features,)

    def load(self, param: str, tensor: Tensor, shard: int | None) -> None:
        if param == "weight":
            start = self.tp_rank * self.local_in
            tensor = tensor[:, start:start + self.local_in]
        getattr(self, param).data.copy_(tensor)

    def forward(self, x: Tensor) -> Tensor:
        if self.tp_size == 1:
            return F.linear(x, self.weight, self.bias)
        y = F.linear(x, self.weight, self.bias if self.tp_rank == 0 else None)
        return collectives.all_reduce(y)
