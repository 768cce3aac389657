"""The cost-model contract: seconds for one scheduler step, from the step's shape.

A cost model is the simulator's executor. It never sees token ids or block
tables, only the *shape* of a step:

    prefill_new_tokens[j]    tokens computed for prefill entry j this step
    prefill_context_lens[j]  keys entry j attends to after the step (cached + new)
    num_prefill_samples      prefill entries that complete and sample a token
                             (an intermediate chunk of a chunked prefill does not)
    num_decode_seqs          decode entries (one new token each)
    decode_context_sum       sum over decode entries of their context length,
                             this step's token included
    num_swap_blocks          KV blocks copied between CPU and GPU before the pass

A step's copies for the prefix cache's CPU tier (Batch.offload, Batch.load) are
priced on top by `with_tier_copies_s(step_s, num_offload_blocks, num_load_blocks)`:
the executor may overlap them with the forward pass, so each model says how.

Decode cost depends only on the count and the SUM of the context lengths, so
the simulator's hot loop prices a step in a few microseconds, and
`decode_step_times_s` prices k consecutive pure-decode steps in one call.

Contract for every implementation (roofline, constant, calibrated, ...):
  * `step_time_from_shape` is a pure function of its arguments (no hidden state
    that changes between calls), returns seconds >= 0, and 0.0 for an empty step.
  * `decode_step_times_s(n, s0, k)[i]` equals
    `step_time_from_shape([], [], n, s0 + i * n, 0)` to float rounding.
  * A shape the model cannot price (negative or zero token counts, a context
    beyond `max_model_len`, a table lookup outside its fitted range) raises
    `CostModelError` naming the shape, never a bare KeyError or IndexError.
"""
from __future__ import annotations

from abc import ABC, abstractmethod
from operator import sub
from typing import Any, Mapping, NamedTuple, Sequence

import numpy as np


class CostModelError(ValueError):
    """A step the cost model cannot price; the message names the step's shape."""


class StepShape(NamedTuple):
    prefill_new_tokens: Sequence[int]
    prefill_context_lens: Sequence[int]
    num_decode_seqs: int
    decode_context_sum: int
    num_swap_blocks: int = 0
    num_prefill_samples: int | None = None      # None: every prefill entry completes
    block_size: int = 16

    @classmethod
    def from_batch(cls, batch) -> "StepShape":
        """Shape of an engine.core.batch.Batch (prefill entries first, then one-token decodes)."""
        p = batch.num_prefill_seqs
        ctx = batch.context_lens
        new = batch.num_new_tokens
        num_decode = len(ctx) - p
        if len(new) != len(ctx) or len(batch.seqs) != len(ctx):
            raise CostModelError(f"batch has {len(batch.seqs)} seqs, {len(new)} num_new_tokens and {len(ctx)} "
                                 f"context_lens; they must be aligned")
        if num_decode and sum(new[p:]) != num_decode:
            raise CostModelError(f"batch decode entries must compute exactly 1 token each, got "
                                 f"num_new_tokens[{p}:]={list(new[p:])[:8]}...")
        samples = 0
        if p:
            seqs = batch.seqs
            samples = sum(1 for i in range(p) if ctx[i] == len(seqs[i].token_ids))
        return cls(new[:p], ctx[:p], num_decode, sum(ctx[p:]) if num_decode else 0,
                   len(batch.swap_in) + len(batch.swap_out), samples, batch.block_size)


def describe_shape(prefill_new_tokens, prefill_context_lens, num_decode_seqs, decode_context_sum,
                   num_swap_blocks=0) -> str:
    pn, pc = list(prefill_new_tokens), list(prefill_context_lens)
    clip = (lambda xs: xs if len(xs) <= 8 else xs[:8] + ["..."])
    return (f"step shape(prefill_new_tokens={clip(pn)}, prefill_context_lens={clip(pc)}, "
            f"num_decode_seqs={num_decode_seqs}, decode_context_sum={decode_context_sum}, "
            f"num_swap_blocks={num_swap_blocks})")


