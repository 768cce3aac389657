"""sarathi: chunked prefill under a fixed per-step token budget (stall-free batching).

Source: Sarathi-Serve (Agrawal et al., OSDI 2024), the default of vLLM V1.
Rule: every step holds at most `token_budget` tokens; running decodes go first
(one token each), then chunks of running prefills, then chunks of newly
admitted prompts, FCFS, until the budget is spent. A long prompt is split
across steps, so it never stalls the running decodes (bounded time between
tokens); the price is a slightly longer time to first token for long prompts
and KV re-reads per chunk. Non-preemptive apart from vllm-style memory
preemption (victim default newest). The scheduler's chunked mode implements the
step shape; this policy forces it on and tightens the budget.
Typical budgets: 512 (strict inter-token SLO) to 2048.
"""
from __future__ import annotations

from policies.scheduling._common import check_positive
from policies.scheduling.base import SchedulingPolicy
from policies.victim.base import VictimPolicy


class SarathiPolicy(SchedulingPolicy):
    name = "sarathi"
    chunked_prefill = True
    # FCFS without per-step state; the scheduler fast-forwards chunked mode only with an empty queue.
    fast_forward_ok = True

    def __init__(self, victim: VictimPolicy | None = None, token_budget: int = 512):
        super().__init__(victim)
        # The scheduler also refuses a budget below one KV block (it knows block_size).
        self.token_budget = check_positive(self.name, "token_budget", token_budget, integer=True)

    def __repr__(self) -> str:
        return f"SarathiPolicy(victim={self.victim.name}, token_budget={self.token_budget})"
