"""Roofline cost model: FLOPs and bytes of each op group over the GPU's ceilings.

Per step, each op group costs max(FLOPs / flop_rate, bytes / byte_rate); groups
run one after another (docs/cost_model.md has the formulas):

  linear    all decoder matmuls. FLOPs 2 * linear_params * tokens; bytes: the
            weights, read once per step.
  prefill   attention of prefill entries. Entry with n new tokens and context c
  attention (cached + new) has causal query-key pairs n*c - n*(n-1)/2; FLOPs
            4 * layers * q_heads * head_dim per pair (QK^T and PV); bytes: its c
            keys/values read once plus its n new ones written.
  decode    attention of decode entries: FLOPs as above with one query per key;
  attention bytes: the sum of contexts times kv_bytes_per_token, plus the new KV.
  lm head   only tokens that sample (finished prefills + decodes): FLOPs
            2 * vocab * hidden each; bytes: the head's weights once.
  all-reduce (tensor parallel only) 2 per layer of hidden * tokens * dtype bytes,
            ring cost 2 * (tp - 1) / tp * size / interconnect, plus a latency each.
  swap      num_swap_blocks * block_size * kv_bytes_per_token over the host link.
  CPU tier  (with_tier_copies_s) a load crosses the host link and is scattered into the cache (a block
            read and written in HBM) before the forward pass; an offload is gathered in HBM (read +
            write) before it, then crosses the host link on the engine's side stream: its last
            tier_overlap_blocks blocks alongside the loads and the forward pass, the ones before them
            ahead of it (the engine's two staging buffers, engine/cpu_tier_space.py). The step lasts
            gather + transfer of the earlier blocks + max(loads + forward, transfer of the last ones).
  overhead  overhead_s per step + per_seq_overhead_s per scheduled sequence.

latency_floors=True adds what a graph-replayed step pays however small it is, from the
card's measured floors (HardwareSpec.measured_*_floor_us, benchmarks/gpu_floor.py): each
matmul-like kernel takes at least the GEMM floor (linear: 4 per layer, the packed qkv, o,
gate_up and down projections; decode attention 2 per layer, split pass and merge; prefill
attention 1; LM head 1), so a group costs at least its kernels' floors; and every forward
step pays ELEMENTWISE_KERNELS_PER_LAYER (4) elementwise kernels per layer (two add + norms, the
fused q/k norm + RoPE + KV store, activation) and
one launch + sync + token readback.

Rates are the hardware's measured ceilings when recorded (use_measured), else
datasheet peaks, times the efficiency factors (1.0 gives the lower bound).
With tensor parallelism every GPU does 1/tp of the FLOPs and bytes (KV heads
replicated when tp exceeds them). Activation traffic, norms, RoPE, sampling and
kernel launch gaps are not modelled beyond the overhead terms and the optional floors.
"""
from __future__ import annotations

from operator import mul, sub
from typing import Sequence

import numpy as np

from sim.cost_model.base import CostModel
from sim.specs.capacity import block_bytes_per_gpu, kv_heads_per_gpu
from sim.specs.hardware import HardwareSpec, get_hardware_spec
from sim.specs.models import ModelSpec, get_model_spec

# small dependent kernels per decoder layer besides the GEMMs and attention, as the engine runs a step: the two
# add + RMSNorms, SiLU-and-mul, and q/k RMSNorm + RoPE + KV-cache store fused into one
# (engine/kernels/qk_norm_rope_store.py; three kernels with EngineConfig.fused_qk_norm_rope_store off)
ELEMENTWISE_KERNELS_PER_LAYER = 4

