"""Executes scheduled batches on the model: KV cache, swap space, input preparation, CUDA graphs, sampling.

    runner = ModelRunner(EngineConfig(model_path=path))
    token_ids = runner.execute(batch)      # list aligned with batch.seqs: int where batch.samples(i), else None

KV cache: one tensor [2 (k|v), num_layers, num_blocks, block_size, num_kv_heads, head_dim]; layer l uses
the contiguous views kv[0, l] and kv[1, l]. The swap space (engine/swap_space.py) holds num_cpu_blocks
blocks in host memory (pinned on CUDA, block-major), copied by the device in stream order.
The prefix cache's CPU tier (engine/cpu_tier_space.py, cpu_cache_num_blocks blocks) offloads and loads
blocks around the forward pass, its device->host transfer overlapping it.

Tensor parallel (config.tensor_parallel_size = tp > 1): the runner of rank 0 (the LLM's) spawns
ranks 1..tp-1 (engine/workers.py), each with a runner of its own on GPU `device + rank` holding
its weight shards and its share of the KV heads (num_kv_heads is then per rank). Every step, rank 0
prepares the host inputs (StepInputs) once and sends them, with the swap lists, to the workers;
all ranks then swap, run the forward pass and the LM head together, and rank 0 samples. All ranks
hold the same block ids, so the scheduler's block tables are valid on each. With tp = 1 none of
this runs: no process group, no messages, no extra copies.
"""
from __future__ import annotations

import time
import warnings

import numpy as np
import torch

from engine.config import EngineConfig
from engine.core.batch import Batch
from engine.core.graph_sizes import decode_graph_sizes
from engine.core.in_flight import PLACEHOLDER_BASE
from engine.core.kv_layout import cpu_cache_blocks, kv_block_bytes
from engine.cpu_tier_space import CpuTierSpace
from engine.graph_warmup import replay_once, warm_lm_head
from engine.layers import fused
from engine.layers.attention_backends import get_attention_backend
from engine.layers.attention_metadata import AttentionMetadata
from engine.layers.sampler import Sampler, SamplingTensors
from engine.loader import build_model
from engine.models import load_hf_config
from engine.prefill_graphs import PrefillGraphs
from engine.step_inputs import StepInputBuilder, StepInputs
from engine.swap_space import SwapSpace

GIB = 1 << 30
_DTYPES = {"bfloat16": torch.bfloat16, "float16": torch.float16, "float32": torch.float32}


def resolve_device(name: str, rank: int = 0, tp_size: int = 1) -> torch.device:
    """The device of tensor-parallel rank `rank`: GPU index + rank on CUDA, the CPU otherwise."""
    if name == "auto":
        name = "cuda" if torch.cuda.is_available() else "cpu"
    device = torch.device(name)
    if device.type == "cuda" and not torch.cuda.is_available():
        raise RuntimeError(f"device={name!r} was requested but CUDA is not available (torch {torch.__version__}, "
                           f"built with CUDA {torch.version.cuda}); install a CUDA build of torch or use device='cpu'")
    if device.type == "cuda":
        base = torch.cuda.current_device() if device.index is None else device.index
        count = torch.cuda.device_count()
        if base + tp_size > count:
            raise ValueError(f"tensor_parallel_size={tp_size} from GPU {base} needs GPUs {base}..{base + tp_size - 1} "
                             f"but this host has {count}; lower tensor_parallel_size or start at a lower device")
        device = torch.device("cuda", base + rank)
    return device


def resolve_dtype(name: str, hf_config: dict, device: torch.device) -> torch.dtype:
    """"auto": float32 on CPU; on CUDA float16 if the checkpoint is float16, else bfloat16."""
    if name != "auto":
        return _DTYPES[name]
    if device.type != "cuda":
        return torch.float32
    ckpt = hf_config.get("torch_dtype") or hf_config.get("dtype")
    return torch.float16 if ckpt == "float16" else torch.bfloat16


