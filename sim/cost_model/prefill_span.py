"""The prefill attention kernel's makespan: the keys its busiest program slot reads in one step.

    grid = PrefillSpanGrid.from_counts(num_sms=132, num_q_heads=16, num_kv_heads=8)   # Qwen3-0.6B on an H200
    grid.makespan_keys(num_entries=1, new_tokens=8192, context_tokens=8192)          # 37,376 keys

The kernel (engine/kernels/paged_prefill) runs one program per tile of `tile_tokens` query tokens of
one entry and one KV head; a program walks its keys `block_keys` at a time, tile i of an entry with n new
tokens on c keys reading c - n + tile_tokens * (i + 1) of them (the causal limit of its last token). The
GPU places programs in launch order (grid x, the tiles, fastest; then the KV heads) on `slots` resident
programs (SMs x programs per SM), each on the slot that frees first. So the step's attention lasts the
greedy list schedule's makespan: one serial walk over the longest context when the programs fit in the
slots (a short chunk on a long cached prefix), and the spread work plus a tail when they do not; between
those two bounds, max(spread, walk) priced a 2k-token prompt 0.93 of its H200 device time and an 8k one
1.03 (benchmarks/results/generalize/device_swap/). A program's fixed work (loads, the epilogue) counts
as one key block.

A step table keeps sums only (prefill tokens, contexts and entries per step), so a step's k entries are
priced as k equal ones of its mean new tokens and mean context, in the simulator as in the fit.
"""
from __future__ import annotations

import heapq
from dataclasses import dataclass
from functools import lru_cache
from typing import Mapping

import numpy as np

PREFILL_BLOCK_M = 64          # engine/kernels/paged_prefill.paged_prefill_attention's block_m (query rows a program)
PREFILL_BLOCK_N = 64          # its block_n: keys a program reads per iteration
PREFILL_PROGRAMS_PER_SM = 2   # its 64 x 64 tiles, 2 stages: ~80 KB of shared memory a program, two fit an H200 SM


