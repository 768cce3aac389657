"""Continuous-batching scheduler, one step at a time (torch-free; shared by engine and sim).

Each call to `schedule(now_s)` builds one Batch: which sequences run and how many
tokens each computes; `postprocess(batch, token_ids, now_s)` then appends the
sampled tokens, finishes sequences and frees their blocks. The clock is the
caller's: the scheduler never reads wall time.

Two step shapes:
- chunked prefill off (nano-vllm / vLLM v0): a step is either prefill-only (new
  or preempted requests, whole uncomputed prompt at once) or decode-only; new
  admissions go first, decodes run when nothing can be admitted.
- chunked prefill on (Sarathi-Serve / vLLM v1): a step mixes decodes (first),
  chunks of running prefills, and chunks of new admissions, all under
  `max_num_batched_tokens`.

A running sequence that cannot get its next block triggers preemption: the
policy's victim (among the running sequences not yet served this step, itself
included) is preempted by recompute or swap. No new request is admitted in a step
that preempted for memory (vLLM's rule; it prevents admit/preempt ping-pong).
Preemptive policies may additionally preempt worse-ranked running sequences to
make room for a better-ranked waiting one (phase 0).

Overlap scheduling (docs/overlap.md): a backend may schedule step N+1 before step N's
tokens are known. It calls `mark_in_flight(batch)` right after launching a step and
`postprocess_in_flight(batch, token_ids, now_s)` instead of `postprocess` once the step's
tokens are on the host (after it scheduled and launched the next step). Meanwhile each
sampled token is a placeholder (engine/core/in_flight.py); a sequence whose in-flight token is
its last by max_tokens is not scheduled again, and one that ends by EOS computes one more
token, discarded. Resources are released when a step is postprocessed, so a finishing
sequence holds its blocks and its running slot while the next step is scheduled.
"""
from __future__ import annotations

from collections import deque
from dataclasses import dataclass, fields, replace

from engine.core.batch import Batch
from engine.core.block_manager import BlockManager
from engine.core.in_flight import PLACEHOLDER_BASE, is_placeholder
from engine.core.kv_layout import check_block_size
from engine.core.scheduler_view import SchedulerView
from engine.core.sequence import Sequence, SequenceStatus
from engine.core.token_budget import resolve_max_num_batched_tokens
from policies.eviction.base import EvictionPolicy
from policies.scheduling.base import SchedulingPolicy

RUNNING = SequenceStatus.RUNNING


@dataclass
class SchedulerConfig:
    """The scheduler's settings. The backends build it with `from_settings`, from the layer above
    (the composed Hydra config, engine.config.EngineConfig), whose fields carry the same names."""
    num_kvcache_blocks: int
    block_size: int = 16
    max_num_seqs: int = 256
    max_num_batched_tokens: int | None = None   # None: derived (engine.core.token_budget), see Scheduler
    max_model_len: int = 4096                   # the engine's default limit (engine.config.EngineConfig)
    enable_chunked_prefill: bool = False
    enable_prefix_caching: bool = True
    num_cpu_blocks: int = 0
    cpu_cache_num_blocks: int = 0               # CPU tier of the prefix cache, in blocks (0: none)
    cpu_cache_max_offload_blocks: int = 512     # blocks offloaded to it per step at most (the engine hides 512)

    def __post_init__(self):
        check_block_size(self.block_size)
        if self.num_kvcache_blocks < 1:
            raise ValueError(f"num_kvcache_blocks must be >= 1, got {self.num_kvcache_blocks}")
        if self.max_num_seqs < 1:
            raise ValueError(f"max_num_seqs must be >= 1, got {self.max_num_seqs}")
        if self.max_model_len < 1:
            raise ValueError(f"max_model_len must be >= 1, got {self.max_model_len}")
        if self.max_num_batched_tokens is not None and self.max_num_batched_tokens < self.block_size:
            raise ValueError(f"max_num_batched_tokens ({self.max_num_batched_tokens}) is smaller than one block "
                             f"(block_size={self.block_size}); set it to at least {self.block_size}")
        if self.num_cpu_blocks < 0:
            raise ValueError(f"num_cpu_blocks must be >= 0, got {self.num_cpu_blocks}")
        if self.cpu_cache_num_blocks < 0:
            raise ValueError(f"cpu_cache_num_blocks must be >= 0 (0: no CPU tier), got {self.cpu_cache_num_blocks}")
        if self.cpu_cache_max_offload_blocks < 0:
            raise ValueError(f"cpu_cache_max_offload_blocks must be >= 0 (blocks offloaded per step), got "
                             f"{self.cpu_cache_max_offload_blocks}")

    @classmethod
    def from_settings(cls, settings, **given) -> "SchedulerConfig":
        """Every field from `given` (what the backend settled: the KV blocks it has, the swap blocks,
        max_model_len), else the attribute of the same name of `settings` (an object or a mapping)."""
        names = [f.name for f in fields(cls)]
        unknown = sorted(set(given) - set(names))
        if unknown:
            raise TypeError(f"SchedulerConfig has no field(s) {unknown}; fields: {names}")
        mapping = hasattr(settings, "keys")      # a dict or the composed config; else an object's attributes
        missing = [k for k in names if k not in given and not (k in settings if mapping else hasattr(settings, k))]
        if missing:
            raise TypeError(f"{type(settings).__name__} has no setting(s) {missing} for SchedulerConfig; give "
                            f"them the scheduler's names")
        get = settings.get if mapping else lambda k: getattr(settings, k)
        return cls(**{k: given[k] if k in given else get(k) for k in names})


