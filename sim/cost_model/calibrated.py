"""Calibrated cost model: a non-negative linear model of step time, fitted to times the engine measured.

    cm = CalibratedCostModel("benchmarks/results/profile_h200_qwen3_0p6b.json")
    # or get_cost_model("calibrated", profile=...)
    cm.step_time_s(batch)

Step time in seconds is a sum of physically meaningful terms, every
coefficient >= 0 (seconds per unit; fitted by sim/cost_model/calibrated_fit.py):

    step                     fixed cost of a forward pass: weight reads at small batch, kernel launches or a CUDA
                             graph replay, the sampler's host sync; paid by every step with sequences
    eager_step               extra fixed cost of a step with prefill entries (the padded prefill graph's input
                             copies and first-token bookkeeping; one host launch per kernel where such a step
                             runs eagerly: beyond prefill_graph_max_tokens, or with graphs off)
    num_seqs                 per scheduled sequence (input preparation, per-sequence kernel work, decode's FLOPs)
    prefill_tokens           per prefill token (linear-layer FLOPs and activations)
    prefill_attention_pairs  per causal query-key pair of prefill entries: sum_j n_j*c_j - n_j*(n_j-1)/2
                             (n_j new tokens, c_j context after the step): attention FLOPs
    prefill_context_tokens   per key a prefill entry reads, sum_j c_j (cached prefix + new tokens): the KV
                             bytes of prefill attention, which a prefix-cache hit or a late chunk of a long
                             prompt reads without computing them
    decode_context_sum       per key read by decode attention (sum of decode context lengths: KV bytes)
    lm_head_rows             per sampled row (finished prefills + decodes): LM head and sampler
    tokens_over_knee         per token of a step with prefill entries beyond `knee_tokens` (prefill tokens +
                             decodes): a piecewise-linear token cost. Where such a step runs eagerly, its device
                             work overlaps its host launches and shows only past the knee; replayed from a graph
                             it bends little (the H200 fit: +1% per token past 4,096). Absent when knee is None
    swap_step                fixed cost of a step's block copies (index tensors, staging, host sync)
    swap_out_blocks          per KV block copied device -> host (device gather, a copy per run of CPU blocks into
                             the pinned block-major swap space: engine/swap_space.py)
    swap_in_blocks           per KV block copied host -> device (a copy per run of CPU blocks, device scatter)
    tier_step                fixed cost of a step with CPU-tier copies of the prefix cache (index tensors, the wait
                             for the offload stream)
    tier_out_blocks          per block offloaded to the CPU tier: the HBM gather, and the part of the device->host
                             copy the forward pass does not hide (engine/cpu_tier_space.py)
    tier_in_blocks           per block loaded from the CPU tier (host->device copy, scatter into the cache)
    loop_step, loop_seqs     the serving loop's own host time per step and per sequence between steps:
                             postprocess, finished requests, arrivals. A profile (execute() alone) cannot see it;
                             a real run's steps table can. The simulator always pays it (it emulates that loop).
                             Fitted on that host gap alone (calibrated_fit.fit_loop_terms); a joint fit, for
                             tables without the measured step, leaves loop_seqs at 0 (calibrated_fit.UNFITTED).
    loop_prefill_tokens      the serving loop's host time per prefill token inside the step: schedule()'s block
                             allocation and prefix-cache hashing, which a profile's execute() never runs.
                             Fitted on the real runs' steps with prefill (the H200 fit: ~0.5 us a token,
                             0.45 ms of a 5 ms 1k-token prefill step)
    loop_prefill_step        the serving loop's extra host time in a step with prefill entries (admission:
                             schedule()'s work per admitted request, the first token's bookkeeping). Without
                             it the per-token term took this fixed cost too: fitted on ~1k-token prompts it
                             priced a 16k-token step of 30 prompts 16% slow
    mixed_decode_tail_keys   per key by which the longest decode context of a step with prefill entries exceeds
                             mixed_walk_ratio (fitted from candidates, 1.0 until a grid separates it) times its
                             longest prefill context. Such a step runs the varlen prefill kernel (eagerly or
                             from a padded graph), where a decode entry's one query row gets one program per KV
                             head that reads its whole context serially: beside a short chunk, a few long decodes
                             set the step's attention time, which the sums of keys do not show. On the H200 the
                             chunked-prefill (sarathi) steps of 512 new tokens beside 1-4 decodes of 3k-7k keys
                             ran 1.2x as long as the fit without it priced them (0.89 of the real step sum).
                             With mixed_walk_makespan (fits made since, with a prefill grid and prefill graphs) a step
                             run from a padded prefill graph pays it on the keys by which its decodes lengthen the
                             prefill kernel's makespan instead (PrefillSpanGrid.riding_walk_keys: each decode one
                             program a KV head after the chunk's, a key at 1 / mixed_walk_ratio of a chunk
                             program's): the same walk where every program is resident, and the decodes' queue for
                             program slots where tens of them ride (an H100's chunks carrying 9-64 decodes: 1.032
                             of their device seconds under the walk rule, 1.012 under the makespan)
    decode_tail_keys         per key by which the longest context of a pure-decode step exceeds the mean one, in
                             batches of at least `single_split_min_seqs` sequences: there the decode kernel reads
                             each context in one program per (sequence, KV head) without splitting it, so the
                             longest context is a serial critical path. On the H200, batches of ~46 sequences of
                             ~1.4k keys with one of 4k-8k took 5.8 ms, priced 3.9 ms without it
    decode_split_keys        the keys the longest context's split program reads in a pure-decode step of fewer
                             than `single_split_min_seqs` sequences (calibrated_fit.split_walk_keys): there the
                             kernel splits each context into partitions of at least 256 keys, so the step's time
                             rises with its longest context up to 256 keys (the H200 profile: +0.15 ms from 64
                             to 256 keys at 1-8 sequences), is flat after, and rises again once the longest
                             context's partitions pass 256 keys (a long tail in a small batch)
    decode_graph_<b>         fixed cost of a pure-decode step whose batch pads to the CUDA graph of b sequences
                             (calibrated_fit.DECODE_GRAPH_BUCKETS: 1, 2, 4, 8, 16, 32; none above): each graph
                             splits contexts its own way (32 partitions for 1-4 sequences, 17 for 8, 9 for 16),
                             so at one context the H200 step took 1.58 / 1.61 / 1.59 / 1.55 / 1.67 ms at 1 / 2 /
                             4 / 5 / 9 sequences, which no line in the batch size gives
    prefill_attention_span   per key the prefill kernel's busiest program slot reads in a step with prefill entries:
                             with `prefill_span_grid`, the greedy list schedule's makespan of its programs (32
                             query tokens of one KV head each, in launch order on the SMs' program slots:
                             sim/cost_model/prefill_span.py), one walk over the longest context when they all fit
                             and the spread work plus a tail when they do not. On the H200 the terms without it
                             priced 128 new tokens on 16,384 cached at 0.87 of the profile's time and 1,024 at
                             1.32; max(spread, longest walk) instead (files fitted before the grid, which keep
                             `prefill_span_pairs`, calibrated_fit.prefill_span_pairs_per_key) priced 2k-token
                             prompts 0.93 of their device seconds and 8k ones 1.03. The walk of resident
                             programs is the longest entry's (max_prefill_context_tokens; priced as the mean
                             entry's, 2-3 entries of 512-token chunks came out at 0.89-0.91 of real)
    prefill_attention_span_alone  the same keys where each program has an SM to itself (PrefillSpanGrid.runs_alone:
                             a 512-token chunk, 128 programs on the H200's 132 SMs); it reads them at ~0.83x the
                             cost of programs sharing an SM (two H200s' fits), which priced such chunks 1.03-1.07 of the
                             profile's device time and 1,024-token ones 0.93-0.97 under one per-key cost. A file
                             without it prices both at prefill_attention_span
    prefill_small_tokens     per padded prefill token up to SMALL_PREFILL_TOKENS = 256 (calibrated_fit), in a step
                             with prefill entries: small GEMMs cost more a token (H200: 16-256-token prompts took
                             1.27-2.25 ms, ~4 us a token, 2.6 us beyond), priced 11-18% slow under one slope
    decode_step              fixed cost of a pure-decode step, beside step: with it a prefill step's base
                             (step + eager_step) can sit below a decode step's (calibrated_fit.canonical_step_base
                             keeps the smaller of eager_step and decode_step at 0)
    loop_hit_step            the serving loop's host time in a step that admits prefix-cache hits (the batch's
                             num_gpu_hit_blocks > 0), and
    loop_hit_blocks          per hit block admitted: schedule() looks up the whole prompt's block keys, takes
                             each hit block out of the eviction order and builds the block table, work that
                             loop_prefill_tokens (per computed token) misses on a prompt that is mostly cached.
                             On the H200 a 512-token chunk admitted on 50-300 cached blocks waited 2.8-3.1 ms
                             before its launch, a later chunk of the same prompts 1.4 ms
                             (benchmarks/results/generalize/h200_1204/). Fitted on a shared-prefix calibration
                             replay (gpu_generalize.sh's calib_prefix stage); host work before the launch
    lm_head_step             fixed cost of a step that samples (lm_head_rows > 0: any decode entry, or a prompt's
                             last chunk): the LM head's weights read once (311 MB for Qwen3-0.6B) and the sampler's
                             kernels. A prompt's intermediate chunk samples nothing and skips both. On the H200
                             512-token chunks that finish their prompt ran ~0.12 ms longer than intermediate ones
                             at the same context; without it the profile's chunks (all sampling) priced every
                             intermediate chunk 1.02-1.04 of its device seconds
    cold_step                the host's extra time before the first step scheduled after the serving loop sat idle
                             at least COLD_IDLE_S = 20 ms (a run row's idle_before_s, experiments.step_tables; the
                             simulator adds cold_start_s to that step): CPU and GPU leave their idle power states.
                             On the H200 the calibration replays' steps after 20 ms or more of idle ran 0.3-0.44 ms
                             longer than the model without it priced them, after a shorter gap 0-0.2 ms
    mixed_decode_rest_keys,  the keys of a chunk's riding decodes other than the longest (which decode_context_sum
    mixed_decode_rest_over   prices), in a step run from a padded prefill graph: per key up to
                             calibrated_fit.RIDING_REST_KNEE_KEYS (8,192) a step, and per key beyond. The first
                             ones read under the chunk's own work: on an H100 ~1e-8 s a key, the rest 3.2e-8,
                             near a pure decode's 3.6e-8; priced at decode_context_sum's (files fitted before
                             them), chunks carrying 9-55 decodes came out 6-8% high. Without a table row that
                             has such keys (past the knee), the fit sets them to decode_context_sum's price

With overlap scheduling (docs/overlap.md) the simulator times a step in three parts (`overlap_parts_s`):
the host's work before its launch, which runs while the device computes the step before; the device's
seconds; the loop terms loop_step and loop_seqs after its tokens (sim/overlap_timeline.py). Where the fit's
tables hold each step's device seconds (`device_time_s`: CUDA events in the profile and the overlapped
replays), experiments.calibrate fits the same terms to those alone (the file's `device` model, at the
overlapped replays' level: the profile offset below, and 95% of the row weights on the replays,
DEVICE_RUN_SHARE, of which each step kind gets at least 5%, DEVICE_KIND_FLOOR; the profile's swap shapes count
their step time as device time, a swap's copies running on the device's stream), and then the host's share on
what it leaves of the synchronous replays' steps
(calibrated_fit.fit_host_terms: step, eager_step, num_seqs, loop_prefill_tokens, the hit terms and the loop terms): the
step-time model is the device model plus those host terms (CalibratedCostModel.fit_device_plus_host), and
host = step - device is exactly them: on the H200 0.22 ms a step, 0.40 ms a prefill step, 0.23 us a prefill
token, the loop's 20 us + 2.5 us a sequence. A joint fit of every term put what the synchronous replays' ~1k-token
prompts showed beyond the profile into the host's share, 4.2 ms before an 8k prompt's launch where the engine
spent 2.9 (`launch_host_s`). Without a device model, host = the loop_* terms, which miss the host work inside the
step, so an overlapped step is priced too slow. Of the host's cost per prefill token, the share the overlapped
replays' launches do not show (calibrated_fit.prefill_host_after_share: 0.58 on the H200, the postprocess
publishing the prompt's blocks in the prefix cache) runs after the step's tokens (prefill_host_after_share).

With `prefill_graph_max_tokens` (the profiled engine's largest prefill CUDA graph) a step with prefill
entries pays `prefill_tokens` and the knee on the token count of the graph it pads to (steps of 16 to
256, of 64 to 2,048, of 256 beyond: engine/core/graph_sizes.py): the
profile's shapes sit on captured counts, a replay's prompts do not (1,163 tokens run 1,216).

A fit of a profile and real runs' steps together also fits a constant per
profile step (metadata `profile_offset_s`: the same shapes differed by +0.04
and -0.13 ms between an H200 profile and the replay after it, in two runs)
and one per key a profile step's prefill entries read
(`profile_offset_per_prefill_key_s`: the paced profile's chunks read keys
slower than back-to-back steps do); neither is priced
(calibrated_fit.profile_offset_columns).

Swap blocks are scaled by block_size / the fitted block size. `step_time_s`
(what the simulator calls) reads each direction from the batch;
`step_time_from_shape`, which gets only the total, prices a block at the mean
of the two directions. The knee is chosen from a candidate list by training
error. Outside the fitted range the model extrapolates linearly (the formula
is the rule); `fitted_range` in the saved file records the range of every
table column it was fitted on.

Evaluating a step is a handful of multiply-adds; `decode_step_times_s` is the
vectorized form for runs of pure-decode steps (the simulator's fast path).

Files: format v3 (these terms, and `envelope`: the largest step the fit saw,
sim/cost_model/envelope.py; a v3 file made before mixed_decode_tail_keys or the tier terms loads with
them at 0). A v2 file (no prefill_context_tokens, no envelope)
loads with that coefficient 0; a v1 file (one `swap_blocks` term, `prefill_step`
for `eager_step`, no loop terms) loads with swap_blocks as both directions.
"""
from __future__ import annotations