class LaunchedStep:
    """A step queued on the device (ModelRunner.launch); ModelRunner.collect returns its tokens."""
    __slots__ = ("tokens", "sample_rows", "num_seqs", "offload", "host", "ready", "timing", "copy_host_s")

    def __init__(self, tokens, sample_rows, num_seqs: int, offload: bool = False):
        self.tokens = tokens                # [num_sampled] int64 on the device; None: nothing sampled
        self.sample_rows = sample_rows      # [num_sampled] entries of the batch that sampled
        self.num_seqs = num_seqs
        self.offload = offload              # collect() waits for the CPU tier's offloads
        self.host = None                    # overlap on CUDA: pinned copy of tokens, valid once `ready` passed
        self.ready = None
        self.timing = None                  # time_device on CUDA: (start, end) timing events around the step
        self.copy_host_s = None             # host seconds in the step's block copies (None: it had none)


def resolve_placeholders_torch(input_ids: torch.Tensor, prev: torch.Tensor) -> None:
    """input_ids [T] int64: each PLACEHOLDER_BASE + k becomes prev[k] ([num_prev] int64), in place, in PyTorch
    operations (six small kernels on a GPU, where engine/kernels/resolve_placeholders.py does it in one)."""
    rows = (input_ids - PLACEHOLDER_BASE).clamp_(0, prev.numel() - 1)
    input_ids.copy_(torch.where(input_ids < 0, prev[rows], input_ids))


