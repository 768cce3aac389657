"""srpt: preemptive shortest remaining (predicted) processing time.

Source: SRPT (Schrage 1968), applied to LLM serving with predicted output
lengths (e.g. the preemptive ranking scheduler of Fu et al. 2024).
Rule: a request's remaining cost is

    remaining = max(0, predicted_output_tokens - num_output_tokens)
              + prompt_token_weight * max(0, num_prompt_tokens - num_computed_tokens)

key = (remaining, arrival, admission order). Waiting and running sets are served
in key order, and a waiting request blocked by memory or `max_num_seqs`
preempts running requests with a strictly larger remaining cost (victim policy
picks which; default newest, `longest_remaining` is the textbook choice).
A request that outlives its prediction has remaining 0 and is never preempted.
Helps mean latency most; long requests starve under sustained load, and each
preemption costs a recompute (or a swap).
"""
from __future__ import annotations

from policies.scheduling._common import PredictedLengthPolicy, arrival_rank


class SRPTPolicy(PredictedLengthPolicy):
    name = "srpt"
    preemptive = True
    # With an empty waiting queue (the only case the scheduler fast-forwards for a preemptive
    # policy) every running sequence is served each step, so key changes cannot matter.
    fast_forward_ok = True

    def remaining_cost(self, seq) -> float:
        outputs = max(0, self.predictor.predict(seq) - seq.num_output_tokens)
        prompt = max(0, seq.num_prompt_tokens - seq.num_computed_tokens)
        return outputs + self.prompt_token_weight * prompt

    def key(self, seq, view):
        return (self.remaining_cost(seq), *arrival_rank(seq))