import datetime as _dt
import json
import os
from bisect import bisect_left
from operator import mul
from pathlib import Path
from typing import Any, Mapping, Sequence

import numpy as np

from engine.core.graph_sizes import prefill_graph_sizes
from sim.cost_model.base import STEP_TABLE_COLUMNS, CostModelError, FittedCostModel, StepShape
from sim.cost_model.calibrated_fit import (
    COLD_IDLE_S,
    DECODE_GRAPH_BUCKETS,
    FEATURES,
    KNEE_CANDIDATES,
    LOOP_TERMS,
    OBJECTIVES,
    RIDING_REST_KNEE_KEYS,
    SMALL_PREFILL_TOKENS,
    copy_blocks,
    design_matrix,
    fit_coefficients,
    fit_host_terms,
    nnls,
    split_walk_keys,
)
from sim.cost_model.envelope import check_envelope, envelope_of
from sim.cost_model.fit_identity import fit_mismatch
from sim.cost_model.prefill_span import PrefillSpanGrid, riding_decode_contexts
from sim.overlap_timeline import overlapped_row_s, table_restarts

FORMAT = "servelab.calibrated_cost_model/v3"
FORMAT_V2 = "servelab.calibrated_cost_model/v2"
FORMAT_V1 = "servelab.calibrated_cost_model/v1"
# the host's share of a step without a device model (host_time_s)
HOST_TERMS = ("loop_step", "loop_seqs", "loop_prefill_step", "loop_prefill_tokens", "loop_hit_step", "loop_hit_blocks",
              "cold_step")
