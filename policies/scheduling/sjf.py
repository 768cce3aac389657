"""sjf: non-preemptive shortest job first by predicted length.

Source: shortest-job-first with predicted output lengths, as in speculative
SJF (Qiu et al. 2024) and "Efficient LLM Scheduling by Learning to Rank" (Fu
et al. 2024). Rule: a request's job cost is

    cost = predicted_output_tokens + prompt_token_weight * num_prompt_tokens

(prompt tokens in decode-step units); the waiting queue is admitted in
increasing cost (ties: arrival) and the running set served in the same order.
Nothing running is preempted for a shorter arrival (use srpt for that); memory
preemption works as in vllm, with the given victim (default newest).
Helps mean latency with a good predictor; long jobs can starve under load.
"""
from __future__ import annotations

from policies.scheduling._common import PredictedLengthPolicy, arrival_rank


class SJFPolicy(PredictedLengthPolicy):
    name = "sjf"
    # Keys are static and nothing is kept per step: pure decode steps may be batched.
    fast_forward_ok = True

    def job_cost(self, seq) -> float:
        return self.predictor.predict(seq) + self.prompt_token_weight * seq.num_prompt_tokens

    def key(self, seq, view):
        return (self.job_cost(seq), *arrival_rank(seq))
