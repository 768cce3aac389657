"""VTC's fairness bound in the simulator (Sheng et al., "Fairness in Serving Large Language Models", OSDI'24:
for two clients backlogged over [t1, t2), |W_f(t1, t2) - W_g(t1, t2)| <= 2U, U = max(w_p L_input, w_q M), with
w_p / w_q the input / output prices, L_input the longest prompt and M the most tokens a running batch holds, here
the KV cache's capacity). The simulator runs the shared scheduler on a constant-cost clock, one schedule() per step;
a tenant is backlogged at a step when it has a waiting request (new or preempted) as the step is scheduled, and
its service is read from its requests' token times: input_price x prompt with the first token, then output_price
per token (recomputed tokens are not charged again, as VTC charges them)."""
import numpy as np

from engine.core.recorder import Recorder
from engine.core.scheduler import Scheduler, SchedulerConfig
from engine.core.sequence import SamplingParams, Sequence
from policies.scheduling.vllm import VLLMPolicy
from policies.scheduling.vtc import VTCPolicy
from sim.cost_model import ConstantCostModel
from sim.simulator import Replica, Simulator
from tests.helpers import worst_backlogged_difference

BLOCKS, BLOCK_SIZE = 24, 16            # M = 384 tokens
W_IN, W_OUT = 1.0, 2.0                 # VTCPolicy's default prices


def _requests():
    """heavy sends 120 requests in the first second, light 60 in the first two: both stay backlogged for most of
    the run (distinct prompts, so every prompt token is computed for the first time)."""
    rng = np.random.default_rng(7)
    out = []
    for tenant, n, span_s in (("heavy", 120, 1.0), ("light", 60, 2.0)):
        for i in range(n):
            p, q = int(rng.integers(16, 97)), int(rng.integers(4, 41))
            rid = f"{tenant}{i}"
            prompt = [1000 * (len(out) + 1) + j for j in range(p)]
            out.append(Sequence(rid, prompt, SamplingParams(max_tokens=q, ignore_eos=True),
                                arrival_time_s=float(rng.uniform(0, span_s)), tenant=tenant,
                                record_token_times=True))
    return out


class ObservedScheduler(Scheduler):
    """Keeps, for every step it schedules, the step's start and the tenants with a waiting request (new or
    preempted) at that decision: the paper's backlogged clients."""

    def __init__(self, *args, **kw):
        super().__init__(*args, **kw)
        self.starts, self.backlogged = [], []

    def schedule(self, now_s):
        waiting = {s.tenant for s in self.waiting}
        batch = super().schedule(now_s)
        if batch.seqs:
            self.starts.append(now_s)
            self.backlogged.append(waiting)
        return batch


def _worst_backlogged_difference(policy) -> tuple[float, float, int]:
    """(largest |W_heavy - W_light| over step intervals in which both had a waiting request, the paper's 2U,
    preemptions)."""
    seqs = _requests()
    sched = ObservedScheduler(SchedulerConfig(num_kvcache_blocks=BLOCKS, block_size=BLOCK_SIZE, max_num_seqs=8,
                                              max_model_len=256, max_num_batched_tokens=256), policy)
    cost = ConstantCostModel(step_s=0.01, per_prefill_token_s=1e-5, per_decode_seq_s=1e-4)
    Simulator(Replica(sched, cost, Recorder()), fast_path=False).run(seqs)        # one schedule() per step
    assert all(s.num_output_tokens == s.max_output_tokens for s in seqs)
    starts = np.asarray(sched.starts)
    service = {"heavy": np.zeros(len(starts)), "light": np.zeros(len(starts))}
    for s in seqs:
        # a token's step: the last one started before it (steps run back to back while requests wait)
        steps = np.searchsorted(starts, s.token_times_s, side="left") - 1
        for j, k in enumerate(steps):
            service[s.tenant][k] += W_OUT + (W_IN * s.num_prompt_tokens if j == 0 else 0.0)
    both = np.array([{"heavy", "light"} <= b for b in sched.backlogged])
    worst = worst_backlogged_difference(service["heavy"] - service["light"], both)
    assert np.count_nonzero(both) > 100                # a long backlogged stretch, not a vacuous check
    longest = max(s.num_prompt_tokens for s in seqs)
    return worst, 2 * max(W_IN * longest, W_OUT * BLOCKS * BLOCK_SIZE), sum(s.num_preemptions for s in seqs)


def test_vtc_keeps_backlogged_tenants_within_the_papers_bound_in_the_simulator():
    vtc, bound, vtc_preemptions = _worst_backlogged_difference(VTCPolicy())
    assert bound == 2 * W_OUT * 384
    assert vtc <= bound
    fcfs, _, _ = _worst_backlogged_difference(VLLMPolicy())
    assert fcfs > 2 * bound          # the check can fail: FCFS serves heavy's early burst while light waits
    assert vtc_preemptions > 0       # memory binds (M is the cache's capacity): preempted requests wait again
