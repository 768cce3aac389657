"""Drive the real Scheduler step by step with a fake clock and a null executor.

The clock is the step index (t = 0, 1, 2, ...): a request with arrival_time_s = t
is added just before step t is scheduled. The null executor samples token 0 for
every sequence that samples, and requests use ignore_eos, so each one produces
exactly max_output_tokens tokens. The driver records, per step, which request ids
ran with how many tokens, plus preemptions and swap copies, and checks the block
manager's invariants after every step.
"""
from __future__ import annotations

from dataclasses import dataclass, field

from engine.core.scheduler import Scheduler, SchedulerConfig
from engine.core.sequence import SamplingParams, Sequence


@dataclass
class Req:
    rid: str
    prompt_len: int
    out_len: int
    arrival: int = 0
    priority: int = 0
    tokens: list[int] | None = None   # default: distinct per request (no prefix sharing)
    tenant: str = "default"
    ttft_slo_s: float | None = None
    tpot_slo_s: float | None = None


@dataclass
class Run:
    timeline: list[list[tuple[str, int]]]          # per step: [(request_id, num_new_tokens), ...] in batch order
    preempted: list[list[str]]                     # per step: ids preempted by recompute
    swap_out: list[list[tuple[int, int]]]          # per step: GPU->CPU block copies
    swap_in: list[list[tuple[int, int]]]
    seqs: dict[str, Sequence]
    scheduler: Scheduler
    batches: list = field(default_factory=list)

    def finish_step(self, rid: str) -> int:
        return int(self.seqs[rid].finish_time_s)


def make_seq(req: Req, index: int) -> Sequence:
    tokens = req.tokens if req.tokens is not None else [1 + 1000 * index + i for i in range(req.prompt_len)]
    assert len(tokens) == req.prompt_len
    return Sequence(req.rid, tokens, SamplingParams(temperature=0.0, max_tokens=req.out_len, ignore_eos=True),
                    arrival_time_s=float(req.arrival), priority=req.priority, tenant=req.tenant,
                    ttft_slo_s=req.ttft_slo_s, tpot_slo_s=req.tpot_slo_s)


def drive(policy, reqs: list[Req], *, num_blocks: int, block_size: int = 4, max_num_seqs: int = 256,
          max_model_len: int = 64, max_num_batched_tokens: int = 64, chunked: bool = False,
          num_cpu_blocks: int = 0, eviction=None, max_steps: int = 5000, observe=None,
          fast_forward: bool = False) -> Run:
    """fast_forward: take the simulator's exact fast path (Scheduler.decode_horizon /
    advance_decodes) whenever the scheduler offers it; the recorded timeline has one
    entry per step either way (a fast-forwarded step lists the running set, 1 token each)."""
    cfg = SchedulerConfig(num_kvcache_blocks=num_blocks, block_size=block_size, max_num_seqs=max_num_seqs,
                          max_num_batched_tokens=max_num_batched_tokens, max_model_len=max_model_len,
                          enable_chunked_prefill=chunked, num_cpu_blocks=num_cpu_blocks)
    sched = Scheduler(cfg, policy, eviction)
    seqs = [make_seq(r, i) for i, r in enumerate(reqs)]
    pending = sorted(seqs, key=lambda s: s.arrival_time_s)   # stable: list order among equal arrivals
    run = Run([], [], [], [], {s.request_id: s for s in seqs}, sched)
    t = 0
    while pending or sched.has_unfinished():
        if t >= max_steps:
            raise AssertionError(f"no termination within {max_steps} steps (livelock?): "
                                 f"waiting={list(sched.waiting)}, running={sched.running}, swapped={sched.swapped}")
        while pending and pending[0].arrival_time_s <= t:
            sched.add(pending.pop(0))
        if fast_forward:
            limit = int(pending[0].arrival_time_s) - t if pending else max_steps
            k = sched.decode_horizon(min(limit, max_steps - t))
            if k > 0:
                step = [(s.request_id, 1) for s in sched.running]
                sched.advance_decodes(k, [float(t + j) for j in range(k)], lambda seq: 0)
                for _ in range(k):
                    run.timeline.append(list(step))
                    run.preempted.append([]), run.swap_out.append([]), run.swap_in.append([])
                sched.block_manager.check_invariants(sched.running)
                t += k
                continue
        batch = sched.schedule(float(t))
        sched.postprocess(batch, [0] * len(batch.seqs), float(t))
        run.timeline.append([(s.request_id, n) for s, n in zip(batch.seqs, batch.num_new_tokens)])
        run.preempted.append([s.request_id for s in batch.preempted])
        run.swap_out.append(list(batch.swap_out))
        run.swap_in.append(list(batch.swap_in))
        run.batches.append(batch)
        sched.block_manager.check_invariants(sched.running)
        if observe is not None:
            observe(t, sched, batch)
        t += 1
    return run
