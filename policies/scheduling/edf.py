"""edf: earliest deadline first on the remaining slack, for per-request latency targets (SLOs).

Source: EDF (Liu & Layland 1973) on the deadlines LLM serving SLOs give (the TTFT / TPOT targets of
DistServe, Zhong et al. OSDI'24, and of SLO-aware schedulers after it).
Rule, per request (targets from the workload: Sequence.ttft_slo_s / tpot_slo_s, seconds):
- Before its first token the deadline is arrival + ttft_slo_s; after it, the time the next token is
  due for the mean TPOT to stay on target: first_token_time + num_output_tokens * tpot_slo_s.
  No target: no deadline (ranked after every request that has one, FCFS among themselves).
- Remaining work is estimated as the tokens still to prefill over `prefill_tokens_per_s` (None: 0,
  plain EDF on the deadline). slack = deadline - now - that estimate.
- key = (late, deadline - estimate, arrival, admission order): waiting and running sets are served
  in slack order (now is common to all, so the order of slack is the order of deadline - estimate).
- late: a request before its first token whose slack is below 0 can no longer make its TTFT target.
  on_late="deprioritize" ranks it after every request still on time (FCFS among the late);
  on_late="reject" rejects it while it waits, before it takes any GPU time (status rejected,
  reject_reason "policy edf: ...", counted in the summary's num_rejected_by_policy).
Non-preemptive (beyond vLLM's preemption for memory, by the victim policy, default newest): a
running request is never evicted for a more urgent one. Keys depend on the clock, so the simulator
does not fast-forward decode steps under this policy.
"""
from __future__ import annotations

import math

from policies.scheduling._common import arrival_rank, check_positive
from policies.scheduling.base import SchedulingPolicy
from policies.victim.base import VictimPolicy

ON_LATE = ("deprioritize", "reject")


class EDFPolicy(SchedulingPolicy):
    name = "edf"
    ranked = True
    # the rank of a waiting request turns "late" as the clock passes its slack
    fast_forward_ok = False

    def __init__(self, victim: VictimPolicy | None = None, on_late: str = "deprioritize",
                 prefill_tokens_per_s: float | None = None):
        super().__init__(victim)
        if on_late not in ON_LATE:
            raise ValueError(f"edf.on_late must be one of {ON_LATE}, got {on_late!r}")
        self.on_late = on_late
        self.may_reject = on_late == "reject"
        self.prefill_tokens_per_s = (None if prefill_tokens_per_s is None else
                                     check_positive(self.name, "prefill_tokens_per_s", prefill_tokens_per_s))

    def work_s(self, seq) -> float:
        """Estimated seconds of prefill still ahead of the request's next token."""
        if self.prefill_tokens_per_s is None:
            return 0.0
        n = len(seq.token_ids) - seq.num_computed_tokens      # 1 while decoding: no prefill ahead
        return n / self.prefill_tokens_per_s if n > 1 else 0.0

    @staticmethod
    def deadline_s(seq) -> float:
        """When the request's next token is due (inf: no target for it)."""
        if seq.first_token_time_s is None:
            return math.inf if seq.ttft_slo_s is None else seq.arrival_time_s + seq.ttft_slo_s
        if seq.tpot_slo_s is None:
            return math.inf
        return seq.first_token_time_s + seq.num_output_tokens * seq.tpot_slo_s

    def slack_s(self, seq, now_s: float) -> float:
        return self.deadline_s(seq) - now_s - self.work_s(seq)

    def is_late(self, seq, now_s: float) -> bool:
        """Before its first token and predicted to miss its TTFT target."""
        return seq.first_token_time_s is None and seq.ttft_slo_s is not None and self.slack_s(seq, now_s) < 0

    def key(self, seq, view):
        late = self.on_late == "deprioritize" and self.is_late(seq, view.now_s)
        return (late, self.deadline_s(seq) - self.work_s(seq), *arrival_rank(seq))

    def reject_reason(self, seq, view) -> str | None:
        if seq.first_scheduled_time_s is not None or not self.is_late(seq, view.now_s):
            return None
        return (f"TTFT target {seq.ttft_slo_s:g} s can no longer be met (slack "
                f"{self.slack_s(seq, view.now_s):.4g} s at t={view.now_s:.6g} s)")

    def __repr__(self) -> str:
        return (f"EDFPolicy(victim={self.victim.name}, on_late={self.on_late!r}, "
                f"prefill_tokens_per_s={self.prefill_tokens_per_s})")