class RooflineCostModel(CostModel):
    name = "roofline"

    def __init__(self, model: ModelSpec | str, hardware: HardwareSpec | str, tensor_parallel_size: int = 1,
                 matmul_efficiency: float = 1.0, attention_efficiency: float = 1.0,
                 memory_efficiency: float = 1.0, overhead_s: float = 0.0, per_seq_overhead_s: float = 0.0,
                 allreduce_latency_s: float = 0.0, use_measured: bool = True, max_model_len: int | None = None,
                 latency_floors: bool = False, tier_overlap_blocks: int = 512):
        self.model = get_model_spec(model) if isinstance(model, str) else model
        self.hardware = get_hardware_spec(hardware) if isinstance(hardware, str) else hardware
        for f, v in (("matmul_efficiency", matmul_efficiency), ("attention_efficiency", attention_efficiency),
                     ("memory_efficiency", memory_efficiency)):
            if not 0.0 < v <= 1.0:
                raise ValueError(f"RooflineCostModel.{f} must be in (0, 1], got {v!r}")
        for f, v in (("overhead_s", overhead_s), ("per_seq_overhead_s", per_seq_overhead_s),
                     ("allreduce_latency_s", allreduce_latency_s)):
            if v < 0:
                raise ValueError(f"RooflineCostModel.{f} must be >= 0, got {v!r}")
        m, hw, tp = self.model, self.hardware, tensor_parallel_size
        kv_heads_per_gpu(m, tp)                         # validates tp
        self.tensor_parallel_size = tp
        self.max_model_len = max_model_len or m.max_model_len
        self.overhead_s = float(overhead_s)
        self.per_seq_overhead_s = float(per_seq_overhead_s)
        self.use_measured = use_measured
        self.matmul_efficiency, self.attention_efficiency, self.memory_efficiency = (
            matmul_efficiency, attention_efficiency, memory_efficiency)

        matmul_flops = hw.flops_per_s(use_measured) * matmul_efficiency       # FLOP/s
        attn_flops = hw.flops_per_s(use_measured) * attention_efficiency       # FLOP/s
        mem = hw.bytes_per_s(use_measured) * memory_efficiency                 # B/s
        q_heads = m.num_q_heads // tp
        self.kv_bytes_per_token_gpu = block_bytes_per_gpu(m, 1, tp)

        # Seconds per unit of work; every per-step formula below is a product with one of these.
        self.s_linear_per_token = 2 * m.num_linear_params / tp / matmul_flops
        self.s_linear_weights = m.num_linear_params * m.dtype_bytes / tp / mem
        self.s_lm_per_token = 2 * m.lm_head_params / tp / matmul_flops
        self.s_lm_weights = m.lm_head_params * m.dtype_bytes / tp / mem
        self.s_attn_per_pair = 4 * m.num_layers * q_heads * m.head_dim / attn_flops
        self.s_kv_per_token = self.kv_bytes_per_token_gpu / mem
        self.s_swap_per_token = self.kv_bytes_per_token_gpu / (hw.host_link_gbps * 1e9)
        if tp > 1:
            ring = 2 * (tp - 1) / tp
            self.s_allreduce_per_token = 2 * m.num_layers * m.hidden_size * m.dtype_bytes * ring / (
                hw.interconnect_gbps * 1e9)
            self.s_allreduce_fixed = 2 * m.num_layers * allreduce_latency_s
        else:
            self.s_allreduce_per_token = 0.0
            self.s_allreduce_fixed = 0.0
        self._decode_fixed: dict[int, float] = {}     # num_seqs -> _fixed_part of a pure decode step
        self.latency_floors = latency_floors
        if tier_overlap_blocks < 0:
            raise ValueError(f"RooflineCostModel.tier_overlap_blocks must be >= 0, got {tier_overlap_blocks!r}")
        self.tier_overlap_blocks = int(tier_overlap_blocks)   # engine.cpu_tier_space: 2 x STAGING_BLOCKS
        g = k = sync = 0.0
        if latency_floors:
            if hw.latency_floors_s is None:
                raise ValueError(f"latency_floors=True needs the measured floors of {hw.name!r} (HardwareSpec "
                                 f"measured_gemm_floor_us, measured_kernel_floor_us, measured_step_sync_us; "
                                 f"benchmarks/gpu_floor.py measures them); use latency_floors=False")
            g, k, sync = hw.latency_floors_s
        L = m.num_layers
        self.floor_linear, self.floor_lm = 4 * L * g, g                       # seconds
        self.floor_decode_attn, self.floor_prefill_attn = 2 * L * g, L * g
        self.floor_step = ELEMENTWISE_KERNELS_PER_LAYER * L * k + sync

    def __repr__(self) -> str:
        return (f"RooflineCostModel({self.model.name}, {self.hardware.name}, tp={self.tensor_parallel_size}, "
                f"eff=({self.matmul_efficiency}, {self.attention_efficiency}, {self.memory_efficiency}), "
                f"overhead_s={self.overhead_s}{', latency_floors' if self.latency_floors else ''})")

    # -- op groups ----------------------------------------------------------------------
    def _fixed_part(self, num_tokens: int, num_seqs: int, num_samples: int) -> float:
        """Everything but attention and swaps: overheads, linear layers, LM head, all-reduce."""
        t = self.overhead_s + self.floor_step + self.per_seq_overhead_s * num_seqs
        t += max(num_tokens * self.s_linear_per_token, self.s_linear_weights, self.floor_linear)
        if num_samples:
            t += max(num_samples * self.s_lm_per_token, self.s_lm_weights, self.floor_lm)
        if self.s_allreduce_per_token:
            t += num_tokens * self.s_allreduce_per_token + self.s_allreduce_fixed
        return t

    def step_time_from_shape(self, prefill_new_tokens: Sequence[int], prefill_context_lens: Sequence[int],
                             num_decode_seqs: int, decode_context_sum: int, num_swap_blocks: int = 0,
                             num_prefill_samples: int | None = None, block_size: int = 16) -> float:
        self.check_shape(prefill_new_tokens, prefill_context_lens, num_decode_seqs, decode_context_sum,
                         num_swap_blocks, num_prefill_samples)
        n_pre = len(prefill_new_tokens)
        t_swap = num_swap_blocks * block_size * self.s_swap_per_token
        if n_pre == 0 and num_decode_seqs == 0:
            return self.overhead_s + t_swap if num_swap_blocks else 0.0
        t_prefill = 0.0
        pre_tokens = 0
        if n_pre:
            pre_tokens = sum(prefill_new_tokens)
            ctx_sum = sum(prefill_context_lens)
            # causal pairs: sum_j n_j*c_j - n_j*(n_j-1)/2
            pairs = sum(map(mul, prefill_new_tokens, prefill_context_lens)) \
                - (sum(map(mul, prefill_new_tokens, prefill_new_tokens)) - pre_tokens) / 2
            t_prefill = max(pairs * self.s_attn_per_pair, (ctx_sum + pre_tokens) * self.s_kv_per_token,
                            self.floor_prefill_attn)
        samples = n_pre if num_prefill_samples is None else num_prefill_samples
        t = self._fixed_part(pre_tokens + num_decode_seqs, n_pre + num_decode_seqs, samples + num_decode_seqs)
        if num_decode_seqs:
            t = t + self._decode_attention(decode_context_sum, num_decode_seqs)
        return t + t_prefill + t_swap

    def step_time_s(self, batch) -> float:
        # The simulator's per-step call, without building a StepShape: the same sums and operations
        # as step_time_from_shape on that shape (hence the same float), for the shapes the scheduler
        # makes (no swaps, sizes aligned, contexts within max_model_len). Anything else, including
        # every shape that must raise, goes through the checked path.
        if type(self).step_time_from_shape is not RooflineCostModel.step_time_from_shape:
            return super().step_time_s(batch)
        seqs, new, ctx = batch.seqs, batch.num_new_tokens, batch.context_lens
        p = batch.num_prefill_seqs
        nseq = len(seqs)
        if (batch.swap_in or batch.swap_out or batch.offload or batch.load or len(new) != nseq or len(ctx) != nseq
                or not 0 <= p <= nseq
                or nseq == 0 or self.max_model_len is None or max(ctx) > self.max_model_len):
            return super().step_time_s(batch)
        num_decode = nseq - p
        dsum = 0
        if num_decode:
            dsum = sum(ctx[p:])
            if sum(new[p:]) != num_decode or dsum < num_decode:
                return super().step_time_s(batch)
        t_prefill = 0.0
        pre_tokens = samples = 0
        if p:
            pn, pc = new[:p], ctx[:p]
            if min(pn) < 1 or min(map(sub, pc, pn)) < 0:
                return super().step_time_s(batch)
            for i in range(p):
                if ctx[i] == len(seqs[i].token_ids):
                    samples += 1
            pre_tokens = sum(pn)
            pairs = sum(map(mul, pn, pc)) - (sum(map(mul, pn, pn)) - pre_tokens) / 2
            t_prefill = max(pairs * self.s_attn_per_pair, (sum(pc) + pre_tokens) * self.s_kv_per_token,
                            self.floor_prefill_attn)
        t = self._fixed_part(pre_tokens + num_decode, p + num_decode, samples + num_decode)
        if num_decode:
            t = t + self._decode_attention(dsum, num_decode)
        return t + t_prefill + 0 * batch.block_size * self.s_swap_per_token

    def with_tier_copies_s(self, step_s: float, num_offload_blocks: int, num_load_blocks: int,
                           block_size: int = 16) -> float:
        hbm = block_size * self.s_kv_per_token          # one block read (or written) in HBM, seconds
        link = block_size * self.s_swap_per_token       # one block over the host link, seconds
        gather = 2 * hbm * num_offload_blocks
        overlapped = min(num_offload_blocks, self.tier_overlap_blocks)
        ahead = (num_offload_blocks - overlapped) * link
        return gather + ahead + max(step_s + num_load_blocks * (link + 2 * hbm), overlapped * link)

    def _decode_attention(self, context_sum, num_seqs):
        # one query per key: pairs == context_sum; read all keys, write the new token's KV
        return max(context_sum * self.s_attn_per_pair, (context_sum + num_seqs) * self.s_kv_per_token,
                   self.floor_decode_attn)

    def decode_step_times_s(self, num_seqs: int, start_context_sum: int, k: int) -> np.ndarray:
        k = int(k)
        if k < 0 or num_seqs < 0:
            raise ValueError(f"decode_step_times_s needs k >= 0 and num_seqs >= 0, got k={k}, num_seqs={num_seqs}")
        if k == 0:
            return np.zeros(0)
        if num_seqs == 0:
            return np.zeros(k)
        last = start_context_sum + (k - 1) * num_seqs
        self.check_shape((), (), num_seqs, start_context_sum, 0, None)
        self.check_shape((), (), num_seqs, last, 0, None)
        ctx = start_context_sum + num_seqs * np.arange(k, dtype=np.float64)           # [k]
        attn = np.maximum(np.maximum(ctx * self.s_attn_per_pair, (ctx + num_seqs) * self.s_kv_per_token),
                          self.floor_decode_attn)
        # Same operation order as step_time_from_shape, so the two agree to the last bit.
        return self._fixed_part(num_seqs, num_seqs, num_seqs) + attn

    def decode_step_times_list(self, num_seqs: int, start_context_sum: int, k: int,
                               start_max_context: int | None = None) -> list[float]:
        # Plain Python for the short horizons of the simulator's fast path (numpy's per-call cost
        # dominates below a few hundred steps). The same operations on the same float64 values as
        # decode_step_times_s and step_time_from_shape: int -> float conversions are exact below 2**53.
        if k > 256 or type(self).decode_step_times_s is not RooflineCostModel.decode_step_times_s:
            return super().decode_step_times_list(num_seqs, start_context_sum, k)
        n, s0 = num_seqs, start_context_sum
        if k <= 0 or n <= 0:
            return self.decode_step_times_s(n, s0, k).tolist()      # validation and the trivial cases
        last = s0 + (k - 1) * n
        if s0 < n or (self.max_model_len is not None and last > n * self.max_model_len):
            self.check_shape((), (), n, s0, 0, None)
            self.check_shape((), (), n, last, 0, None)
        fixed = self._decode_fixed.get(n)
        if fixed is None:
            fixed = self._decode_fixed[n] = self._fixed_part(n, n, n)
        a, b, f = self.s_attn_per_pair, self.s_kv_per_token, self.floor_decode_attn
        if a <= b:
            # bytes bound at every context: c * a <= c * b <= (c + n) * b (rounding is monotonic)
            if f == 0.0:
                return [fixed + c * b for c in range(s0 + n, last + n + 1, n)]
            return [fixed + max(c * b, f) for c in range(s0 + n, last + n + 1, n)]
        out = []
        for c in range(s0, last + 1, n):
            x, y = c * a, (c + n) * b
            x = x if x >= y else y
            out.append(fixed + (x if x >= f else f))
        return out
