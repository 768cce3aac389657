"""qoe: QoE-aware preemptive scheduling on each request's token-delivery buffer (after Andes).

Source: Liu et al., "Andes: Defining and Enhancing Quality-of-Experience in LLM-Based Text Streaming
Services" (2024). Andes sees a streamed answer through its reader: the first token is expected by the
TTFT target, then one token every TPOT target (the reading speed). A request whose delivered tokens
run ahead of that timeline has a buffer and can be paused without the reader noticing; one behind it
loses QoE every moment it waits. Andes picks the requests to run with a knapsack over a short horizon
and preempts (by swap) those that can afford a pause. This policy keeps that core in a greedy rule:
- buffer_s = the time until the request's next token is due on its timeline: before the first token,
  arrival + ttft_slo_s - now; after it, first_token_time + num_output_tokens * tpot_slo_s - now
  (negative: behind). Requests without targets use default_ttft_slo_s / default_tpot_slo_s.
- key = buffer_s (- pause_hysteresis_s for a running request), arrival, admission order: waiting,
  running and swapped requests are served least buffer first, and a waiting (or swapped) request
  blocked by memory or max_num_seqs preempts running requests whose buffer exceeds its own by more
  than pause_hysteresis_s (the victim policy picks among them; default newest). The hysteresis keeps
  two requests from trading the GPU every step.
preemption_mode "swap" keeps the paused KV in host memory (as Andes); "recompute" re-prefills it.
Keys follow the clock, so the simulator does not fast-forward decode steps under this policy.
"""
from __future__ import annotations

from policies.scheduling._common import arrival_rank, check_positive, check_preemption_mode
from policies.scheduling.base import SchedulingPolicy
from policies.victim.base import VictimPolicy


class QoEPolicy(SchedulingPolicy):
    name = "qoe"
    ranked = True
    preemptive = True
    fast_forward_ok = False

    def __init__(self, victim: VictimPolicy | None = None, default_ttft_slo_s: float = 1.0,
                 default_tpot_slo_s: float = 0.2, pause_hysteresis_s: float = 1.0,
                 preemption_mode: str = "recompute"):
        super().__init__(victim)
        self.preemption_mode = check_preemption_mode(self.name, preemption_mode, "Andes swaps")
        self.default_ttft_slo_s = check_positive(self.name, "default_ttft_slo_s", default_ttft_slo_s)
        self.default_tpot_slo_s = check_positive(self.name, "default_tpot_slo_s", default_tpot_slo_s)
        self.pause_hysteresis_s = check_positive(self.name, "pause_hysteresis_s", pause_hysteresis_s)

    def due_s(self, seq) -> float:
        """When the request's next token is due on its reader's timeline."""
        if seq.first_token_time_s is None:
            ttft = self.default_ttft_slo_s if seq.ttft_slo_s is None else seq.ttft_slo_s
            return seq.arrival_time_s + ttft
        tpot = self.default_tpot_slo_s if seq.tpot_slo_s is None else seq.tpot_slo_s
        return seq.first_token_time_s + seq.num_output_tokens * tpot

    def buffer_s(self, seq, now_s: float) -> float:
        return self.due_s(seq) - now_s

    def key(self, seq, view):
        running = seq.status.value == "running"
        return (self.buffer_s(seq, view.now_s) - (self.pause_hysteresis_s if running else 0.0), *arrival_rank(seq))

    def __repr__(self) -> str:
        return (f"QoEPolicy(victim={self.victim.name}, default_ttft_slo_s={self.default_ttft_slo_s:g}, "
                f"default_tpot_slo_s={self.default_tpot_slo_s:g}, pause_hysteresis_s={self.pause_hysteresis_s:g}, "
                f"preemption_mode={self.preemption_mode!r})")