# The fit's step-price uncertainty, a fraction: h100_1205c's held-out step sums came out at 0.998-1.018 of real per
# calibration table (docs/validation.md). The simulator's band (experiments/sim_band.py) prices every step this much
# longer and shorter; conf/backend/cost_model/calibrated.yaml's price_band holds the same default.
PRICE_BAND = 0.01
V1_RENAMES = {"prefill_step": ("eager_step",), "swap_blocks": ("swap_out_blocks", "swap_in_blocks")}

__all__ = ["FEATURES", "FORMAT", "KNEE_CANDIDATES", "OBJECTIVES", "PRICE_BAND", "CalibratedCostModel", "design_matrix",
           "nnls", "relative_errors"]


def relative_errors(pred: np.ndarray, true: np.ndarray) -> np.ndarray:
    return np.abs(np.asarray(pred) - np.asarray(true)) / np.asarray(true)


class CalibratedCostModel(FittedCostModel):
    name = "calibrated"

    def __init__(self, profile: str | Path | Mapping | None = None, *, coefficients: Mapping[str, float] | None = None,
                 knee_tokens: int | None = None, block_size: int = 16, metadata: Mapping | None = None,
                 fitted_range: Mapping | None = None, max_model_len: int | None = None,
                 envelope: Mapping | None = None, model=None, hardware=None, allow_mismatch: bool = False,
                 single_split_min_seqs: int | None = None, device: "Mapping | CalibratedCostModel | None" = None,
                 prefill_span_pairs: float | None = None, prefill_graph_max_tokens: int | None = None,
                 prefill_span_grid: "PrefillSpanGrid | Mapping | None" = None,
                 prefill_host_after_share: float = 0.0, price_band: float | None = None,
                 mixed_walk_ratio: float = 1.0, mixed_walk_makespan: bool = False):
        """model, hardware: the run's (sim.specs specs or names; the simulator passes them). A file fitted
        for another model or GPU is refused (CostModelError naming both) unless allow_mismatch, which
        keeps what differs in `mismatch` (None when it matches or nothing was checked).
        single_split_min_seqs: the decode batch size from which the fitted engine's decode kernel stops
        splitting keys (calibrated_fit.decode_single_split_min_seqs); None: decode_tail_keys is not priced.
        prefill_span_pairs: the divisor of prefill_attention_span (calibrated_fit.prefill_span_pairs_per_key);
        None: that term is not priced. prefill_span_grid: the prefill kernel's program grid
        (sim/cost_model/prefill_span.py); when given, prefill_attention_span is its makespan instead of the
        rule prefill_span_pairs gives. prefill_graph_max_tokens: the fitted engine's largest prefill CUDA graph;
        a step with prefill entries pays prefill_tokens on its padded token count (None or 0: its own).
        device: the same terms fitted to the steps' device seconds alone (the `device` key of a saved file;
        experiments.calibrate fits it where the tables have device_time_s): host_time_s is then the rest of a
        step. None: host_time_s is the loop terms.
        prefill_host_after_share: the share, in [0, 1], of the host's seconds per prefill token (its part of
        loop_prefill_tokens) spent after the step's tokens (the postprocess publishing the prompt's full blocks
        in the prefix cache: a hash and a token tuple a block) rather than before its launch; it moves work
        only in the overlap loop's timing (overlap_parts_s; calibrated_fit.prefill_host_after_share fits it).
        0: all before the launch (files fitted before it).
        price_band: the fit's step-price uncertainty, a fraction (None: PRICE_BAND); a simulation with this model
        runs again at 1 +- price_band times every price and records how far each metric moves
        (experiments/sim_band.py); 0: it does not. A setting of the run, not of the fit: not saved.
        mixed_walk_ratio: in (0, 1]; a riding decode's keys beyond this share of the step's longest prefill
        context pay mixed_decode_tail_keys (calibrated_fit.mixed_decode_tail_keys; 1.0: files fitted before it).
        mixed_walk_makespan: with prefill_span_grid and prefill_graph_max_tokens, a step run from a padded prefill
        graph pays mixed_decode_tail_keys on the keys by which its decodes lengthen the prefill kernel's makespan
        (PrefillSpanGrid.riding_walk_keys, a decode's key at 1 / mixed_walk_ratio of a prefill program's) instead
        (False: files fitted before it)."""
        if profile is not None:
            if coefficients is not None:
                raise ValueError("give either profile (a saved JSON path or dict) or coefficients, not both")
            data = json.loads(Path(profile).read_text()) if isinstance(profile, (str, Path)) else dict(profile)
            coefficients = _coefficients_of(data, profile)
            knee_tokens, block_size = data.get("knee_tokens"), data.get("block_size", 16)
            metadata, fitted_range = data.get("metadata"), data.get("fitted_range")
            envelope = data.get("envelope")
            single_split_min_seqs = data.get("single_split_min_seqs")
            prefill_span_pairs = data.get("prefill_span_pairs")
            prefill_span_grid = data.get("prefill_span_grid")
            prefill_graph_max_tokens = data.get("prefill_graph_max_tokens")
            device = data.get("device")
            prefill_host_after_share = data.get("prefill_host_after_share", 0.0)
            mixed_walk_ratio = data.get("mixed_walk_ratio", 1.0)
            mixed_walk_makespan = data.get("mixed_walk_makespan", False)
            max_model_len = max_model_len if max_model_len is not None else data.get("max_model_len")
        if coefficients is None:
            raise ValueError("CalibratedCostModel needs profile=<path to a calibrated JSON> or coefficients={...}; "
                             "make one with `python -m experiments.calibrate table.csv --out profile.json`")
        unknown = sorted(set(coefficients) - set(FEATURES))
        if unknown:
            raise ValueError(f"unknown coefficient(s) {unknown}; allowed: {list(FEATURES)}")
        c = {f: float(coefficients.get(f, 0.0)) for f in FEATURES}
        if "prefill_attention_span_alone" not in coefficients:   # a file fitted before the split: one per-key cost
            c["prefill_attention_span_alone"] = c["prefill_attention_span"]
        for f in ("mixed_decode_rest_keys", "mixed_decode_rest_over"):  # a file fitted before them: a decode's price
            if f not in coefficients:
                c[f] = c["decode_context_sum"]
        bad = {f: v for f, v in c.items() if not (v >= 0 and np.isfinite(v))}
        if bad:
            raise ValueError(f"coefficients must be finite and >= 0 (seconds per unit), got {bad}")
        if knee_tokens is not None and knee_tokens < 0:
            raise ValueError(f"knee_tokens must be >= 0 or None, got {knee_tokens}")
        if block_size < 1:
            raise ValueError(f"block_size must be >= 1, got {block_size}")
        if knee_tokens is None:
            c["tokens_over_knee"] = 0.0
        if single_split_min_seqs is not None and int(single_split_min_seqs) < 1:
            raise ValueError(f"single_split_min_seqs must be >= 1 or None, got {single_split_min_seqs}")
        self.single_split_min_seqs = None if single_split_min_seqs is None else int(single_split_min_seqs)
        if self.single_split_min_seqs is None:
            c["decode_tail_keys"] = c["decode_split_keys"] = 0.0
        if prefill_span_pairs is not None and not float(prefill_span_pairs) > 0:
            raise ValueError(f"prefill_span_pairs must be > 0 or None, got {prefill_span_pairs}")
        self.prefill_span_pairs = None if prefill_span_pairs is None else float(prefill_span_pairs)
        if isinstance(prefill_span_grid, Mapping):
            prefill_span_grid = PrefillSpanGrid.from_dict(prefill_span_grid)
        self.prefill_span_grid: PrefillSpanGrid | None = prefill_span_grid
        if prefill_graph_max_tokens is not None and int(prefill_graph_max_tokens) < 0:
            raise ValueError(f"prefill_graph_max_tokens must be >= 0 or None, got {prefill_graph_max_tokens}")
        self.prefill_graph_max_tokens = int(prefill_graph_max_tokens) if prefill_graph_max_tokens else None
        self._graph_tokens = prefill_graph_sizes(self.prefill_graph_max_tokens or 0)
        if self.prefill_span_pairs is None and self.prefill_span_grid is None:
            c["prefill_attention_span"] = c["prefill_attention_span_alone"] = 0.0
        if not 0.0 < float(mixed_walk_ratio) <= 1.0:
            raise ValueError(f"mixed_walk_ratio must be in (0, 1], got {mixed_walk_ratio}")
        self.mixed_walk_ratio = float(mixed_walk_ratio)
        self.mixed_walk_makespan = bool(mixed_walk_makespan and self.prefill_span_grid is not None
                                        and self.prefill_graph_max_tokens)
        self.coefficients = c
        price_band = PRICE_BAND if price_band is None else float(price_band)
        if not 0 <= price_band < 0.5:
            raise ValueError(f"backend.cost_model.price_band must be in [0, 0.5) (a fraction of every step price; "
                             f"0 turns the band off), got {price_band}")
        self.price_band = price_band
        self.knee_tokens = None if knee_tokens is None else int(knee_tokens)
        self.block_size = int(block_size)
        self.metadata = dict(metadata or {})
        self.fitted_range = dict(fitted_range or {})
        # the largest step the fit saw (sim/cost_model/envelope.py); None: a file made before it was recorded
        self.envelope = None if envelope is None else check_envelope(
            envelope, profile if isinstance(profile, (str, Path)) else "CalibratedCostModel")
        self.max_model_len = max_model_len
        (self._step, self._eager, self._seq, self._ptok, self._pairs, self._dctx, self._lm, self._knee_slope,
         self._swap_step, self._swap_out, self._swap_in, self._loop_step, self._loop_seq,
         self._loop_ptok, self._pctx, self._loop_pstep, self._dtail, self._tier_step, self._tier_out,
         self._tier_in, self._dec_tail, self._dec_split, *self._graph, self._span, self._span_alone, self._psmall,
         self._dstep, self._hit_step, self._hit_block, self._lm_step, self._cold,
         self._ride_rest, self._ride_over) = (c[f] for f in FEATURES)
        self._knee = self.knee_tokens if self.knee_tokens is not None else 0
        # a step with prefill entries needs its longest decode context where the walk is priced or riding keys are
        # priced apart from a decode's (files fitted before the pieces price them alike)
        self._mixed_uses_longest = bool(self._dtail or (self.prefill_graph_max_tokens and (
            self._dctx != self._ride_rest or self._dctx != self._ride_over)))
        self.allow_mismatch = bool(allow_mismatch)
        self.mismatch = self._check_identity(model, hardware, profile)
        # A decode-only step's cost per sequence: the sequence, its LM-head row, its share of the loop.
        self._decode_seq = self._seq + self._lm + self._loop_seq
        if isinstance(device, Mapping):
            device = CalibratedCostModel(profile=dict(device), max_model_len=max_model_len)
        if device is not None and device.device_model is not None:
            raise ValueError("a calibrated model's device model cannot have a device model of its own")
        self.device_model: CalibratedCostModel | None = device
        if not 0.0 <= float(prefill_host_after_share) <= 1.0:
            raise ValueError(f"prefill_host_after_share must be in [0, 1], got {prefill_host_after_share}")
        self.prefill_host_after_share = float(prefill_host_after_share)
        # host seconds per prefill token after the step's tokens
        self._after_ptok = self.prefill_host_after_share * self.host_prefill_token_s

    @property
    def host_prefill_token_s(self) -> float:
        """The host's seconds per prefill token: loop_prefill_tokens less the device model's."""
        dev = self.device_model.coefficients["loop_prefill_tokens"] if self.device_model is not None else 0.0
        return max(self._loop_ptok - dev, 0.0)

    def with_prefill_host_after_share(self, share: float) -> "CalibratedCostModel":
        """This model with prefill_host_after_share = share (see __init__)."""
        return CalibratedCostModel(profile=dict(self.to_dict(), prefill_host_after_share=float(share)),
                                   allow_mismatch=self.allow_mismatch)

    def _check_identity(self, model, hardware, source) -> str | None:
        if model is None and hardware is None:
            return None
        from sim.specs import get_hardware_spec, get_model_spec
        model = get_model_spec(model) if isinstance(model, str) else model
        hardware = get_hardware_spec(hardware) if isinstance(hardware, str) else hardware
        problem = fit_mismatch(self.metadata, model, hardware)
        if problem and not self.allow_mismatch:
            where = source if isinstance(source, (str, Path)) else "this calibrated cost model"
            run = " on ".join(x.name for x in (model, hardware) if x is not None)
            raise CostModelError(
                f"{where} was fitted for {self.metadata.get('model', '?')} on {self.metadata.get('hardware', '?')}, "
                f"not for this run's {run} ({problem}): its step times are that engine's. Profile and fit this "
                f"model and GPU (python -m experiments.profile, then experiments.calibrate), or pass "
                f"allow_mismatch=True (servelab: backend.cost_model.allow_mismatch=true) to use it anyway")
        return problem

    def __repr__(self) -> str:
        terms = ", ".join(f"{f}={v:.3g}" for f, v in self.coefficients.items() if v)
        return f"CalibratedCostModel({terms}, knee_tokens={self.knee_tokens})"

    # -- pricing ----------------------------------------------------------------------
    def _swap_s(self, out_blocks: float, in_blocks: float, block_size: int) -> float:
        if not (out_blocks or in_blocks):
            return 0.0
        per_block = self._swap_out * out_blocks + self._swap_in * in_blocks
        return self._swap_step + per_block * (block_size / self.block_size)

    def _price(self, prefill_new_tokens, prefill_context_lens, num_decode_seqs: int, decode_context_sum: int,
               num_prefill_samples: int | None, swap_s: float, max_decode_context_len: int | None = None) -> float:
        n_pre = len(prefill_new_tokens)
        if n_pre == 0 and num_decode_seqs == 0:
            return swap_s + (self._loop_step if swap_s else 0.0)
        t = self._step + self._loop_step + self._decode_seq * num_decode_seqs
        pre_tokens = sum(prefill_new_tokens)
        riding = bool(n_pre and num_decode_seqs and self.prefill_graph_max_tokens
                      and pre_tokens + num_decode_seqs <= self.prefill_graph_max_tokens)
        if riding:
            # riding decodes (calibrated_fit.riding_decode_keys): the longest at a decode's price, the rest in 2 pieces
            longest = min(max_decode_context_len or decode_context_sum / num_decode_seqs, decode_context_sum)
            rest = decode_context_sum - longest
            t += (self._dctx * longest + self._ride_rest * min(rest, RIDING_REST_KNEE_KEYS)
                  + self._ride_over * max(rest - RIDING_REST_KNEE_KEYS, 0))
        else:
            t += self._dctx * decode_context_sum
        if not n_pre:
            t += self._graph_s(num_decode_seqs)
        if not n_pre and max_decode_context_len is not None and (self._dec_tail or self._dec_split):
            if num_decode_seqs >= self.single_split_min_seqs:
                t += self._dec_tail * max(max_decode_context_len - decode_context_sum / num_decode_seqs, 0)
            else:
                t += self._dec_split * split_walk_keys(max_decode_context_len, num_decode_seqs,
                                                       self.single_split_min_seqs)
        if n_pre:
            pairs = sum(map(mul, prefill_new_tokens, prefill_context_lens)) \
                - (sum(map(mul, prefill_new_tokens, prefill_new_tokens)) - pre_tokens) // 2
            samples = n_pre if num_prefill_samples is None else num_prefill_samples
            step_tokens = self._padded_tokens(pre_tokens + num_decode_seqs)      # what the graph's GEMMs run
            t += (self._eager + self._loop_pstep + (self._seq + self._loop_seq) * n_pre
                  + self._ptok * (step_tokens - num_decode_seqs) + self._loop_ptok * pre_tokens + self._pairs * pairs
                  + self._psmall * min(step_tokens - num_decode_seqs, SMALL_PREFILL_TOKENS)
                  + self._pctx * sum(prefill_context_lens) + self._lm * samples)
            if samples or num_decode_seqs:
                t += self._lm_step
            span_keys = None            # the prefill entries' own makespan, where priced (riding_walk_keys reuses it)
            if self._span or self._span_alone:
                grid = self.prefill_span_grid
                if grid is not None:
                    keys, lone = grid.span_entries(prefill_new_tokens, prefill_context_lens)
                    span_keys = keys
                    t += (self._span_alone if lone else self._span) * keys
                else:
                    t += self._span * max(pairs / self.prefill_span_pairs, max(prefill_context_lens))
            if step_tokens > self._knee:
                t += self._knee_slope * (step_tokens - self._knee)
            if num_decode_seqs and self._dtail:
                # without the longest decode context, the mean is the bound the sum gives
                longest = max_decode_context_len if max_decode_context_len is not None \
                    else decode_context_sum / num_decode_seqs
                if riding and self.mixed_walk_makespan:
                    decodes = riding_decode_contexts(num_decode_seqs, decode_context_sum, longest)
                    t += self._dtail * self.prefill_span_grid.riding_walk_keys(
                        prefill_new_tokens, prefill_context_lens, decodes, 1.0 / self.mixed_walk_ratio, span_keys)
                else:
                    t += self._dtail * max(longest - self.mixed_walk_ratio * max(prefill_context_lens), 0)
        return t + swap_s

    def _padded_tokens(self, tokens: int) -> int:
        """A prefill step's token count as its CUDA graph runs it (calibrated_fit.padded_step_tokens)."""
        sizes = self._graph_tokens
        if not sizes or tokens > sizes[-1]:
            return tokens
        return sizes[bisect_left(sizes, tokens)]

    def _graph_s(self, num_decode_seqs: int) -> float:
        """A pure-decode step's own fixed terms: decode_graph_<b> (b the smallest DECODE_GRAPH_BUCKETS entry >= the
        batch), decode_step and lm_head_step (every decode entry samples)."""
        i = bisect_left(DECODE_GRAPH_BUCKETS, num_decode_seqs)
        return (self._graph[i] if i < len(self._graph) else 0.0) + self._dstep + self._lm_step

    def step_time_from_shape(self, prefill_new_tokens: Sequence[int], prefill_context_lens: Sequence[int],
                             num_decode_seqs: int, decode_context_sum: int, num_swap_blocks: int = 0,
                             num_prefill_samples: int | None = None, block_size: int = 16,
                             max_decode_context_len: int | None = None) -> float:
        """max_decode_context_len: the longest decode context (mixed_decode_tail_keys, decode_tail_keys);
        None: the mean (no tail)."""
        self.check_shape(prefill_new_tokens, prefill_context_lens, num_decode_seqs, decode_context_sum,
                         num_swap_blocks, num_prefill_samples)
        half = 0.5 * num_swap_blocks          # direction unknown here: the mean of the two per-block costs
        return self._price(prefill_new_tokens, prefill_context_lens, num_decode_seqs, decode_context_sum,
                           num_prefill_samples, self._swap_s(half, half, block_size), max_decode_context_len)

    def step_time_s(self, batch) -> float:
        """Seconds for an engine.core.batch.Batch, each swap direction at its own per-block cost."""
        n_out, n_in = len(batch.swap_out), len(batch.swap_in)
        t = 0.0
        if batch.seqs:
            t = self._forward_s(_WithoutSwaps(batch) if (n_out or n_in) else batch) + self._hits_s(batch)
        if not (n_out or n_in):
            return t
        return t + self._swap_s(n_out, n_in, batch.block_size) + (0.0 if batch.seqs else self._loop_step)

    def cold_start_s(self, idle_s: float) -> float:
        """cold_step for the first step after the replica sat idle at least COLD_IDLE_S, else 0."""
        return self._cold if idle_s >= COLD_IDLE_S else 0.0

    def _hits_s(self, batch) -> float:
        """loop_hit_step and loop_hit_blocks of a batch admitting GPU prefix-cache hits (0 without)."""
        hits = batch.num_gpu_hit_blocks
        return self._hit_step + self._hit_block * hits if hits else 0.0

    def host_time_s(self, batch, step_s: float | None = None) -> float:
        """The host's share of step_time_s (step_s, when the caller has it): with a device model, the step less
        its device seconds (input preparation, launches, the sampler's sync, the loop); without one, the loop
        terms: loop_step, loop_seqs per sequence, loop_prefill_step and loop_prefill_tokens where the step
        has prefill entries."""
        if self.device_model is not None:
            step_s = self.step_time_s(batch) if step_s is None else step_s
            return max(step_s - self.device_model.step_time_s(batch), 0.0)
        if not batch.seqs:
            return self._loop_step if (batch.swap_out or batch.swap_in) else 0.0
        t = self._loop_step + self._loop_seq * len(batch.seqs)
        p = batch.num_prefill_seqs
        if p:
            t += self._loop_pstep + self._loop_ptok * sum(batch.num_new_tokens[:p])
        return t + self._hits_s(batch)

    def overlap_parts_s(self, batch) -> tuple[float, float, float]:
        """(before the launch, device, after the tokens) seconds of step_time_s (CostModel.overlap_parts_s):
        host_time_s is the host's part; of it, loop_step and loop_seqs (postprocess, finished requests, the
        loop: fitted on the gap between a step's tokens and the next step) and prefill_host_after_share of the
        host's prefill-token seconds (publishing the prompt's blocks) come after the tokens, the rest
        (scheduling, block allocation, prefix lookups, inputs, launches) before the launch."""
        step = self.step_time_s(batch)
        host = self.host_time_s(batch, step)
        n = len(batch.seqs)
        loop = self._loop_step + self._loop_seq * n if (n or batch.swap_out or batch.swap_in) else 0.0
        if self._after_ptok and batch.num_prefill_seqs:
            loop += self._after_ptok * sum(batch.num_new_tokens[:batch.num_prefill_seqs])
        loop = min(loop, host)
        return host - loop, step - host, loop

    def decode_overlap_parts_lists(self, num_seqs: int, start_context_sum: int, k: int,
                                   start_max_context: int | None = None) -> tuple[list, list, list]:
        """overlap_parts_s of k pure-decode steps (CostModel.decode_overlap_parts_lists), element by element
        the same float operations as host_time_s and overlap_parts_s on each step's batch."""
        steps = self.decode_step_times_list(num_seqs, start_context_sum, k, start_max_context)
        loop_n = self._loop_step + self._loop_seq * num_seqs
        if self.device_model is not None:
            dev = self.device_model.decode_step_times_list(num_seqs, start_context_sum, k, start_max_context)
            hosts = [max(s - d, 0.0) for s, d in zip(steps, dev)]
        else:
            hosts = [loop_n] * len(steps)
        loops = [min(loop_n, h) for h in hosts]
        return [h - lp for h, lp in zip(hosts, loops)], [s - h for s, h in zip(steps, hosts)], loops

    def with_tier_copies_s(self, step_s: float, num_offload_blocks: int, num_load_blocks: int,
                           block_size: int = 16) -> float:
        if not (num_offload_blocks or num_load_blocks):
            return step_s
        per_block = self._tier_out * num_offload_blocks + self._tier_in * num_load_blocks
        return step_s + self._tier_step + per_block * (block_size / self.block_size)

    def _forward_s(self, batch) -> float:
        """CostModel.step_time_s (the CPU tier's copies included) plus the longest decode context, which only
        this model prices."""
        p = batch.num_prefill_seqs
        if len(batch.context_lens) == p or not (self._mixed_uses_longest if p else self.prices_longest_decode):
            return super().step_time_s(batch)
        shape = StepShape.from_batch(batch)
        if self.max_model_len is not None and max(batch.context_lens) > self.max_model_len:
            return super().step_time_s(batch)         # raises the base class's CostModelError
        t = self.step_time_from_shape(*shape, max_decode_context_len=max(batch.context_lens[p:]))
        return self.with_tier_copies_s(t, len(batch.offload), len(batch.load), batch.block_size)

    @property
    def prices_longest_decode(self) -> bool:
        return bool(self._dec_tail or self._dec_split)

    def decode_step_times_s(self, num_seqs: int, start_context_sum: int, k: int,
                            start_max_context: int | None = None) -> np.ndarray:
        """start_max_context: the first step's longest context (decode_tail_keys: constant over the k steps,
        every context growing by 1)."""
        k = int(k)
        if k < 0 or num_seqs < 0:
            raise ValueError(f"decode_step_times_s needs k >= 0 and num_seqs >= 0, got k={k}, num_seqs={num_seqs}")
        if k == 0 or num_seqs == 0:
            return np.zeros(k)
        self.check_shape((), (), num_seqs, start_context_sum, 0, None)
        self.check_shape((), (), num_seqs, start_context_sum + (k - 1) * num_seqs, 0, None)
        ctx = start_context_sum + num_seqs * np.arange(k, dtype=np.float64)            # [k]
        fixed = self._step + self._loop_step + self._decode_seq * num_seqs + self._graph_s(num_seqs)
        if start_max_context is not None and self.prices_longest_decode:
            if num_seqs >= self.single_split_min_seqs:
                fixed += self._dec_tail * max(start_max_context - start_context_sum / num_seqs, 0)
            else:     # [k]: the longest context grows by 1 a step
                fixed = fixed + self._dec_split * split_walk_keys(start_max_context + np.arange(k, dtype=np.float64),
                                                                  num_seqs, self.single_split_min_seqs)
        return fixed + self._dctx * ctx

    def _design_options(self) -> tuple:
        return (self.knee_tokens, self.block_size, self.single_split_min_seqs, self.prefill_span_pairs,
                self.prefill_graph_max_tokens, self.prefill_span_grid, self.mixed_walk_ratio, self.mixed_walk_makespan)

    def _design(self, steps) -> np.ndarray:
        return design_matrix(steps, *self._design_options())

    def _coefficient_vector(self) -> np.ndarray:
        return np.array([self.coefficients[f] for f in FEATURES])

    def _device_table_s(self, steps, x: np.ndarray) -> np.ndarray:
        """The device model's predict_table, from x (this model's design matrix of steps) where the two share
        their design options (a device-plus-host fit always does): the makespan column is not computed twice."""
        dev = self.device_model
        if dev._design_options() == self._design_options():
            return x @ dev._coefficient_vector()
        return dev.predict_table(steps)

    def predict_table(self, steps, overlapped: bool = False) -> np.ndarray:
        """Predicted seconds for every row of a step table (vectorized; same formula as step_time_s). overlapped:
        the rows of one run with overlap scheduling, in step order, priced as the simulator's overlap loop times
        them (overlap_parts_s, sim/overlap_timeline.py); a row starting after a gap behind the row before
        (start_time_s, and the recorded measured_duration_s or else duration_s) was scheduled on an idle device, and a
        row with block copies (swaps, CPU-tier loads or offloads) waited for the device before its launch."""
        if not overlapped:
            return self._design(steps) @ self._coefficient_vector()
        before, device, after = self.overlap_parts_table(steps)
        return overlapped_row_s(before, device, after, table_restarts(steps), copy_blocks(steps) > 0)

    def overlap_parts_table(self, steps) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """overlap_parts_s of every row of a step table, vectorized: ([rows] host seconds before the launch,
        [rows] device seconds, [rows] host seconds after the tokens)."""
        x = self._design(steps)
        total = x @ self._coefficient_vector()
        if self.device_model is not None:
            host = np.maximum(total - self._device_table_s(steps, x), 0.0)
        else:
            cols = [FEATURES.index(f) for f in HOST_TERMS]
            host = x[:, cols] @ np.array([self.coefficients[FEATURES[i]] for i in cols])
        cols = [FEATURES.index(f) for f in LOOP_TERMS]
        loop = x[:, cols] @ np.array([self.coefficients[FEATURES[i]] for i in cols])
        loop = np.minimum(loop + self._after_ptok * x[:, FEATURES.index("loop_prefill_tokens")], host)
        return host - loop, total - host, loop

    # -- fitting and files ---------------------------------------------------------------
    @classmethod
    def fit(cls, steps: Any, knee_candidates: Sequence[int | None] = KNEE_CANDIDATES, block_size: int | None = None,
            metadata: Mapping | None = None, objective: str = "relative", robust: bool = True,
            single_split_min_seqs: int | None = None, run_share: float = 0.5, prefill_span_pairs: float | None = None,
            prefill_graph_max_tokens: int | None = None, prefill_span_grid: PrefillSpanGrid | None = None,
            mixed_walk_ratios: Sequence[float] = (1.0,), kind_floor: float = 0.0, **options) -> "CalibratedCostModel":
        """Robust NNLS (calibrated_fit.robust_nnls); the knee with the least weighted error wins.

        steps: a table with STEP_TABLE_COLUMNS (rows with duration_s <= 0 or NaN are dropped).
        objective: "relative" (default: every row by its relative error), "sqrt" or "absolute".
        single_split_min_seqs: see __init__ (experiments.calibrate derives it from the profile's SM and KV-head
        counts); None leaves decode_tail_keys and decode_split_keys out.
        run_share: the real runs' share of the row weights where the table mixes profile and run rows
        (calibrated_fit.source_weights; default: equal shares); kind_floor: each step kind's least share of the
        runs' weight (source_weights; default 0: none).
        prefill_span_pairs: see __init__ (experiments.calibrate derives it from the profile's SM and head counts);
        None leaves prefill_attention_span out, as does prefill_span_grid (see __init__; it takes precedence).
        prefill_graph_max_tokens: see __init__ (from the profile).
        """
        if options:
            raise TypeError(f"unknown fit option(s) {sorted(options)}; allowed: knee_candidates, block_size, "
                            f"metadata, objective, robust, single_split_min_seqs, run_share, prefill_span_pairs, "
                            f"prefill_graph_max_tokens, prefill_span_grid, mixed_walk_ratios, kind_floor")
        if "duration_s" not in steps:
            raise ValueError("step table lacks the target column 'duration_s'")
        y = np.asarray(steps["duration_s"], dtype=np.float64)
        keep = np.isfinite(y) & (y > 0)
        if keep.sum() < len(FEATURES):
            raise ValueError(f"need at least {len(FEATURES)} steps with duration_s > 0 to fit, got {int(keep.sum())}")
        table = {c: np.asarray(steps[c])[keep] for c in steps.keys()}
        if block_size is None:
            block_size = int(table["block_size"][0]) if "block_size" in table else 16
        makespan = prefill_span_grid is not None and bool(prefill_graph_max_tokens)     # mixed_walk_makespan
        coef, knee, offset, offset_per_key, walk_ratio, walk_errors = fit_coefficients(
            table, knee_candidates, block_size, objective, robust, single_split_min_seqs, run_share, prefill_span_pairs,
            prefill_graph_max_tokens, prefill_span_grid, tuple(mixed_walk_ratios), kind_floor, makespan)
        rng = _fitted_range(table)
        meta = dict(metadata or {})
        meta.setdefault("fit_date", _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"))
        meta.update(num_fit_rows=int(len(table["duration_s"])), objective=objective, robust=bool(robust),
                    run_share=float(run_share), kind_floor=float(kind_floor))
        if offset is not None:
            meta["profile_offset_s"] = offset     # the profile harness's own cost per step, not priced
            meta["profile_offset_per_prefill_key_s"] = offset_per_key     # ... and per key its prefills read
        if walk_errors:
            # how clearly the table picks the ratio: the search's weighted training error per candidate
            meta["mixed_walk_ratio_errors"] = {f"{r:g}": e for r, e in walk_errors}
        return cls(coefficients=dict(zip(FEATURES, map(float, coef))), knee_tokens=knee, block_size=block_size,
                   metadata=meta, fitted_range=rng, envelope=envelope_of(table),
                   single_split_min_seqs=single_split_min_seqs, prefill_span_pairs=prefill_span_pairs,
                   prefill_graph_max_tokens=prefill_graph_max_tokens, prefill_span_grid=prefill_span_grid,
                   mixed_walk_ratio=walk_ratio, mixed_walk_makespan=makespan)

    @classmethod
    def fit_device_plus_host(cls, steps: Any, device: "CalibratedCostModel",
                             metadata: Mapping | None = None) -> "CalibratedCostModel | None":
        """The step-time model as the device model plus the host's share fitted on what it leaves of the serving
        loop's synchronous steps (calibrated_fit.fit_host_terms): its coefficients are the two sums, its knee
        and shape options the device model's, and host_time_s is exactly the host terms. None when the table
        has no such rows (a profile alone)."""
        y = np.asarray(steps["duration_s"], dtype=np.float64)
        keep = np.isfinite(y) & (y > 0)
        table = {c: np.asarray(steps[c])[keep] for c in steps.keys()}
        x = device._design(table)
        host = fit_host_terms(table, x, x @ device._coefficient_vector())
        if host is None:
            return None
        coef = {f: device.coefficients[f] + float(h) for f, h in zip(FEATURES, host)}
        meta = dict(metadata or {})
        meta.setdefault("fit_date", _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"))
        meta.update(num_fit_rows=int(keep.sum()), structure="device model + host terms (calibrated_fit.fit_host_terms)",
                    host_coefficients={f: float(h) for f, h in zip(FEATURES, host) if h})
        return cls(coefficients=coef, knee_tokens=device.knee_tokens, block_size=device.block_size, metadata=meta,
                   fitted_range=_fitted_range(table), envelope=envelope_of(table),
                   single_split_min_seqs=device.single_split_min_seqs,
                   prefill_span_pairs=device.prefill_span_pairs, prefill_span_grid=device.prefill_span_grid,
                   prefill_graph_max_tokens=device.prefill_graph_max_tokens, device=device,
                   mixed_walk_ratio=device.mixed_walk_ratio, mixed_walk_makespan=device.mixed_walk_makespan)

    def to_dict(self) -> dict:
        d = {"format": FORMAT, "name": self.name, "coefficients": dict(self.coefficients),
             "knee_tokens": self.knee_tokens, "block_size": self.block_size, "max_model_len": self.max_model_len,
             "single_split_min_seqs": self.single_split_min_seqs, "prefill_span_pairs": self.prefill_span_pairs,
             "prefill_graph_max_tokens": self.prefill_graph_max_tokens,
             "prefill_host_after_share": self.prefill_host_after_share, "mixed_walk_ratio": self.mixed_walk_ratio,
             "mixed_walk_makespan": self.mixed_walk_makespan,
             "prefill_span_grid": None if self.prefill_span_grid is None else self.prefill_span_grid.to_dict(),
             "units": "seconds per unit of each feature (see sim/cost_model/calibrated.py)",
             "fitted_range": self.fitted_range, "envelope": self.envelope, "metadata": self.metadata}
        if self.device_model is not None:
            d["device"] = self.device_model.to_dict()
        return d

    def with_step_added(self, seconds: float, **metadata) -> "CalibratedCostModel":
        """This model with `seconds` more on every step (its `step` coefficient), the rest unchanged; metadata
        entries are recorded beside the fit's (experiments.calibrate.launch_gap_s: the device's idle seconds
        between two overlapped steps)."""
        d = self.to_dict()
        d["coefficients"] = dict(d["coefficients"], step=d["coefficients"]["step"] + float(seconds))
        d["metadata"] = {**d.get("metadata", {}), **metadata}
        return CalibratedCostModel(profile=d, allow_mismatch=self.allow_mismatch, price_band=self.price_band)

    def scaled(self, factor: float) -> "CalibratedCostModel":
        """This model with every price `factor` times as long (each coefficient, the device model's too: the
        price is linear in them), for the simulation's sensitivity to a uniform step-price bias."""
        if not factor > 0:
            raise ValueError(f"scaled(factor) needs factor > 0, got {factor}")

        def scale(d: dict) -> dict:
            d = dict(d, coefficients={f: v * factor for f, v in d["coefficients"].items()})
            if d.get("device") is not None:
                d["device"] = scale(d["device"])
            return d
        return CalibratedCostModel(profile=scale(self.to_dict()), allow_mismatch=self.allow_mismatch,
                                   price_band=self.price_band)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> "CalibratedCostModel":
        return cls(profile=dict(data))

    @classmethod
    def load(cls, path: str | Path) -> "CalibratedCostModel":
        return cls(profile=path)

    def save(self, path: str | Path) -> Path:
        """Writes the JSON atomically (temporary file + rename)."""
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
        tmp.write_text(json.dumps(self.to_dict(), indent=2, sort_keys=False) + "\n")
        os.replace(tmp, path)
        return path


def _fitted_range(table: Mapping) -> dict:
    """[min, max] of every STEP_TABLE_COLUMNS column a fit saw (the saved file's fitted_range)."""
    return {c: [float(np.min(table[c])), float(np.max(table[c]))] for c in STEP_TABLE_COLUMNS if c in table}


class _WithoutSwaps:
    """A read-only view of a Batch with no block copies (its swaps are priced per direction instead)."""
    __slots__ = ("_b",)
    swap_in = swap_out = ()

    def __init__(self, batch):
        self._b = batch

    def __getattr__(self, name):
        return getattr(self._b, name)


def _coefficients_of(data: Mapping, source) -> dict:
    fmt = data.get("format")
    if fmt not in (FORMAT, FORMAT_V2, FORMAT_V1):
        raise CostModelError(f"{source}: not a calibrated cost model file (format {fmt!r}, expected {FORMAT!r}); "
                             f"make one with `python -m experiments.calibrate`")
    coef = data.get("coefficients")
    if not isinstance(coef, Mapping):
        raise CostModelError(f"{source}: field 'coefficients' must be a mapping of {list(FEATURES)} to seconds")
    if fmt == FORMAT_V1:
        coef = {new: v for k, v in coef.items() for new in V1_RENAMES.get(k, (k,))}
    return dict(coef)
