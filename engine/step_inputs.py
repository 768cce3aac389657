"""Host-side inputs of one forward pass, built from a scheduled Batch with numpy (no torch).

Rank 0 builds them once per step; the model runner (and, with tensor parallelism, every
worker rank) turns them into device tensors. This is the engine's per-step hot path: it is
vectorized over sequences except for gathering each sequence's new token ids and, on decode-graph
steps, patching each row's block table.
"""
from __future__ import annotations

from dataclasses import dataclass
from itertools import chain

import numpy as np

from engine.core.batch import Batch


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


class StepInputBuilder:
    """Builds each step's StepInputs from the scheduled Batch (rank 0 only).

    Decode-graph steps reuse one padded block-table array [max_graph_bs, max_blocks_per_seq]
    between steps and rewrite only what changed: a running sequence's table only grows (the block
    manager appends to the same list, and replaces the list object whenever it frees or rebuilds a
    table), so a row still holding the same list object needs at most its new tail entries. Copying
    every table every step was the largest host cost of a full decode step (~0.6 ms at 256 sequences
    of ~60 blocks). Invariant, per row r: table[r, :row_len[r]] == row_list[r][:row_len[r]], zeros after.
    """

    def __init__(self, block_size: int, max_blocks_per_seq: int, max_graph_bs: int = 0,
                 graph_tables: np.ndarray | None = None):
        """graph_tables: the [max_graph_bs, max_blocks_per_seq] int32 array to patch (the model runner
        passes its pinned host mirror of the graphs' block tables, so no copy is made between them);
        zeros are allocated when None."""
        self.block_size = block_size
        if graph_tables is None:
            graph_tables = np.zeros((max_graph_bs, max_blocks_per_seq), dtype=np.int32)
        elif graph_tables.shape != (max_graph_bs, max_blocks_per_seq) or graph_tables.any():
            raise ValueError(f"graph_tables must be an all-zero [{max_graph_bs}, {max_blocks_per_seq}] array, "
                             f"got shape {graph_tables.shape}")
        self.graph_tables = graph_tables
        self.row_list: list[list[int] | None] = [None] * max_graph_bs
        self.row_len = [0] * max_graph_bs

    def build(self, batch: Batch, graph_bs: int | None) -> StepInputs:
        """The step's flat host inputs (token ids, positions, slots, block tables).

        graph_bs: the captured decode-graph size to pad the block tables to (their width is then
        max_blocks_per_seq, the graph's), or None for an eager step (width = the longest table).
        """
        seqs, bs = batch.seqs, self.block_size
        S, P = len(seqs), batch.num_prefill_seqs
        n = np.asarray(batch.num_new_tokens, dtype=np.int64)                 # [S]
        ctx = np.asarray(batch.context_lens, dtype=np.int64)                 # [S]
        cu_q = np.zeros(S + 1, dtype=np.int64)
        np.cumsum(n, out=cu_q[1:])
        T = int(cu_q[-1])
        row = np.repeat(np.arange(S), n)                                     # [T] entry of each token
        positions = np.arange(T, dtype=np.int64) + np.repeat(ctx - n - cu_q[:-1], n)
        ctx_list = batch.context_lens                                        # python ints index faster
        ids: list[int] = []
        for i in range(P):
            ids.extend(seqs[i].token_ids[ctx_list[i] - batch.num_new_tokens[i]: ctx_list[i]])
        ids.extend([seqs[i].token_ids[ctx_list[i] - 1] for i in range(P, S)])
        input_ids = np.asarray(ids, dtype=np.int64)
        nblocks = (ctx + bs - 1) // bs
        if graph_bs is not None:
            tables = self._graph_block_tables(seqs, nblocks.tolist(), graph_bs)
        else:
            tables = _block_tables(seqs, nblocks)
        slots = tables[row, positions // bs].astype(np.int64) * bs + positions % bs
        if P == 0:          # every decode entry computes its last token, so every one samples
            sample_rows = np.arange(S)
        else:
            sample_rows = np.flatnonzero(ctx == np.fromiter((len(s.token_ids) for s in seqs), np.int64, S))
        return StepInputs(input_ids, positions, slots, ctx, cu_q, tables, P, graph_bs, sample_rows)

    def _graph_block_tables(self, seqs, nblocks: list[int], graph_bs: int) -> np.ndarray:
        tables, row_list, row_len = self.graph_tables, self.row_list, self.row_len
        for i, seq in enumerate(seqs):
            table, need, have = seq.block_table, nblocks[i], row_len[i]
            if row_list[i] is table and need >= have:
                if need > have:
                    tables[i, have:need] = table[have:need]
            else:
                tables[i, :need] = table[:need]
                if have > need:
                    tables[i, need:have] = 0
                row_list[i] = table
            row_len[i] = need
        for i in range(len(seqs), graph_bs):                                 # padding rows: empty tables
            if row_len[i]:
                tables[i, :row_len[i]] = 0
                row_list[i], row_len[i] = None, 0
        return tables[:graph_bs]


def _block_tables(seqs, nblocks: np.ndarray) -> np.ndarray:
    """[S, max(nblocks)] int32 block tables of an eager step, padded with 0."""
    width = int(nblocks.max())
    tables = np.zeros((len(seqs), width), dtype=np.int32)
    # One flat gather of every block table (row-major), scattered under a length mask: no
    # per-sequence numpy call. A table never holds more blocks than its context needs.
    flat = np.fromiter(chain.from_iterable(seq.block_table for seq in seqs), np.int32)
    if flat.size == int(nblocks.sum()):
        tables[np.arange(width) < nblocks[:, None]] = flat
    else:
        for i, seq in enumerate(seqs):
            tables[i, :nblocks[i]] = seq.block_table[:nblocks[i]]
    return tables