@dataclass(frozen=True)
class PrefillSpanGrid:
    slots: int                # programs resident at once (SMs x PREFILL_PROGRAMS_PER_SM)
    num_kv_heads: int         # programs per tile (grid y)
    tile_tokens: int          # query tokens a program owns (block_m // query heads per KV head)
    block_keys: int = PREFILL_BLOCK_N
    programs_per_sm: int = PREFILL_PROGRAMS_PER_SM   # slots an SM holds: slots // this is the SM count

    def __post_init__(self):
        for name in ("slots", "num_kv_heads", "tile_tokens", "block_keys", "programs_per_sm"):
            if int(getattr(self, name)) < 1:
                raise ValueError(f"prefill_span_grid.{name} must be >= 1, got {getattr(self, name)}")

    @classmethod
    def from_counts(cls, num_sms: int | None, num_q_heads: int | None,
                    num_kv_heads: int | None) -> "PrefillSpanGrid | None":
        """The grid of a GPU and model (None when a count is unknown)."""
        if not num_sms or not num_q_heads or not num_kv_heads:
            return None
        group = int(num_q_heads) // int(num_kv_heads)
        block_m = max(PREFILL_BLOCK_M, 16, 1 << max(group - 1, 0).bit_length())
        return cls(int(num_sms) * PREFILL_PROGRAMS_PER_SM, int(num_kv_heads), block_m // group)

    @classmethod
    def from_dict(cls, data: Mapping) -> "PrefillSpanGrid":
        return cls(int(data["slots"]), int(data["num_kv_heads"]), int(data["tile_tokens"]),
                   int(data.get("block_keys", PREFILL_BLOCK_N)),
                   int(data.get("programs_per_sm", PREFILL_PROGRAMS_PER_SM)))

    def to_dict(self) -> dict:
        return {"slots": self.slots, "num_kv_heads": self.num_kv_heads, "tile_tokens": self.tile_tokens,
                "block_keys": self.block_keys, "programs_per_sm": self.programs_per_sm}

    @property
    def num_sms(self) -> int:
        return max(1, self.slots // self.programs_per_sm)

    def programs(self, num_entries: int, new_tokens: float) -> int:
        """Programs the kernel launches for num_entries equal entries holding new_tokens new tokens in all."""
        if num_entries < 1 or new_tokens < 1:
            return 0
        n = max(1, int(round(new_tokens / num_entries)))
        return int(num_entries) * -(-n // self.tile_tokens) * self.num_kv_heads

    def runs_alone(self, num_entries: int, new_tokens: float) -> bool:
        """Whether every program has an SM to itself (at most one program per SM): such a program reads its keys
        faster than one sharing its SM's bandwidth and pipelines with a second (H200, Qwen3-0.6B: a 512-token chunk
        on 16k cached keys, 128 programs, walks 0.90x the time per key of a 1,024-token one, 256 programs), so its
        keys are priced by their own coefficient, prefill_attention_span_alone."""
        return 0 < self.programs(num_entries, new_tokens) <= self.num_sms

    def makespan_keys(self, num_entries: int, new_tokens: float, context_tokens: float,
                      longest_context: float | None = None) -> float:
        """Keys the busiest slot reads in a step of num_entries prefill entries holding new_tokens new tokens and
        context_tokens keys (cached + new) in all, priced as equal entries (module docstring); 0 for none.
        longest_context (the longest entry's keys, engine.core.recorder's max_prefill_context_tokens): when every
        program is resident, the step lasts that entry's walk, not the mean entry's (a 100-token tail on 4k cached
        keys beside a fresh 400-token prompt reads 4k keys, not their mean's 2.2k)."""
        return self.span(num_entries, new_tokens, context_tokens, longest_context)[0]

    def span(self, num_entries: int, new_tokens: float, context_tokens: float,
             longest_context: float | None = None) -> tuple[float, bool]:
        """(makespan_keys, runs_alone) of one step, its programs counted once (the simulator prices every step)."""
        programs = self.programs(num_entries, new_tokens)
        if not programs:
            return 0.0, False
        k = int(num_entries)
        n = max(1, int(round(new_tokens / k)))
        if longest_context is not None and longest_context >= 1 and programs <= self.slots:
            keys = (-(-int(longest_context) // self.block_keys) + 1) * self.block_keys
        else:
            keys = _makespan(self, k, n, max(n, int(round(context_tokens / k))))
        return float(keys), programs <= self.num_sms


@lru_cache(maxsize=65536)
def _makespan(grid: PrefillSpanGrid, k: int, n: int, c: int) -> int:
    """Greedy list schedule of k entries of n new tokens on c keys, in keys (grid.block_keys a work unit)."""
    t, b = grid.tile_tokens, grid.block_keys
    tiles = -(-n // t)
    # [tiles] key blocks of each tile of one entry, +1 for a program's fixed work; entries and heads repeat it
    work = [-(-(c - n + min(t * (i + 1), n)) // b) + 1 for i in range(tiles)]
    if k * tiles * grid.num_kv_heads <= grid.slots:
        return work[-1] * b                  # every program resident at once: the longest walk
    free = [0] * grid.slots                  # min-heap of the slots' finish times
    for _ in range(k * grid.num_kv_heads):
        for w in work:
            heapq.heapreplace(free, free[0] + w)
    return max(free) * b


def table_makespan_keys(num_prefill_seqs, num_prefill_tokens, prefill_context_sum,
                        grid: PrefillSpanGrid, max_prefill_context_tokens=None) -> tuple[np.ndarray, np.ndarray]:
    """([rows] makespan_keys of each step table row whose programs share SMs, [rows] of each row whose programs
    each have an SM to itself (PrefillSpanGrid.runs_alone)); both 0 on rows without prefill entries.
    max_prefill_context_tokens: [rows] each row's longest entry (NaN or None: unknown, the mean's walk)."""
    k, n, c = (np.asarray(a, dtype=np.float64) for a in (num_prefill_seqs, num_prefill_tokens, prefill_context_sum))
    longest = np.full(len(k), np.nan) if max_prefill_context_tokens is None \
        else np.asarray(max_prefill_context_tokens, dtype=np.float64)
    shared, alone = np.zeros(len(k)), np.zeros(len(k))
    for i in np.nonzero(k > 0)[0]:
        keys, lone = grid.span(int(k[i]), n[i], c[i], None if np.isnan(longest[i]) else longest[i])
        (alone if lone else shared)[i] = keys
    return shared, alone