class Scheduler:
    """The step-by-step scheduler. The simulator's exact multi-step decode fast path
    (sim.fast_forward.DecodeFastForward) drives it through its public state and the methods
    head_admissible, order_running, finish, remove_finished and add_steps."""

    def __init__(self, config: SchedulerConfig, policy: SchedulingPolicy | None = None,
                 eviction: EvictionPolicy | None = None, cpu_cache_eviction: EvictionPolicy | None = None):
        """eviction: the GPU prefix cache's policy (default LRU); cpu_cache_eviction: the CPU tier's
        (default LRU; used when config.cpu_cache_num_blocks > 0)."""
        if policy is None:
            from policies.scheduling.vllm import VLLMPolicy
            policy = VLLMPolicy()
        if policy.preemption_mode not in ("recompute", "swap"):
            raise ValueError(f"policy {policy.name!r}: preemption_mode must be 'recompute' or 'swap', "
                             f"got {policy.preemption_mode!r}")
        if policy.preemption_mode == "swap" and config.num_cpu_blocks == 0:
            raise ValueError(f"policy {policy.name!r} preempts by swap but num_cpu_blocks is 0; "
                             "give the scheduler a swap space (num_cpu_blocks > 0)")
        self.policy = policy
        # The policy may force the step shape and tighten the token budget (e.g. sarathi).
        self.chunked = config.enable_chunked_prefill if policy.chunked_prefill is None else policy.chunked_prefill
        # A derived budget follows the step shape actually used (the policy's, if it forces one);
        # self.config then carries the number, so every reader sees the value in force.
        budget, self.max_num_batched_tokens_reason = resolve_max_num_batched_tokens(
            config.max_num_batched_tokens, config.max_model_len, self.chunked)
        if config.max_num_batched_tokens is None:
            config = replace(config, max_num_batched_tokens=budget)
        self.config = config
        self.token_budget = config.max_num_batched_tokens
        if policy.token_budget is not None:
            if policy.token_budget < config.block_size:
                raise ValueError(f"policy {policy.name!r}: token_budget ({policy.token_budget}) is smaller than one "
                                 f"block (block_size={config.block_size}); use at least {config.block_size}")
            if policy.token_budget < self.token_budget:
                self.max_num_batched_tokens_reason += (f"; policy {policy.name!r} caps a step at "
                                                       f"{policy.token_budget} tokens")
            self.token_budget = min(self.token_budget, policy.token_budget)
        if not self.chunked and self.token_budget < config.max_model_len:
            raise ValueError(
                f"max_num_batched_tokens ({self.token_budget}) < max_model_len ({config.max_model_len}) with chunked "
                "prefill off: a long prompt could never be scheduled. Raise max_num_batched_tokens to >= "
                "max_model_len (or leave it unset: derived), or set enable_chunked_prefill=True")
        self.block_manager = BlockManager(config.num_kvcache_blocks, config.block_size,
                                          config.enable_prefix_caching, eviction, config.num_cpu_blocks,
                                          config.cpu_cache_num_blocks, cpu_cache_eviction,
                                          config.cpu_cache_max_offload_blocks)
        self.waiting: deque[Sequence] = deque()    # WAITING and PREEMPTED, arrival order (preempted first)
        self.running: list[Sequence] = []
        self.swapped: list[Sequence] = []
        self.view = SchedulerView(self)
        self._num_admitted = 0
        self.num_steps = 0
        self.num_in_flight = 0      # steps marked in flight and not postprocessed yet (overlap scheduling)
        # Steps that served, swapped in or preempted running sequences: facts about the running set kept
        # outside the scheduler (the simulator's fast path) are stale once it moves.
        self.num_running_changes = 0

    # -- arrivals -------------------------------------------------------------------
    def add(self, seq: Sequence) -> bool:
        """Queue a request; returns False (and marks it REJECTED) if it can never run."""
        cfg = self.config
        total = seq.num_prompt_tokens + seq.max_output_tokens
        if total > cfg.max_model_len:
            return self._reject(seq, f"prompt ({seq.num_prompt_tokens}) + max_tokens ({seq.max_output_tokens}) "
                                     f"exceeds max_model_len ({cfg.max_model_len})")
        blocks = -(-total // cfg.block_size)
        if blocks > cfg.num_kvcache_blocks:
            return self._reject(seq, f"needs {blocks} KV blocks at completion, the cache has "
                                     f"{cfg.num_kvcache_blocks}")
        self.waiting.append(seq)
        return True

    def abort(self, seq: Sequence) -> bool:
        """Drop a queued, running or swapped sequence (its client gave up) and free its GPU or CPU
        blocks; call between steps. Returns False, changing nothing, when seq is not in the scheduler
        (finished, rejected, aborted, or never added)."""
        status = seq.status
        if status in (SequenceStatus.WAITING, SequenceStatus.PREEMPTED):
            if seq not in self.waiting:
                return False
            self.waiting.remove(seq)        # a waiting or preempted sequence holds no blocks
            seq.set_status(SequenceStatus.ABORTED)
        elif status is RUNNING:
            self.block_manager.free(seq)    # as a live sequence: its blocks stay cached for others
            seq.set_status(SequenceStatus.ABORTED)
            self.remove_finished()
            self.num_running_changes += 1   # facts about the running set kept outside are stale
        elif status is SequenceStatus.SWAPPED:
            self.swapped.remove(seq)
            self.block_manager.drop_swapped(seq)
            seq.set_status(SequenceStatus.ABORTED)
        else:
            return False
        seq.finish_reason = "abort"
        self.policy.on_finish(seq)
        return True

    def _reject(self, seq: Sequence, reason: str) -> bool:
        seq.set_status(SequenceStatus.REJECTED)
        seq.reject_reason = reason
        return False

    def _reject_waiting(self, batch: Batch) -> None:
        """Reject the waiting sequences the policy gives up on (policy.reject_reason); they leave in
        batch.rejected, for the backend to record, and the policy forgets them (on_finish)."""
        policy, view = self.policy, self.view
        gone = []
        for seq in self.waiting:
            reason = policy.reject_reason(seq, view)
            if reason is not None:
                self._reject(seq, f"policy {policy.name}: {reason}")
                gone.append(seq)
        if gone:
            self.waiting = deque(s for s in self.waiting if s.status is not SequenceStatus.REJECTED)
            for seq in gone:
                policy.on_finish(seq)
            batch.rejected.extend(gone)

    def has_unfinished(self) -> bool:
        return bool(self.waiting or self.running or self.swapped)

    @property
    def num_unfinished(self) -> int:
        return len(self.waiting) + len(self.running) + len(self.swapped)

    # -- one step -------------------------------------------------------------------
    def schedule(self, now_s: float) -> Batch:
        self.view.now_s = now_s
        batch = Batch(block_size=self.config.block_size)
        prefills: list[tuple[Sequence, int]] = []
        decodes: list[tuple[Sequence, int]] = []
        budget = self.token_budget
        if self.policy.may_reject and self.waiting:
            self._reject_waiting(batch)
        if self.policy.preemptive and (self.waiting or self.swapped):
            self._preempt_for_better(batch)

        if not self.chunked:
            if self.waiting and (not self.swapped or self.policy.preemptive):
                budget = self._admit(prefills, budget, now_s, batch, chunked=False)
            if not prefills:
                budget, preempted = self._serve_running(decodes, prefills, budget, batch)
                if not preempted and self.swapped:
                    self._swap_in(decodes, prefills, budget, batch)
        else:
            budget, preempted = self._serve_running(decodes, prefills, budget, batch)
            if not preempted:
                if self.swapped:
                    budget = self._swap_in(decodes, prefills, budget, batch)
                if self.waiting and budget > 0 and (not self.swapped or self.policy.preemptive):
                    budget = self._admit(prefills, budget, now_s, batch, chunked=True)

        if self.block_manager.cpu_cache is not None:
            self._add_tier_copies(batch)
        entries = prefills + decodes
        batch.seqs = [s for s, _ in entries]
        batch.num_new_tokens = [n for _, n in entries]
        batch.context_lens = [s.num_computed_tokens + n for s, n in entries]
        batch.num_prefill_seqs = len(prefills)
        if batch.seqs or batch.swap_out or batch.swap_in or batch.offload:
            self.num_steps += 1
        elif not self.running and (self.waiting or self.swapped) and not self.num_in_flight:
            raise RuntimeError(f"scheduler made no progress with nothing running: {len(self.waiting)} waiting "
                               f"(head: {self.waiting[0] if self.waiting else None}), {len(self.swapped)} swapped, "
                               f"{self.block_manager.num_free_blocks} free blocks")
        return batch

    def _add_tier_copies(self, batch: Batch) -> None:
        """The CPU tier's copies of this step (engine.core.block_manager)."""
        batch.offload, batch.load = self.block_manager.take_tier_copies()

    def _serve_running(self, decodes, prefills, budget, batch):
        """Give each running sequence its next tokens (decodes first), preempting on memory shortage."""
        self.num_running_changes += 1
        bm = self.block_manager
        bs = bm.block_size
        order = self.policy.order_running(self.running, self.view)
        chunked = self.chunked
        if chunked and len(order) > 1:
            # decodes first, then running prefill chunks (Sarathi-Serve / vLLM v1)
            order = [s for s in order if not s.is_prefilling] + [s for s in order if s.is_prefilling]
        if self.num_in_flight:
            # a sequence whose last token is in flight finishes when that step is postprocessed: neither
            # served nor a victim now
            order = [s for s in order if len(s.token_ids) - s.num_prompt_tokens < s.max_output_tokens]
        preempted = False
        free = bm.num_free_blocks
        for seq in order:
            if seq.status is not RUNNING:
                continue   # preempted earlier in this loop
            if budget <= 0:
                break
            n = len(seq.token_ids) - seq.num_computed_tokens
            if n > budget:
                if not chunked:
                    break
                n = budget
            extra = (seq.num_computed_tokens + n + bs - 1) // bs - len(seq.block_table)
            if extra > 0:
                while extra > free:
                    # candidates: running sequences not served yet this step (this one included)
                    candidates = self._unserved(order, decodes, prefills)
                    victim = self.policy.victim.select(candidates, self.view)
                    self._preempt(victim, batch)
                    preempted = True
                    free = bm.num_free_blocks
                    if victim is seq:
                        break
                if seq.status is not RUNNING:
                    continue
                bm.allocate(seq, n)
                free -= extra
            (decodes if n == 1 else prefills).append((seq, n))
            budget -= n
        if preempted:
            self.running = [s for s in self.running if s.status is RUNNING]
        return budget, preempted

    @staticmethod
    def _unserved(order, decodes, prefills):
        served = {id(s) for s, _ in decodes}
        served.update(id(s) for s, _ in prefills)
        return [s for s in order if s.status is RUNNING and id(s) not in served]

    def _admit(self, prefills, budget, now_s, batch, chunked) -> int:
        bm = self.block_manager
        cfg = self.config
        admitted = []
        # Swapped sequences resume before new admissions, except that a preemptive policy
        # admits waiting sequences ranked above every swapped one.
        key_bound = min((self.policy.key(s, self.view) for s in self.swapped), default=None) if self.swapped else None
        in_flight = self.num_in_flight
        for seq in self.policy.order_waiting(self.waiting, self.view):
            if len(self.running) >= cfg.max_num_seqs or budget <= 0:
                break
            if key_bound is not None and not self.policy.key(seq, self.view) < key_bound:
                break
            if in_flight and is_placeholder(seq.token_ids[-1]):
                break   # preempted with a token in flight: its prompt is not known until that step is postprocessed
            hits = bm.find_cached_prefix(seq)
            hit_tokens = len(hits) * bm.block_size
            n = len(seq.token_ids) - hit_tokens
            if n > budget:
                if not chunked:
                    break
                n = budget
            # Blocks this admission takes from the free pool: fresh ones, plus hit blocks now evictable
            # (and CPU-tier hits, each loaded into a fresh block).
            fresh = -(-(hit_tokens + n) // bm.block_size) - len(hits)
            revived = bm.num_hit_blocks_taken(hits) if hits else 0
            if fresh + revived > bm.num_free_blocks or not self.policy.admits(seq, self.view):
                break
            bm.allocate_cached_prefix(seq, hits)
            bm.allocate(seq, n)
            if hits:
                batch.num_gpu_hit_blocks += len(hits) - bm.last_cpu_hit_blocks
            if seq.admit_order < 0:
                seq.admit_order = self._num_admitted
                self._num_admitted += 1
                seq.num_cached_tokens = hit_tokens
                if hits:
                    seq.num_cpu_cached_tokens = bm.last_cpu_hit_blocks * bm.block_size
                seq.first_scheduled_time_s = now_s
            seq.set_status(RUNNING)
            self.running.append(seq)
            admitted.append(seq)
            prefills.append((seq, n))
            budget -= n
        if admitted:
            waiting = self.waiting
            k = 0
            while k < len(admitted) and waiting and waiting[0] is admitted[k]:
                waiting.popleft()     # the common case: admitted from the head, in order
                k += 1
            if k < len(admitted):
                admitted = admitted[k:]
                gone = set(map(id, admitted))
                self.waiting = deque(s for s in self.waiting if id(s) not in gone)
        return budget

    def _swap_in(self, decodes, prefills, budget, batch) -> int:
        self.num_running_changes += 1
        bm = self.block_manager
        order = sorted(self.swapped, key=lambda s: self.policy.key(s, self.view))
        back = []
        for seq in order:
            if seq in batch.swapped_out:
                continue    # never undo this step's own swap-out
            if len(self.running) >= self.config.max_num_seqs or budget <= 0:
                break
            n = len(seq.token_ids) - seq.num_computed_tokens
            if n > budget and self.chunked:
                n = budget      # a sequence swapped out mid-prefill resumes with a chunk
            # GPU blocks after swap-in: the swapped ones, grown to hold this step's tokens.
            need = max(len(bm.cpu_tables[seq.request_id]), -(-(seq.num_computed_tokens + n) // bm.block_size))
            if need > bm.num_free_blocks:
                break
            batch.swap_in.extend(bm.swap_in(seq))
            bm.allocate(seq, n)
            seq.set_status(RUNNING)
            self.running.append(seq)
            batch.swapped_in.append(seq)
            back.append(seq)
            if n <= budget:
                (decodes if n == 1 else prefills).append((seq, n))
                budget -= n
        if back:
            self.swapped = [s for s in self.swapped if s.status is SequenceStatus.SWAPPED]
        return budget

    def _preempt(self, seq: Sequence, batch: Batch) -> None:
        self.num_running_changes += 1
        bm = self.block_manager
        seq.num_preemptions += 1
        if self.policy.preemption_mode == "swap" and bm.can_swap_out(seq):
            batch.swap_out.extend(bm.swap_out(seq))
            seq.set_status(SequenceStatus.SWAPPED)
            seq.num_swaps += 1
            self.swapped.append(seq)
            batch.swapped_out.append(seq)
        else:   # recompute (also the fallback when the swap space is full)
            bm.free(seq)
            seq.num_computed_tokens = 0
            seq.set_status(SequenceStatus.PREEMPTED)
            self.waiting.appendleft(seq)
            batch.preempted.append(seq)

    def _preempt_for_better(self, batch: Batch) -> None:
        """Phase 0 of preemptive policies: evict worse-ranked running sequences when a
        better-ranked waiting or swapped one is blocked by memory or the sequence cap."""
        bm = self.block_manager
        view = self.view
        key = self.policy.key
        free = bm.num_free_blocks
        slots = self.config.max_num_seqs - len(self.running)
        candidates = list(self.policy.order_waiting(self.waiting, view)) + self.swapped
        candidates.sort(key=lambda s: key(s, view))
        changed = False
        for cand in candidates:
            if cand.status is SequenceStatus.SWAPPED:
                need = len(bm.cpu_tables[cand.request_id]) + 1
            else:
                n = len(cand.token_ids) - cand.num_computed_tokens
                if self.chunked:
                    n = min(n, self.token_budget)
                need = bm.blocks_needed(cand, n)
            if need <= free and slots > 0:
                free -= need
                slots -= 1
                continue
            ck = key(cand, view)
            worse = [r for r in self.running if r.status is RUNNING and key(r, view) > ck]
            if not worse or free + sum(len(r.block_table) for r in worse) < need:
                break
            while (need > free or slots <= 0) and worse:
                victim = self.policy.victim.select(worse, view)
                worse.remove(victim)
                free += len(victim.block_table)
                slots += 1
                self._preempt(victim, batch)
                changed = True
            free -= need
            slots -= 1
        if changed:
            self.running = [s for s in self.running if s.status is RUNNING]

    # -- after the executor ran --------------------------------------------------------
    def postprocess(self, batch: Batch, token_ids, now_s: float) -> list[Sequence]:
        """Advance computed counts, append sampled tokens, finish sequences; returns the finished ones."""
        bm = self.block_manager
        bs = bm.block_size
        caching = bm.enable_prefix_caching
        finished = []
        for seq, ctx, token in zip(batch.seqs, batch.context_lens, token_ids):
            seq.num_computed_tokens = ctx
            if caching and ctx // bs > seq.num_registered_blocks:
                bm.register_computed_blocks(seq)
            if ctx != len(seq.token_ids):
                continue   # an intermediate prefill chunk: nothing sampled
            seq.token_ids.append(token)
            if seq.first_token_time_s is None:
                seq.first_token_time_s = now_s
            seq.last_token_time_s = now_s
            if seq.token_times_s is not None:
                seq.token_times_s.append(now_s)
            if len(seq.token_ids) - seq.num_prompt_tokens >= seq.max_output_tokens:
                seq.finish_reason = "length"
            elif token == seq.eos_token_id and not seq.sampling_params.ignore_eos:
                seq.finish_reason = "eos"
            else:
                continue
            self._finish(seq, now_s)
            finished.append(seq)
        return self._stepped(batch, finished)

    # -- overlap scheduling (engine/core/in_flight.py) ----------------------------------
    def mark_in_flight(self, batch: Batch) -> None:
        """batch was launched and its tokens are not known yet: advance each entry's computed count
        and append a placeholder for each token it samples (PLACEHOLDER_BASE + its row among the
        batch's sampled rows, in batch order). Call after the executor read the batch's inputs."""
        k = 0
        for seq, ctx in zip(batch.seqs, batch.context_lens):
            if ctx == len(seq.token_ids):
                seq.token_ids.append(PLACEHOLDER_BASE + k)
                k += 1
            seq.num_computed_tokens = ctx
        self.num_in_flight += 1

    def postprocess_in_flight(self, batch: Batch, token_ids, now_s: float) -> list[Sequence]:
        """postprocess() of a batch marked in flight, after the next step may have been scheduled:
        each sampled token replaces its placeholder; finished sequences are released (from the
        running, waiting or swapped set, wherever the next schedule put them) and returned. An entry
        whose sequence finished or was aborted in the meantime is skipped (its token discarded)."""
        bm = self.block_manager
        bs = bm.block_size
        caching = bm.enable_prefix_caching
        self.num_in_flight -= 1
        finished = []
        for seq, ctx, token in zip(batch.seqs, batch.context_lens, token_ids):
            status = seq.status
            if status is SequenceStatus.FINISHED or status is SequenceStatus.ABORTED:
                continue
            if status is RUNNING and caching:
                # blocks of a sequence re-admitted since count only as far as its new table is computed
                upto = min(ctx, seq.num_computed_tokens)
                if upto // bs > seq.num_registered_blocks:
                    bm.register_computed_blocks(seq, upto)
            tokens = seq.token_ids
            if ctx >= len(tokens) or not is_placeholder(tokens[ctx]):
                continue   # an intermediate prefill chunk: nothing sampled
            tokens[ctx] = token
            if seq.first_token_time_s is None:
                seq.first_token_time_s = now_s
            seq.last_token_time_s = now_s
            if seq.token_times_s is not None:
                seq.token_times_s.append(now_s)
            if ctx + 1 - seq.num_prompt_tokens >= seq.max_output_tokens:
                seq.finish_reason = "length"
            elif token == seq.eos_token_id and not seq.sampling_params.ignore_eos:
                seq.finish_reason = "eos"
            else:
                continue
            del tokens[ctx + 1:]            # the next step's placeholder, if it was scheduled again
            if status is RUNNING:
                seq.num_computed_tokens = ctx
            elif status is SequenceStatus.PREEMPTED:
                self.waiting.remove(seq)    # its blocks were freed when it was preempted
            elif status is SequenceStatus.SWAPPED:
                self.swapped.remove(seq)
                bm.drop_swapped(seq)
            self._finish(seq, now_s)
            finished.append(seq)
        return self._stepped(batch, finished)

    def _stepped(self, batch: Batch, finished: list[Sequence]) -> list[Sequence]:
        """The end of a postprocess: the finished leave the running list, the policy sees the step."""
        if finished:
            self.remove_finished()
        self.policy.on_step(batch, self.view)
        return finished

    def _finish(self, seq: Sequence, now_s: float) -> None:
        seq.set_status(SequenceStatus.FINISHED)
        seq.finish_time_s = now_s
        self.block_manager.free(seq)
        self.policy.on_finish(seq)

    # -- steps applied outside schedule() / postprocess() (the simulator's decode fast path) ----------
    def head_admissible(self) -> bool:
        """Whether the first waiting sequence could be admitted right now (non-chunked rules)."""
        if len(self.running) >= self.config.max_num_seqs:
            return False
        bm = self.block_manager
        seq = next(iter(self.policy.order_waiting(self.waiting, self.view)))
        hits = bm.find_cached_prefix(seq)
        n = len(seq.token_ids) - len(hits) * bm.block_size
        if n > self.token_budget:
            return False
        fresh = -(-len(seq.token_ids) // bm.block_size) - len(hits)
        revived = bm.num_hit_blocks_taken(hits) if hits else 0
        return fresh + revived <= bm.num_free_blocks and self.policy.admits(seq, self.view)

    def order_running(self, now_s: float | None = None) -> list[Sequence]:
        """The order a step at now_s serves the running sequences in (the policy's); now_s None: the
        view's clock as it is."""
        if now_s is not None:
            self.view.now_s = now_s
        return self.policy.order_running(self.running, self.view)

    def finish(self, seq: Sequence, reason: str, now_s: float) -> None:
        """Finish a running sequence that emitted its last token at now_s ("length" or "eos"), as
        postprocess does: status, finish time, blocks freed, policy.on_finish. remove_finished() then
        takes it out of the running list."""
        seq.finish_reason = reason
        self._finish(seq, now_s)

    def remove_finished(self) -> None:
        """Drop the finished sequences from the running list (a new list; the order of the rest kept)."""
        self.running = [s for s in self.running if s.status is RUNNING]

    def add_steps(self, k: int) -> None:
        """Count k steps applied outside schedule()."""
        self.num_steps += k