class ModelRunner:
    def __init__(self, config: EngineConfig, hf_config: dict | None = None, rank: int = 0, store=None):
        """rank > 0: a tensor-parallel worker (built by engine.workers with the group's `store`)."""
        self.config = config
        hf_config = hf_config if hf_config is not None else load_hf_config(config.model_path)
        self.rank, self.tp_size = rank, config.tensor_parallel_size
        self.workers = None
        if self.tp_size > 1:
            config.check_tensor_parallel(hf_config)
        self.device = resolve_device(config.device, rank, self.tp_size)
        self.dtype = resolve_dtype(config.dtype, hf_config, self.device)
        self.is_cuda = self.device.type == "cuda"
        # time_device (set by a replay): each CUDA step is timed on the device, last_device_time_s its seconds
        self.time_device = False
        self.last_device_time_s: float | None = None
        self.last_copy_host_s: float | None = None     # host seconds of the collected step's block copies
        # overlap scheduling: when the latest launch() had to wait for the device first (block copies), the
        # time.perf_counter() at which it had drained; else None
        self.drained_at_s: float | None = None
        if self.is_cuda:
            torch.cuda.set_device(self.device)
        if self.tp_size > 1:
            if rank == 0:
                from engine import workers
                self.workers = workers.Workers.start(config, hf_config, self.device, type(self))
                self._shutdown = workers.register_shutdown(self, self.workers)
            else:
                from engine.collectives import join_group
                join_group(store, rank, self.tp_size, self.device, config.distributed_timeout_s)
        try:
            self._build(config, hf_config)
            if self.workers is not None:
                self.workers.wait_ready(config.distributed_timeout_s)
        except BaseException:
            self.close()
            raise

    def _build(self, config: EngineConfig, hf_config: dict) -> None:
        self.attn_backend = get_attention_backend(config.attention_backend, self.device)
        compile_layers = config.compile_layers
        if compile_layers is None:
            compile_layers = self.is_cuda and not config.enforce_eager
        if compile_layers:
            fused.enable_compile()
        self.model = build_model(config.model_path, self.device, self.dtype, self.attn_backend, hf_config,
                                 tp_rank=self.rank, tp_size=self.tp_size,
                                 fused_qk_norm_rope_store=config.fused_qk_norm_rope_store)
        mc = self.model.config
        kv_heads = self.model.num_kv_heads_per_rank
        self.max_model_len = config.resolve_max_model_len(mc.max_position_embeddings)
        config.resolve_max_num_batched_tokens()
        self.block_size = config.block_size
        self.max_blocks_per_seq = -(-self.max_model_len // self.block_size)
        self.block_bytes = kv_block_bytes(self.block_size, mc.num_hidden_layers, kv_heads, mc.head_dim,
                                          torch.empty((), dtype=self.dtype).element_size())
        self.sampler = Sampler(torch.Generator(self.device).manual_seed(config.seed))
        self.generators: dict[object, torch.Generator] = {}    # request_id -> generator of seeded requests

        shape = (mc.num_hidden_layers, self.block_size, kv_heads, mc.head_dim)
        self.num_cpu_blocks = (config.num_cpu_blocks if config.num_cpu_blocks is not None
                               else int(config.swap_space_gib * GIB) // self.block_bytes)
        # Before the KV cache is sized: the tier's device staging buffers take GPU memory too.
        self.cpu_cache_num_blocks = cpu_cache_blocks(config.cpu_cache_num_blocks, config.cpu_cache_gib,
                                                     self.block_bytes)
        self.cpu_tier = CpuTierSpace(self.cpu_cache_num_blocks, shape, self.dtype, self.device,
                                     other_host_bytes=self.num_cpu_blocks * self.block_bytes,
                                     cpu_cache_gib=config.cpu_cache_gib)
        self.num_kvcache_blocks = config.num_kvcache_blocks or self._derive_num_blocks()
        if self.tp_size > 1:        # every rank must hold the same block ids: the smallest cache wins
            from engine.collectives import all_reduce_min
            self.num_kvcache_blocks = all_reduce_min(self.num_kvcache_blocks, self.device)
        self.kv_cache = torch.zeros(2, shape[0], self.num_kvcache_blocks, *shape[1:], dtype=self.dtype,
                                    device=self.device)
        self.kv_caches = [(self.kv_cache[0, l], self.kv_cache[1, l]) for l in range(mc.num_hidden_layers)]
        self.swap_space = SwapSpace(self.num_cpu_blocks, shape, self.dtype, self.device)
        self.graphs: dict[int, torch.cuda.CUDAGraph] = {}
        self.prefill_graphs: PrefillGraphs | None = None
        self.graph_pool = None
        if self.is_cuda and not config.enforce_eager:
            # Tensor-parallel runs keep prefill steps eager: every rank would have to capture the same
            # graphs around its all-reduces, which is untested.
            if config.prefill_graph_max_tokens >= 16 and self.tp_size == 1 and self.attn_backend.graph_safe:
                self.prefill_graphs = self.make_prefill_graphs()
            self._capture_cuda_graphs()
        if self.is_cuda:    # compile the eager prefill and sampling kernels now, not inside the first timed step
            self._dummy_prefill(2, 16)
            warm_lm_head(self.model.lm_head.weight, config.max_num_seqs)
        # Overlap scheduling (launch/collect): the latest step's sampled tokens [num_sampled] on the device,
        # two pinned host buffers for the tokens of the two steps that may be in flight, and an event after
        # the decode graphs' input copies (their pinned mirrors are refilled only once it has passed).
        self.last_sampled: torch.Tensor | None = None
        if self.is_cuda:        # one Triton kernel on CUDA, bound once (this runs in every overlapped step)
            from engine.kernels.resolve_placeholders import resolve_placeholders
            self._resolve_impl = resolve_placeholders
        else:
            self._resolve_impl = resolve_placeholders_torch
        self._num_launched = 0
        overlap_cuda = config.overlap_scheduling and self.is_cuda
        self._token_host = [torch.zeros(config.max_num_seqs, dtype=torch.int64, pin_memory=True)
                            for _ in range(2)] if overlap_cuda else None
        self.inputs_copied = torch.cuda.Event() if overlap_cuda and self.graphs else None
        if overlap_cuda and self.prefill_graphs is not None:
            self.prefill_graphs.inputs_copied = torch.cuda.Event()
        self.inputs = StepInputBuilder(self.block_size, self.max_blocks_per_seq,
                                       self.graph_sizes[-1] if self.graphs else 0,
                                       self.graph_host["block_tables"] if self.graphs else None)

    # -- sizing ---------------------------------------------------------------------
    @torch.inference_mode()
    def _derive_num_blocks(self) -> int:
        cfg = self.config
        if not self.is_cuda:
            budget = int(cfg.cpu_kvcache_gib * GIB) // self.block_bytes
            return max(1, min(budget, cfg.max_num_seqs * self.max_blocks_per_seq))
        # Profile the largest prefill step to learn the activation peak (nano-vllm's warmup), then give
        # the KV cache what remains of gpu_memory_utilization * total.
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats(self.device)
        seq_len = min(self.max_model_len, cfg.max_num_batched_tokens)
        num_seqs = max(1, min(cfg.max_num_batched_tokens // seq_len, cfg.max_num_seqs))
        self._dummy_prefill(num_seqs, seq_len)
        torch.cuda.synchronize(self.device)
        stats = torch.cuda.memory_stats(self.device)
        peak, current = stats["allocated_bytes.all.peak"], stats["allocated_bytes.all.current"]
        torch.cuda.empty_cache()
        free, total = torch.cuda.mem_get_info(self.device)
        available = int(total * cfg.gpu_memory_utilization) - (total - free) - (peak - current)
        blocks = available // self.block_bytes
        if blocks < 1:
            raise RuntimeError(f"no GPU memory left for the KV cache: weights + activations need "
                               f"{(total - free + peak - current) / GIB:.1f} GiB of {total / GIB:.1f} GiB at "
                               f"gpu_memory_utilization={cfg.gpu_memory_utilization}; raise gpu_memory_utilization, "
                               f"lower max_num_batched_tokens, or set num_kvcache_blocks")
        return blocks

    def _dummy_prefill(self, num_seqs: int, seq_len: int) -> None:
        """A forward + sampling of num_seqs prompts of seq_len tokens that writes nothing into any cache."""
        mc = self.model.config
        T = num_seqs * seq_len
        cache = torch.zeros(1, self.block_size, self.model.num_kv_heads_per_rank, mc.head_dim, dtype=self.dtype,
                            device=self.device)
        cu = torch.arange(0, T + 1, seq_len, dtype=torch.int32, device=self.device)
        empty = torch.zeros(0, dtype=torch.int32, device=self.device)
        meta = AttentionMetadata(
            num_prefill_seqs=num_seqs, num_prefill_tokens=T,
            slot_mapping=torch.full((T,), -1, dtype=torch.int64, device=self.device),
            cu_seqlens_q=cu, cu_seqlens_k=cu, max_seqlen_q=seq_len, max_seqlen_k=seq_len,
            prefill_block_tables=torch.zeros(num_seqs, self.max_blocks_per_seq, dtype=torch.int32, device=self.device),
            decode_context_lens=empty, decode_block_tables=empty.reshape(0, 0))
        ids = torch.zeros(T, dtype=torch.int64, device=self.device)
        pos = torch.arange(seq_len, device=self.device).repeat(num_seqs)
        hidden = self.model(ids, pos, meta, [(cache, cache)] * mc.num_hidden_layers)
        rows = min(max(num_seqs, self.config.max_num_seqs), T)
        logits = self.model.compute_logits(hidden[:rows])
        if logits is not None:          # None on tensor-parallel ranks > 0: only rank 0 samples
            temps = torch.ones(rows, device=self.device)
            self.sampler(logits, SamplingTensors(temps, None, None, [None] * rows, all_greedy=False))

    # -- one step ---------------------------------------------------------------------
    def execute(self, batch: Batch) -> list[int | None]:
        """Runs one scheduled batch; returns one sampled token per entry (None for intermediate prefill chunks)."""
        return self.collect(self.launch(batch))

    @torch.inference_mode()
    def launch(self, batch: Batch) -> "LaunchedStep":
        """Queues one scheduled batch on the device; collect() returns its tokens.

        With config.overlap_scheduling, input ids that are placeholders (engine/core/in_flight.py) are
        taken on the device from the sampled tokens of the step launched before, the tokens are copied
        to pinned host memory behind an event, and the host buffers a step fills are reused only once
        the device has read them, so the host may schedule and launch the next step before collecting
        this one."""
        S = len(batch.seqs)
        overlap = self.config.overlap_scheduling
        self.drained_at_s = None
        if overlap and self.is_cuda and (batch.swap_out or batch.swap_in or batch.offload or batch.load):
            # the CPU tier's device staging is reused across steps: let every earlier step finish first (the
            # swaps, queued in stream order, keep the same wait: one rule for every step with copies, as the
            # simulator's overlap timeline prices it)
            torch.cuda.current_stream(self.device).synchronize()
            self.drained_at_s = time.perf_counter()     # the step before ended by now (its row ends here)
        if self.inputs_copied is not None:
            # the decode graphs' pinned mirrors (block tables patched in place by _prepare) may still be
            # read by the previous step's queued copies
            self.inputs_copied.synchronize()
        step = self._prepare(batch, self._graph_size(S) if batch.num_prefill_seqs == 0 else None) if S else None
        if self.workers is not None:
            self.workers.send(("step", batch.swap_out, batch.swap_in, step, batch.offload, batch.load))
        timing = None
        if self.time_device and self.is_cuda:
            timing = (torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True))
            timing[0].record()
        try:
            copy_host_s = None
            if batch.swap_out or batch.swap_in or batch.offload or batch.load:
                copy_start = time.perf_counter()
                self._copy_blocks(batch.swap_out, batch.swap_in, batch.offload, batch.load)
                copy_host_s = time.perf_counter() - copy_start
            if step is None:
                self.cpu_tier.finish()
                out = LaunchedStep(None, None, 0)
                out.copy_host_s = copy_host_s
                if timing is not None:          # a step of copies only: their device seconds too
                    timing[1].record()
                    out.timing = timing
                return out
            logits = self._logits(step)                                       # [num_sampled, V]
        except Exception as exc:
            failure = self.workers.failure() if self.workers is not None else None
            if failure:
                raise RuntimeError(f"a tensor-parallel worker failed: {failure}") from exc
            raise
        sample_rows = step.sample_rows
        tokens = self.sampler(logits, self._sampling_tensors([batch.seqs[i] for i in sample_rows]))
        out = LaunchedStep(tokens, sample_rows, S, offload=bool(batch.offload))
        out.copy_host_s = copy_host_s
        if timing is not None:
            timing[1].record()
            out.timing = timing
        if overlap:
            self.last_sampled = tokens
            if self.is_cuda:
                host = self._token_host[self._num_launched % 2][:len(tokens)]
                host.copy_(tokens, non_blocking=True)
                out.host, out.ready = host, torch.cuda.Event()
                out.ready.record()
            self._num_launched += 1
            if batch.offload:
                self.cpu_tier.finish()      # not left for collect(): the next step may offload too
                out.offload = False
        return out

    def collect(self, launched: "LaunchedStep") -> list[int | None]:
        """The tokens of a launched step, aligned with its batch.seqs (waits for the device)."""
        self.last_device_time_s = None
        self.last_copy_host_s = launched.copy_host_s
        if launched.timing is not None:         # every launched step, a step of copies only too
            launched.timing[1].synchronize()
            self.last_device_time_s = launched.timing[0].elapsed_time(launched.timing[1]) / 1e3   # ms -> s
        if launched.tokens is None:
            return []
        if launched.ready is not None:
            launched.ready.synchronize()
            tokens = launched.host.tolist()
        else:
            tokens = launched.tokens.tolist()
        if launched.offload:
            self.cpu_tier.finish()      # the offloads' transfer ran beside the forward pass
        out: list[int | None] = [None] * launched.num_seqs
        for i, t in zip(launched.sample_rows.tolist(), tokens):
            out[i] = t
        return out

    def _resolve_placeholders(self, input_ids: torch.Tensor) -> None:
        """input_ids [T] int64 on the device: each placeholder PLACEHOLDER_BASE + k becomes row k of the
        previous step's sampled tokens (real ids are >= 0; engine/core/in_flight.py). One Triton kernel on
        CUDA (engine/kernels/resolve_placeholders.py), PyTorch operations elsewhere."""
        self._resolve_impl(input_ids, self.last_sampled)

    @torch.inference_mode()
    def serve(self, swap_out, swap_in, step: StepInputs | None, offload=(), load=()) -> None:
        """A tensor-parallel worker's share of one step (rank 0 sent the inputs; it also samples)."""
        self._copy_blocks(swap_out, swap_in, offload, load)
        if step is not None:
            self._logits(step)
        if offload:
            self.cpu_tier.finish()

    def _copy_blocks(self, swap_out, swap_in, offload, load) -> None:
        """The step's block copies before its forward pass: every GPU read (tier offloads, swap-outs) before
        any GPU write (swap-ins, tier loads)."""
        if offload:
            self.cpu_tier.offload(self.kv_cache, offload)
        if swap_out or swap_in:
            self.swap_space.swap(self.kv_cache, swap_out, swap_in)
        if load:
            self.cpu_tier.load(self.kv_cache, load)

    def _logits(self, step: StepInputs):
        """Forward pass and LM head of the sampling rows: [num_sampled, V] on rank 0, None on other ranks."""
        S = len(step.context_lens)
        # overlap scheduling: some input ids stand for tokens the previous step samples on the device
        resolve = self._resolve_placeholders if (self.config.overlap_scheduling and len(step.input_ids)
                                                 and step.input_ids.min() < 0) else None
        if step.graph_bs is None:
            padded = self.prefill_graphs.size_for(len(step.input_ids)) if self.prefill_graphs else None
            if padded:
                hidden = (self.prefill_graphs.forward(step, padded) if resolve is None
                          else self.prefill_graphs.forward(step, padded, resolve))
            else:
                input_ids, positions, meta = self._to_device(step)
                if resolve is not None:
                    resolve(input_ids)
                hidden = self.model(input_ids, positions, meta, self.kv_caches)
        else:
            self._fill_graph_inputs(step)
            if resolve is not None:
                resolve(self.graph_vars["input_ids"][:S])
            self.graphs[step.graph_bs].replay()
            hidden = self.graph_vars["outputs"][:S]
        if step.num_prefill_seqs == 0 and len(step.sample_rows) == S:
            return self.model.compute_logits(hidden[:S])                      # decode: every row samples
        last = torch.from_numpy(step.cu_seqlens_q[1:][step.sample_rows] - 1).to(self.device, non_blocking=True)
        return self.model.compute_logits(hidden[last])

    def release(self, request_id) -> None:
        """Forgets a finished request's sampling generator."""
        self.generators.pop(request_id, None)

    def close(self) -> None:
        """Stops the tensor-parallel workers and leaves the process group (nothing to do with tp = 1). Idempotent."""
        shutdown = getattr(self, "_shutdown", None)
        if shutdown is not None:
            shutdown()
        elif self.workers is not None:
            self.workers.close()

    def _graph_size(self, num_seqs: int) -> int | None:
        if not self.graphs:
            return None
        return next((b for b in self.graph_sizes if b >= num_seqs), None)

    def _prepare(self, batch: Batch, graph_bs: int | None) -> StepInputs:
        return self.inputs.build(batch, graph_bs)

    def _fill_graph_inputs(self, step: StepInputs) -> None:
        """Fills pinned host mirrors of the graph's input buffers (padding rows: token 0 at position 0,
        slot -1 = not stored, context 0), then one async copy per buffer.

        Reusing the mirrors is safe: rank 0 read the previous step's tokens, which needed the previous
        step's LM-head gather, which every worker's stream issues after its copies from the mirrors. With
        overlap scheduling it has not, so launch() first waits for the event recorded here (inputs_copied)."""
        S, graph_bs = len(step.context_lens), step.graph_bs
        h, g = self.graph_host, self.graph_vars
        h["input_ids"][:S], h["input_ids"][S:graph_bs] = step.input_ids, 0
        h["positions"][:S], h["positions"][S:graph_bs] = step.positions, 0
        h["slot_mapping"][:S], h["slot_mapping"][S:graph_bs] = step.slots, -1
        h["context_lens"][:S], h["context_lens"][S:graph_bs] = step.context_lens, 0
        if not np.may_share_memory(step.block_tables, h["block_tables"]):   # rank 0 built them in place
            h["block_tables"][:graph_bs] = step.block_tables
        for name in h:
            g[name][:graph_bs].copy_(self.graph_host_t[name][:graph_bs], non_blocking=True)
        if self.inputs_copied is not None:
            self.inputs_copied.record()

    def _to_device(self, step: StepInputs):
        """Flat input ids / positions [T] and AttentionMetadata on the device, for an eager forward."""
        dev, P = self.device, step.num_prefill_seqs
        n = np.diff(step.cu_seqlens_q)
        ctx, cu_q, tables = step.context_lens, step.cu_seqlens_q, step.block_tables

        def to_dev(a: np.ndarray) -> torch.Tensor:
            return torch.from_numpy(a).to(dev, non_blocking=True)

        cu_k = np.zeros(P + 1, dtype=np.int32)
        np.cumsum(ctx[:P], out=cu_k[1:])
        meta = AttentionMetadata(
            num_prefill_seqs=P, num_prefill_tokens=int(cu_q[P]), slot_mapping=to_dev(step.slots),
            cu_seqlens_q=to_dev(cu_q[:P + 1].astype(np.int32)) if P else to_dev(np.zeros(0, np.int32)),
            cu_seqlens_k=to_dev(cu_k) if P else to_dev(np.zeros(0, np.int32)),
            max_seqlen_q=int(n[:P].max()) if P else 0, max_seqlen_k=int(ctx[:P].max()) if P else 0,
            prefill_block_tables=to_dev(tables[:P]),
            decode_context_lens=to_dev(ctx[P:].astype(np.int32)), decode_block_tables=to_dev(tables[P:]))
        return to_dev(step.input_ids), to_dev(step.positions), meta

    def _sampling_tensors(self, seqs) -> SamplingTensors:
        params = [s.sampling_params for s in seqs]
        temps = [p.sample_temperature for p in params]
        all_greedy = not any(temps)
        top_ks = top_ps = None
        gens: list[torch.Generator | None] = [None] * len(seqs)
        if not all_greedy:
            if any(p.top_k for p in params):
                top_ks = torch.tensor([p.top_k for p in params], dtype=torch.int64).to(self.device, non_blocking=True)
            if any(p.top_p < 1.0 for p in params):
                top_ps = torch.tensor([p.top_p for p in params], dtype=torch.float32).to(self.device, non_blocking=True)
            for i, (seq, p) in enumerate(zip(seqs, params)):
                if p.seed is not None and p.sample_temperature > 0:
                    gen = self.generators.get(seq.request_id)
                    if gen is None:
                        gen = self.generators[seq.request_id] = torch.Generator(self.device).manual_seed(p.seed)
                    gens[i] = gen
        temps_t = torch.tensor(temps, dtype=torch.float32).to(self.device, non_blocking=True)
        return SamplingTensors(temps_t, top_ks, top_ps, gens, all_greedy)

    # -- CUDA graphs ------------------------------------------------------------------------
    def make_prefill_graphs(self, capture: bool = True) -> PrefillGraphs | None:
        """Padded prefill-step buffers (engine/prefill_graphs.py), their graphs captured if `capture`;
        None, with a warning, when the capture fails. The graphs' memory pool becomes self.graph_pool."""
        cfg = self.config
        graphs = PrefillGraphs(self.model, self.kv_caches, self.device, self.dtype,
                               min(cfg.prefill_graph_max_tokens, cfg.max_num_batched_tokens), cfg.max_num_seqs,
                               self.max_blocks_per_seq, self.max_model_len)
        try:
            if capture:
                self.graph_pool = graphs.capture(self.graph_pool)
        except Exception as exc:
            warnings.warn(f"prefill CUDA graph capture failed with attention backend {self.attn_backend.name!r} "
                          f"({type(exc).__name__}: {exc}); running prefill steps eagerly. Set "
                          f"prefill_graph_max_tokens=0 to skip the capture.", RuntimeWarning, stacklevel=2)
            return None
        return graphs

    # -- CUDA graphs for decode-only steps --------------------------------------------------
    @torch.inference_mode()
    def _capture_cuda_graphs(self) -> None:
        mc, dev = self.model.config, self.device
        self.graph_sizes = decode_graph_sizes(self.config.max_num_seqs)
        max_bs = self.graph_sizes[-1]
        g = self.graph_vars = dict(
            input_ids=torch.zeros(max_bs, dtype=torch.int64, device=dev),
            positions=torch.zeros(max_bs, dtype=torch.int64, device=dev),
            slot_mapping=torch.full((max_bs,), -1, dtype=torch.int64, device=dev),
            context_lens=torch.zeros(max_bs, dtype=torch.int32, device=dev),
            block_tables=torch.zeros(max_bs, self.max_blocks_per_seq, dtype=torch.int32, device=dev),
            outputs=torch.zeros(max_bs, mc.hidden_size, dtype=self.dtype, device=dev),
        )
        # Pinned host mirrors of the inputs (numpy views for filling): copies from them are truly
        # asynchronous. Reuse is safe: the previous step's copies finished before its tokens were read.
        self.graph_host_t = {k: torch.zeros(v.shape, dtype=v.dtype, pin_memory=True)
                             for k, v in g.items() if k != "outputs"}
        self.graph_host = {k: v.numpy() for k, v in self.graph_host_t.items()}
        empty = torch.zeros(0, dtype=torch.int32, device=dev)
        try:
            for bs in reversed(self.graph_sizes):
                meta = AttentionMetadata(
                    num_prefill_seqs=0, num_prefill_tokens=0, slot_mapping=g["slot_mapping"][:bs],
                    cu_seqlens_q=empty, cu_seqlens_k=empty, max_seqlen_q=0, max_seqlen_k=0,
                    prefill_block_tables=empty.reshape(0, self.max_blocks_per_seq),
                    decode_context_lens=g["context_lens"][:bs], decode_block_tables=g["block_tables"][:bs])
                args = (g["input_ids"][:bs], g["positions"][:bs], meta, self.kv_caches)
                g["outputs"][:bs] = self.model(*args)        # warm-up (lazy init, autotuning) outside the graph
                graph = torch.cuda.CUDAGraph()
                with torch.cuda.graph(graph, self.graph_pool):
                    g["outputs"][:bs] = self.model(*args)
                self.graph_pool = graph.pool() if self.graph_pool is None else self.graph_pool
                self.graphs[bs] = graph
                torch.cuda.synchronize(dev)
            replay_once(self.graphs.values(), dev)
        except Exception as exc:       # a backend that syncs with the host cannot be captured
            self.graphs.clear()
            warnings.warn(f"CUDA graph capture failed with attention backend {self.attn_backend.name!r} "
                          f"({type(exc).__name__}: {exc}); running decode steps eagerly. Pass enforce_eager=True "
                          f"to skip the capture.", RuntimeWarning, stacklevel=2)