class CostModel(ABC):
    """Predicts the wall-clock seconds of one scheduler step on one replica."""

    name: str = "base"
    max_model_len: int | None = None        # longest context priced; None = unchecked

    # -- what implementations provide ---------------------------------------------------
    @abstractmethod
    def step_time_from_shape(self, prefill_new_tokens: Sequence[int], prefill_context_lens: Sequence[int],
                             num_decode_seqs: int, decode_context_sum: int, num_swap_blocks: int = 0,
                             num_prefill_samples: int | None = None, block_size: int = 16) -> float:
        ...

    def decode_step_times_s(self, num_seqs: int, start_context_sum: int, k: int) -> np.ndarray:
        """Durations of k consecutive pure-decode steps; every context grows by 1 per step.

        Step i has decode_context_sum = start_context_sum + i * num_seqs. Subclasses
        override this with a vectorized form; this fallback is the reference loop.
        """
        return np.array([self.step_time_from_shape((), (), num_seqs, start_context_sum + i * num_seqs, 0)
                         for i in range(int(k))], dtype=np.float64)

    # True when decode_step_times_s also takes start_max_context (the first step's longest context; every
    # context grows by 1 per step) and its times depend on it (the calibrated model's decode_tail_keys)
    prices_longest_decode: bool = False

    def decode_step_times_list(self, num_seqs: int, start_context_sum: int, k: int,
                               start_max_context: int | None = None) -> list[float]:
        """decode_step_times_s as a list of floats (what the simulator's fast path consumes)."""
        if self.prices_longest_decode:
            return self.decode_step_times_s(num_seqs, start_context_sum, k, start_max_context).tolist()
        return self.decode_step_times_s(num_seqs, start_context_sum, k).tolist()

    def decode_overlap_parts_lists(self, num_seqs: int, start_context_sum: int, k: int,
                                   start_max_context: int | None = None) -> tuple[list, list, list] | None:
        """overlap_parts_s of the k pure-decode steps decode_step_times_list prices, as three [k] lists of
        floats (before the launch, device, after the tokens): the same numbers overlap_parts_s gives each
        step's batch (the simulator's overlap fast path, sim/fast_path.py). None for a model whose
        overlap_parts_s has no such form here (the overlap loop then steps one at a time)."""
        if type(self).overlap_parts_s is not CostModel.overlap_parts_s:
            return None
        steps = self.decode_step_times_list(num_seqs, start_context_sum, k, start_max_context)
        zeros = [0.0] * len(steps)
        return zeros, steps, zeros

    # -- what the simulator calls ----------------------------------------------------------
    def step_time_s(self, batch) -> float:
        """Seconds to execute an engine.core.batch.Batch (swaps first, then the forward pass)."""
        shape = StepShape.from_batch(batch)
        # Per-sequence check the sums cannot make (one long context among short ones).
        if self.max_model_len is not None and batch.context_lens and max(batch.context_lens) > self.max_model_len:
            raise CostModelError(f"{type(self).__name__} cannot price {describe_shape(*shape[:5])}: context_lens "
                                 f"max {max(batch.context_lens)} exceeds max_model_len={self.max_model_len}")
        t = self.step_time_from_shape(*shape)
        if batch.offload or batch.load:
            t = self.with_tier_copies_s(t, len(batch.offload), len(batch.load), batch.block_size)
        return t

    def overlap_parts_s(self, batch) -> tuple[float, float, float]:
        """step_time_s(batch) in the three parts overlap scheduling sets apart (the simulator's overlap loop,
        docs/overlap.md): (host seconds before the step's launch: scheduling, input preparation; the device's
        seconds; host seconds once its tokens are on the host: postprocess, finished requests, the loop).
        Default: all device time (a model without a host term)."""
        return 0.0, self.step_time_s(batch), 0.0

    def cold_start_s(self, idle_s: float) -> float:
        """Extra host seconds before the first step a replica schedules after sitting idle for idle_s seconds
        (the simulator adds them to that step). Default: none."""
        return 0.0

    def with_tier_copies_s(self, step_s: float, num_offload_blocks: int, num_load_blocks: int,
                           block_size: int = 16) -> float:
        """Seconds of a step whose forward pass and swaps take step_s, with the CPU tier's copies:
        num_offload_blocks GPU -> host, num_load_blocks host -> GPU. Default: step_s plus what a step
        swapping that many blocks costs beyond an empty step (models override it with their own terms)."""
        n = num_offload_blocks + num_load_blocks
        if not n:
            return step_s
        return step_s + self.step_time_from_shape((), (), 0, 0, n, None, block_size)

    # -- shared validation -------------------------------------------------------------------
    def check_shape(self, prefill_new_tokens, prefill_context_lens, num_decode_seqs, decode_context_sum,
                    num_swap_blocks, num_prefill_samples) -> None:
        """Raise CostModelError naming the shape when it cannot be priced (cheap: a few comparisons)."""
        problem = None
        n_pre = len(prefill_new_tokens)
        if len(prefill_context_lens) != n_pre:
            problem = "prefill_new_tokens and prefill_context_lens differ in length"
        elif n_pre and min(prefill_new_tokens) < 1:
            problem = "a prefill entry computes < 1 token"
        elif n_pre and min(map(sub, prefill_context_lens, prefill_new_tokens)) < 0:
            problem = "a prefill context_len is smaller than its new tokens"
        elif num_decode_seqs < 0 or num_swap_blocks < 0:
            problem = "negative num_decode_seqs or num_swap_blocks"
        elif decode_context_sum < num_decode_seqs:
            problem = "decode_context_sum is below num_decode_seqs (each decode attends to >= 1 key)"
        elif num_prefill_samples is not None and not 0 <= num_prefill_samples <= n_pre:
            problem = f"num_prefill_samples={num_prefill_samples} not in [0, {n_pre}]"
        elif self.max_model_len is not None and (
                (n_pre and max(prefill_context_lens) > self.max_model_len)
                or decode_context_sum > num_decode_seqs * self.max_model_len):
            problem = f"a context exceeds max_model_len={self.max_model_len}"
        if problem:
            shape = describe_shape(prefill_new_tokens, prefill_context_lens, num_decode_seqs, decode_context_sum,
                                   num_swap_blocks)
            raise CostModelError(f"{type(self).__name__} cannot price {shape}: {problem}")


