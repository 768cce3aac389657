"""What one scheduler step hands to an executor (torch-free).

An executor (the engine's model runner or the simulator's cost model) needs, per
scheduled sequence, which token positions to compute this step and where their
KV goes; plus the block copies for swapping. Sequences are listed with all
prefill work first, then decodes, so a runner can split the flat token array
at `num_prefill_seqs`.

Per entry i (sequence `seqs[i]`):
    positions computed  = [start_i, start_i + num_new_tokens[i])  where start_i = seqs[i].num_computed_tokens
    context after step  = start_i + num_new_tokens[i]   (the keys this step's queries attend to)
    samples a token     = context_i == len(seqs[i].token_ids)  (an intermediate prefill chunk samples nothing)

The slot of token position p is block_table[p // block_size] * block_size + p % block_size.
The engine builds positions and slot mappings from this in engine/step_inputs.py (the simulator
never needs them).
"""
from __future__ import annotations

from dataclasses import dataclass, field

from engine.core.sequence import Sequence


@dataclass(slots=True)
class Batch:
    seqs: list[Sequence] = field(default_factory=list)
    num_new_tokens: list[int] = field(default_factory=list)     # tokens computed per entry this step
    num_prefill_seqs: int = 0                                   # entries [0, num_prefill_seqs) are prefill work
    block_size: int = 16
    # Block copies the executor performs *before* the forward pass, as (src, dst) block ids:
    swap_out: list[tuple[int, int]] = field(default_factory=list)   # GPU block -> CPU block
    swap_in: list[tuple[int, int]] = field(default_factory=list)    # CPU block -> GPU block
    # Bookkeeping for recorders (sequences, not copies):
    preempted: list[Sequence] = field(default_factory=list)         # preempted (recompute) during this schedule
    swapped_out: list[Sequence] = field(default_factory=list)
    swapped_in: list[Sequence] = field(default_factory=list)
    rejected: list[Sequence] = field(default_factory=list)          # rejected by the policy (REJECTED, not run)
    # Context length (tokens attended to) per entry, frozen at schedule time:
    context_lens: list[int] = field(default_factory=list)

    # -- sizes (what a cost model reads) -------------------------------------------
    @property
    def num_seqs(self) -> int:
        return len(self.seqs)

    @property
    def num_decode_seqs(self) -> int:
        return len(self.seqs) - self.num_prefill_seqs

    @property
    def num_prefill_tokens(self) -> int:
        return sum(self.num_new_tokens[: self.num_prefill_seqs])

    @property
    def num_batched_tokens(self) -> int:
        return sum(self.num_new_tokens)

    @property
    def is_empty(self) -> bool:
        return not self.seqs and not self.swap_in and not self.swap_out

    def samples(self, i: int) -> bool:
        """Whether entry i produces a token this step."""
        return self.context_lens[i] == len(self.seqs[i].token_ids)
