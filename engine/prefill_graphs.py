"""CUDA graphs for steps with prefill tokens, captured per padded token count.

Why: an eager forward pass launches ~10 kernels per layer from Python, and on an H200 with a
small model the host cannot keep up: a prefill step of Qwen3-0.6B took 20-70 ms of host time
for 1-4 ms of GPU work, and the spread of that host time made step times unpredictable. A
replayed graph costs one launch.

Layout of a graph step with T tokens padded to a captured size T_pad, P_pad = min(T_pad,
max_num_seqs) entries:
    tokens [0, T) are the step's (prefill entries then decodes), [T, T_pad) padding: token 0 at
        position 0, slot -1 (not stored), attending to nothing (output rows zero);
    every scheduled sequence is a varlen prefill entry (a decode is an entry with one new token),
        entries [S, P_pad) are padding with no tokens and no keys (cu_seqlens repeat their last value).
The attention backend must handle this layout without reading it on the host (graph_safe, see
engine/layers/attention_backends/base.py). Each scheduled sequence has at least one token, so
S <= min(T, max_num_seqs) <= P_pad: every step of at most T_pad tokens fits the graph of T_pad.

Inputs are written into pinned host mirrors, then copied asynchronously into the graphs' static
device buffers. Reusing the mirrors is safe for the reason given in ModelRunner._fill_graph_inputs:
the previous step's copies finished before its sampled tokens reached the host. With overlap
scheduling the host fills the next step before collecting the previous one, so an event recorded
after each fill's copies is waited for first (`inputs_copied`).
"""
from __future__ import annotations

import bisect
import time

import numpy as np
import torch

from engine.core.graph_sizes import prefill_graph_sizes
from engine.graph_warmup import replay_once
from engine.layers.attention_metadata import AttentionMetadata
from engine.step_inputs import StepInputs


