"""Host-side inputs of one forward pass, built from a scheduled Batch with numpy (no torch).

Rank 0 builds them once per step; the model runner (and, with tensor parallelism, every
worker rank) turns them into device tensors. This is the engine's per-step hot path: it is
vectorized over sequences except for gathering each sequence's new token ids.
"""
from __future__ import annotations

from dataclasses import dataclass
from itertools import chain

import numpy as np

from engine.batch import Batch


@dataclass
class StepInputs:
    """Host inputs of one forward pass, built once by rank 0 and identical on every rank.
    S = scheduled sequences (prefills first), T = tokens this step."""
    input_ids: np.ndarray          # [T] int64
    positions: np.ndarray          # [T] int64
    slots: np.ndarray              # [T] int64 KV slot of each token
    context_lens: np.ndarray       # [S] int64 tokens in the KV cache after this step
    cu_seqlens_q: np.ndarray       # [S + 1] int64 token offsets of the entries
    block_tables: np.ndarray       # [graph_bs or S, width] int32, padded with 0
    num_prefill_seqs: int
    graph_bs: int | None           # captured decode graph to replay, None = eager
    sample_rows: np.ndarray        # [num_sampled] entries of this step that sample a token


def build_step_inputs(batch: Batch, block_size: int, max_blocks_per_seq: int, graph_bs: int | None) -> StepInputs:
    """The step's flat host inputs from the scheduled batch (token ids, positions, slots, block tables).

    graph_bs: the captured decode-graph size to pad the block tables to (their width is then
    max_blocks_per_seq, the graph's), or None for an eager step (width = the longest table).
    """
    seqs, bs = batch.seqs, block_size
    S, P = len(seqs), batch.num_prefill_seqs
    n = np.asarray(batch.num_new_tokens, dtype=np.int64)                 # [S]
    ctx = np.asarray(batch.context_lens, dtype=np.int64)                 # [S]
    cu_q = np.zeros(S + 1, dtype=np.int64)
    np.cumsum(n, out=cu_q[1:])
    T = int(cu_q[-1])
    row = np.repeat(np.arange(S), n)                                     # [T] entry of each token
    positions = np.arange(T, dtype=np.int64) + np.repeat(ctx - n - cu_q[:-1], n)
    ids: list[int] = []
    for i in range(P):
        ids.extend(seqs[i].token_ids[ctx[i] - n[i]: ctx[i]])
    ids.extend(seqs[i].token_ids[ctx[i] - 1] for i in range(P, S))
    input_ids = np.asarray(ids, dtype=np.int64)
    nblocks = (ctx + bs - 1) // bs
    width = max_blocks_per_seq if graph_bs is not None else int(nblocks.max())
    tables = np.zeros((graph_bs or S, width), dtype=np.int32)            # [S, width], padded with 0
    # One flat gather of every block table (row-major), scattered under a length mask: no
    # per-sequence numpy call. A table never holds more blocks than its context needs.
    flat = np.fromiter(chain.from_iterable(seq.block_table for seq in seqs), np.int32)
    if flat.size == int(nblocks.sum()):
        tables[:S][np.arange(width) < nblocks[:, None]] = flat
    else:
        for i, seq in enumerate(seqs):
            tables[i, :nblocks[i]] = seq.block_table[:nblocks[i]]
    slots = tables[row, positions // bs].astype(np.int64) * bs + positions % bs
    sample_rows = np.flatnonzero(ctx == np.fromiter((len(s.token_ids) for s in seqs), np.int64, S))
    return StepInputs(input_ids, positions, slots, ctx, cu_q, tables, P, graph_bs, sample_rows)
