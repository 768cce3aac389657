"""mlfq: skip-join multi-level feedback queue (preemptive, length-agnostic).

Source: FastServe (Wu et al. 2023, "Fast Distributed Inference Serving for
Large Language Models"). Rule:
- Level i (0 = highest) has a service quantum of base_quantum * 2**i, in
  decode-step units: one output token costs 1, one prompt token
  prompt_token_weight. The last level's quantum is unbounded.
- Skip-join: a new request enters the highest level whose quantum covers its
  prefill cost (num_prompt_tokens * prompt_token_weight), so a long prompt
  does not demote itself level by level in its first step.
- Service is charged after each step (on_step): prompt tokens computed for the
  first time (prefix-cache hits and recompute after preemption are free) plus
  the output tokens produced. A sequence whose charge reaches its level's
  quantum is demoted one level (charge reset) at a step where it produced a
  token; never in the middle of a chunked prefill, so every demotion
  follows progress and demotion/preemption cannot ping-pong.
- key = (level, arrival, admission order): FCFS within a level; waiting and
  running sets are served in key order; a waiting request blocked by memory or
  `max_num_seqs` preempts running requests of a strictly lower level (victim
  policy picks which; default newest).
- Starvation bound: a waiting, preempted or swapped request that has not been
  served for `starvation_s` seconds (since arrival or its last step) is promoted
  to level 0, with the quantum of the level it left (so that under memory
  pressure a promotion buys real progress rather than a recompute followed by
  an immediate demotion and preemption). None disables promotion.
Helps short requests behind long ones without knowing lengths; pays with
preemptions of demoted long requests. FastServe keeps preempted KV in host memory
(preemption_mode="swap", the Hydra default); by recompute, each preemption costs a
re-prefill, and under memory pressure the policy can thrash.
"""
from __future__ import annotations

from policies.scheduling._common import (
    DEFAULT_PROMPT_TOKEN_WEIGHT,
    arrival_rank,
    check_positive,
    check_preemption_mode,
    check_weight,
)
from policies.scheduling.base import SchedulingPolicy
from policies.victim.base import VictimPolicy


class MLFQPolicy(SchedulingPolicy):
    name = "mlfq"
    ranked = True
    preemptive = True
    # on_step charges service every step, so the scheduler must not batch decode steps.
    fast_forward_ok = False

    def __init__(self, victim: VictimPolicy | None = None, base_quantum: float = 4.0, num_levels: int = 8,
                 prompt_token_weight: float = DEFAULT_PROMPT_TOKEN_WEIGHT, starvation_s: float | None = 10.0,
                 preemption_mode: str = "recompute"):
        super().__init__(victim)
        self.preemption_mode = check_preemption_mode(self.name, preemption_mode, "FastServe swaps")
        self.base_quantum = check_positive(self.name, "base_quantum", base_quantum)
        self.num_levels = check_positive(self.name, "num_levels", num_levels, integer=True)
        self.prompt_token_weight = check_weight(self.name, "prompt_token_weight", prompt_token_weight)
        self.starvation_s = None if starvation_s is None else check_positive(self.name, "starvation_s", starvation_s)
        # Per-request state, keyed by request_id and dropped on finish.
        self._level: dict = {}          # current level
        self._charge: dict = {}         # service charged at the current level (decode-step units)
        self._prompt_done: dict = {}    # prompt tokens already charged (first computation only)
        self._outputs: dict = {}        # num_output_tokens at the last on_step
        self._last_served_s: dict = {}  # clock time of the last step that served the request

    def quantum(self, level: int) -> float:
        return self.base_quantum * 2.0 ** level

    def entry_level(self, seq) -> int:
        cost = seq.num_prompt_tokens * self.prompt_token_weight
        level = 0
        while level < self.num_levels - 1 and self.quantum(level) < cost:
            level += 1
        return level

    def level(self, seq) -> int:
        lv = self._level.get(seq.request_id)
        return self.entry_level(seq) if lv is None else lv

    def key(self, seq, view):
        return (self.level(seq), *arrival_rank(seq))

    def on_step(self, batch, view) -> None:
        now = view.now_s
        w = self.prompt_token_weight
        for seq, n, ctx in zip(batch.seqs, batch.num_new_tokens, batch.context_lens):
            if seq.is_finished:
                continue            # on_finish already dropped its state
            rid = seq.request_id
            level = self._level.setdefault(rid, self.entry_level(seq))
            done = self._prompt_done.get(rid, 0)
            end = min(ctx, seq.num_prompt_tokens)
            new_prompt = max(0, end - max(ctx - n, done))   # skips prefix hits and recomputed tokens
            self._prompt_done[rid] = max(done, end)
            produced = seq.num_output_tokens - self._outputs.get(rid, 0)
            self._outputs[rid] = seq.num_output_tokens
            charge = self._charge.get(rid, 0.0) + w * new_prompt + produced
            if produced > 0 and charge >= self.quantum(level) and level < self.num_levels - 1:
                self._level[rid] = level + 1
                charge = 0.0
            self._charge[rid] = charge
            self._last_served_s[rid] = now
        if self.starvation_s is None:
            return
        for queue in (view.waiting, view.swapped):
            for seq in queue:
                rid = seq.request_id
                level = self.level(seq)
                if now - self._last_served_s.get(rid, seq.arrival_time_s) >= self.starvation_s and level != 0:
                    # Promoted with the quantum of the level it left, as credit: a request re-admitted
                    # (often after a recompute) keeps the top rank until it has done that much work,
                    # instead of being demoted and preempted again after level 0's tiny quantum.
                    self._level[rid] = 0
                    self._charge[rid] = self.quantum(0) - self.quantum(level)
                    self._last_served_s[rid] = now

    def on_finish(self, seq) -> None:
        rid = seq.request_id
        for state in (self._level, self._charge, self._prompt_done, self._outputs, self._last_served_s):
            state.pop(rid, None)

    def __repr__(self) -> str:
        return (f"MLFQPolicy(victim={self.victim.name}, base_quantum={self.base_quantum:g}, "
                f"num_levels={self.num_levels}, prompt_token_weight={self.prompt_token_weight:g}, "
                f"starvation_s={self.starvation_s}, preemption_mode={self.preemption_mode!r})")
