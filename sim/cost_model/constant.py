"""Constant cost model: a hand-checkable linear formula, for tests and toy studies.

    step_time = step_s
              + per_prefill_token_s * (prefill tokens computed this step)
              + per_decode_seq_s    * (decode sequences)
              + per_swap_block_s    * (blocks swapped)

An empty step (no sequences, no swaps) costs 0.
"""
from __future__ import annotations

from typing import Sequence

import numpy as np

from sim.cost_model.base import CostModel


class ConstantCostModel(CostModel):
    name = "constant"

    def __init__(self, step_s: float = 0.01, per_prefill_token_s: float = 0.0, per_decode_seq_s: float = 0.0,
                 per_swap_block_s: float = 0.0, max_model_len: int | None = None):
        for f, v in (("step_s", step_s), ("per_prefill_token_s", per_prefill_token_s),
                     ("per_decode_seq_s", per_decode_seq_s), ("per_swap_block_s", per_swap_block_s)):
            if v < 0:
                raise ValueError(f"ConstantCostModel.{f} must be >= 0 seconds, got {v!r}")
        self.step_s = float(step_s)
        self.per_prefill_token_s = float(per_prefill_token_s)
        self.per_decode_seq_s = float(per_decode_seq_s)
        self.per_swap_block_s = float(per_swap_block_s)
        self.max_model_len = max_model_len

    def __repr__(self) -> str:
        return (f"ConstantCostModel(step_s={self.step_s}, per_prefill_token_s={self.per_prefill_token_s}, "
                f"per_decode_seq_s={self.per_decode_seq_s}, per_swap_block_s={self.per_swap_block_s})")

    def step_time_from_shape(self, prefill_new_tokens: Sequence[int], prefill_context_lens: Sequence[int],
                             num_decode_seqs: int, decode_context_sum: int, num_swap_blocks: int = 0,
                             num_prefill_samples: int | None = None, block_size: int = 16) -> float:
        self.check_shape(prefill_new_tokens, prefill_context_lens, num_decode_seqs, decode_context_sum,
                         num_swap_blocks, num_prefill_samples)
        if not prefill_new_tokens and not num_decode_seqs and not num_swap_blocks:
            return 0.0
        return (self.step_s + self.per_prefill_token_s * sum(prefill_new_tokens)
                + self.per_decode_seq_s * num_decode_seqs + self.per_swap_block_s * num_swap_blocks)

    def with_tier_copies_s(self, step_s: float, num_offload_blocks: int, num_load_blocks: int,
                           block_size: int = 16) -> float:
        return step_s + self.per_swap_block_s * (num_offload_blocks + num_load_blocks)

    def decode_step_times_s(self, num_seqs: int, start_context_sum: int, k: int) -> np.ndarray:
        if k < 0 or num_seqs < 0:
            raise ValueError(f"decode_step_times_s needs k >= 0 and num_seqs >= 0, got k={k}, num_seqs={num_seqs}")
        if num_seqs == 0:
            return np.zeros(int(k))
        return np.full(int(k), self.step_time_from_shape((), (), num_seqs, start_context_sum, 0))