# Per-step table columns a fitted model trains on. The recorder's per-step table
# should carry them under these names (StepShape.from_batch computes all of them).
STEP_TABLE_COLUMNS = (
    "duration_s",              # measured wall time of the step (the target)
    "num_prefill_seqs", "num_prefill_tokens", "prefill_context_sum", "prefill_attention_pairs",
    "num_prefill_samples", "num_decode_seqs", "decode_context_sum", "num_swap_blocks",
)


class FittedCostModel(CostModel):
    """Base for cost models fitted to step times the engine measured (e.g. `calibrated`).

    Contract on top of CostModel's:
      * `fit(steps)` takes the per-step table of a profiling run (a pandas DataFrame
        or a mapping of equal-length columns with the names in STEP_TABLE_COLUMNS)
        and returns a model; fitting is deterministic for a given table.
      * `to_dict()` returns plain JSON-able data (coefficients, the fitted range,
        the model and hardware names); `from_dict(d)` rebuilds an equal model. One
        small data file per (hardware, model) is shipped this way.
      * Outside the fitted range the model either extrapolates by a documented
        rule or raises CostModelError naming the shape; it never fails with a
        KeyError from a lookup.
    """

    @classmethod
    @abstractmethod
    def fit(cls, steps: Any, **options) -> "FittedCostModel":
        ...

    @abstractmethod
    def to_dict(self) -> dict:
        ...

    @classmethod
    @abstractmethod
    def from_dict(cls, data: Mapping[str, Any]) -> "FittedCostModel":
        ...