class PrefillGraphs:
    """Static buffers, captured graphs and the per-step fill/replay for padded prefill steps.

    Until capture() has run, forward() runs the model eagerly on the same padded inputs (CPU, tests)."""

    def __init__(self, model, kv_caches, device: torch.device, dtype: torch.dtype, max_tokens: int,
                 max_num_seqs: int, max_blocks_per_seq: int, max_model_len: int):
        self.model, self.kv_caches, self.device = model, kv_caches, device
        self.sizes = prefill_graph_sizes(max_tokens)
        if not self.sizes:
            raise ValueError(f"prefill_graph_max_tokens must be >= 16 to capture any prefill graph, got {max_tokens}")
        self.max_num_seqs, self.max_model_len = max_num_seqs, max_model_len
        T, P = self.sizes[-1], self._num_entries(self.sizes[-1])
        host = dict(
            input_ids=torch.zeros(T, dtype=torch.int64),
            positions=torch.zeros(T, dtype=torch.int64),
            slot_mapping=torch.full((T,), -1, dtype=torch.int64),
            cu_seqlens_q=torch.zeros(P + 1, dtype=torch.int32),
            cu_seqlens_k=torch.zeros(P + 1, dtype=torch.int32),
            block_tables=torch.zeros(P, max_blocks_per_seq, dtype=torch.int32),
        )
        pin = device.type == "cuda"
        self.host_t = {k: v.pin_memory() if pin else v for k, v in host.items()}
        self.host = {k: v.numpy() for k, v in self.host_t.items()}
        self.dev = {k: v.to(device, copy=True) for k, v in self.host_t.items()}   # distinct on CPU too
        self.outputs = torch.zeros(T, model.config.hidden_size, dtype=dtype, device=device)
        self.graphs: dict[int, torch.cuda.CUDAGraph] = {}
        self.capture_s: float | None = None             # wall seconds capture() took
        # overlap scheduling (the model runner sets it): recorded after each fill's copies, waited for before
        # the next fill overwrites the pinned buffers
        self.inputs_copied: torch.cuda.Event | None = None

    def _num_entries(self, num_tokens: int) -> int:
        return min(num_tokens, self.max_num_seqs)

    def size_for(self, num_tokens: int) -> int | None:
        """The smallest captured size holding num_tokens, None when the step is too large."""
        i = bisect.bisect_left(self.sizes, num_tokens)
        return self.sizes[i] if i < len(self.sizes) else None

    def _args(self, size: int):
        """(input_ids, positions, meta, kv_caches) over the static buffers, for a graph of `size` tokens."""
        d, P = self.dev, self._num_entries(size)
        empty = torch.zeros(0, dtype=torch.int32, device=self.device)
        meta = AttentionMetadata(
            num_prefill_seqs=P, num_prefill_tokens=size, slot_mapping=d["slot_mapping"][:size],
            cu_seqlens_q=d["cu_seqlens_q"][:P + 1], cu_seqlens_k=d["cu_seqlens_k"][:P + 1],
            # max_seqlen_*: bounds only; graph-safe backends do not read them
            max_seqlen_q=size, max_seqlen_k=self.max_model_len,
            prefill_block_tables=d["block_tables"][:P],
            decode_context_lens=empty, decode_block_tables=empty.reshape(0, d["block_tables"].shape[1]))
        return d["input_ids"][:size], d["positions"][:size], meta, self.kv_caches

    @torch.inference_mode()
    def capture(self, pool=None):
        """Captures one graph per size, largest first so the smaller ones reuse its memory; returns the pool.

        The static buffers hold an all-padding step meanwhile (no entry has a token, no slot is stored)."""
        t0 = time.perf_counter()
        for size in reversed(self.sizes):
            args = self._args(size)
            self.outputs[:size] = self.model(*args)         # warm-up (lazy init, kernel compiles) outside the graph
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph, pool):
                self.outputs[:size] = self.model(*args)
            pool = graph.pool() if pool is None else pool
            self.graphs[size] = graph
        replay_once(self.graphs.values(), self.device)      # each graph's first-replay set-up, here
        self.capture_s = time.perf_counter() - t0
        return pool

    def forward(self, step: StepInputs, size: int, resolve=None) -> torch.Tensor:
        """hidden [T, H] of the step, computed at the padded size (graph replay if captured).
        resolve: called on the device input ids [T] before the forward pass (overlap scheduling's
        placeholders, engine.model_runner.ModelRunner._resolve_placeholders)."""
        self._fill(step, size)
        if resolve is not None:
            resolve(self.dev["input_ids"][:len(step.input_ids)])
        graph = self.graphs.get(size)
        if graph is not None:
            graph.replay()
        else:
            self.outputs[:size] = self.model(*self._args(size))
        return self.outputs[:len(step.input_ids)]

    def _fill(self, step: StepInputs, size: int) -> None:
        h = self.host
        if self.inputs_copied is not None:      # overlap scheduling: the last fill's copies may be queued still
            self.inputs_copied.synchronize()
        T, S, P = len(step.input_ids), len(step.context_lens), self._num_entries(size)
        h["input_ids"][:T], h["input_ids"][T:size] = step.input_ids, 0
        h["positions"][:T], h["positions"][T:size] = step.positions, 0
        h["slot_mapping"][:T], h["slot_mapping"][T:size] = step.slots, -1
        h["cu_seqlens_q"][:S + 1], h["cu_seqlens_q"][S + 1:P + 1] = step.cu_seqlens_q, T
        np.cumsum(step.context_lens, out=h["cu_seqlens_k"][1:S + 1])
        h["cu_seqlens_k"][S + 1:P + 1] = h["cu_seqlens_k"][S]
        # Only the scheduled rows' leading columns are read (an entry reads the blocks its keys need);
        # stale columns and rows past S are never read.
        width = step.block_tables.shape[1]
        h["block_tables"][:S, :width] = step.block_tables[:S]
        ht, d = self.host_t, self.dev
        for name, n in (("input_ids", size), ("positions", size), ("slot_mapping", size),
                        ("cu_seqlens_q", P + 1), ("cu_seqlens_k", P + 1), ("block_tables", S)):
            d[name][:n].copy_(ht[name][:n], non_blocking=True)
        if self.inputs_copied is not None:
            self.inputs_copied.record()
