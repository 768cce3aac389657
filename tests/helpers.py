"""Shared test helpers: the public trace files, and the one scheduler driver (a null executor on a step clock).

The clock is the step index (t = 0, 1, 2, ...): a request with arrival_time_s = t is added just before
step t is scheduled. The null executor samples one token id for every sequence that samples, and
requests use ignore_eos, so each one produces exactly max_output_tokens tokens. The block manager's
invariants are checked after every step.

    run_timeline(sched, seqs)         # the (request_id, num_new_tokens) timeline of a built Scheduler
    drive(policy, [Req(...)], ...)    # builds the Scheduler; the timeline plus preemptions and swap copies
    exit_code_and_output(capsys, main, *argv)   # a command's main() in this process: (status, stdout, stderr)
"""
from __future__ import annotations

import zlib
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from engine.core.scheduler import Scheduler, SchedulerConfig
from engine.core.sequence import SamplingParams, Sequence

ROOT = Path(__file__).resolve().parents[1]
# The public traces sit beside the repository root, never inside it: ../shared/traces/<file>.
TRACES_REL = "../shared/traces"
TRACES = ROOT.parent / "shared" / "traces"


def exit_code_and_output(capsys, main, *argv) -> tuple[int, str, str]:
    """(exit status, stdout, stderr) of a command's main(argv) run in this process (0 unless it exits)."""
    code = 0
    try:
        main(*argv)
    except SystemExit as e:
        code = e.code
    out = capsys.readouterr()
    return code, out.out, out.err


def trace_file(name: str) -> Path:
    """The trace ../shared/traces/<name>; skips the calling test, naming that path, when it is absent."""
    path = TRACES / name
    if not path.is_file():
        pytest.skip(f"trace {TRACES_REL}/{name} not found (looked for {path}): place the public traces in "
                    f"{TRACES_REL}/ beside the repository root")
    return path


def make_seq(rid, prompt, max_tokens, arrival_time_s=0.0, priority=0, **kw) -> Sequence:
    """prompt: a list of token ids, or an int (that many distinct ids derived from rid)."""
    if isinstance(prompt, int):
        # crc32, not hash(): a str's hash() changes with PYTHONHASHSEED, and one run in 997 gave two requests the
        # same ids (a prefix-cache hit no timeline expects)
        base = 1000 * (zlib.crc32(str(rid).encode()) % 997 + 1)
        prompt = [base + i for i in range(prompt)]
    return Sequence(rid, prompt, SamplingParams(max_tokens=max_tokens, ignore_eos=True),
                    arrival_time_s=arrival_time_s, priority=priority, **kw)


def step_through(sched: Scheduler, seqs, *, max_steps: int = 10_000, token: int = 0, finish_offset: int = 1,
                 check: bool = True, fast_forward: bool = False, on_step=None) -> None:
    """The driver: run `seqs` to completion on the step clock (see the module docstring).

    postprocess runs at t + finish_offset (1: a step ends when the next begins; 0: at its own start).
    fast_forward: take the simulator's exact fast path (sim.fast_forward.DecodeFastForward) whenever the
    scheduler offers it; on_step(t, batch) then gets batch None for each fast-forwarded step.
    on_step(t, batch) runs after every step.
    """
    fast = None
    if fast_forward:
        from sim.fast_forward import DecodeFastForward
        fast = DecodeFastForward(sched)
    pending = sorted(seqs, key=lambda s: s.arrival_time_s)   # stable: list order among equal arrivals
    t = 0
    while pending or sched.has_unfinished():
        if t >= max_steps:
            raise AssertionError(f"no termination within {max_steps} steps (livelock?): "
                                 f"waiting={list(sched.waiting)}, running={sched.running}, swapped={sched.swapped}")
        while pending and pending[0].arrival_time_s <= t:
            sched.add(pending.pop(0))
        if fast is not None:
            limit = int(pending[0].arrival_time_s) - t if pending else max_steps
            k = fast.decode_horizon(min(limit, max_steps - t))
            if k > 0:
                running = list(sched.running)
                fast.advance_decodes(k, [float(t + j + finish_offset) for j in range(k)], lambda seq: token)
                if check:
                    sched.block_manager.check_invariants(sched.running)
                for j in range(k):
                    if on_step is not None:
                        on_step(t + j, None, running)
                t += k
                continue
        batch = sched.schedule(float(t))
        sched.postprocess(batch, [token] * len(batch.seqs), float(t + finish_offset))
        if check:
            sched.block_manager.check_invariants(sched.running)
        if on_step is not None:
            on_step(t, batch, None)
        t += 1


def run_timeline(sched: Scheduler, seqs, max_steps: int = 10_000, token: int = 0, check=True):
    """Run to completion; returns one list per step of (request_id, num_new_tokens), prefills first."""
    timeline = []
    step_through(sched, seqs, max_steps=max_steps, token=token, check=check,
                 on_step=lambda t, batch, _: timeline.append([(s.request_id, n)
                                                              for s, n in zip(batch.seqs, batch.num_new_tokens)]))
    return timeline


# -- policies on small hand-made workloads --------------------------------------------------------------
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


def seq_of(req: Req, index: int) -> Sequence:
    tokens = req.tokens if req.tokens is not None else [1 + 1000 * index + i for i in range(req.prompt_len)]
    assert len(tokens) == req.prompt_len
    return Sequence(req.rid, tokens, SamplingParams(temperature=0.0, max_tokens=req.out_len, ignore_eos=True),
                    arrival_time_s=float(req.arrival), priority=req.priority, tenant=req.tenant,
                    ttft_slo_s=req.ttft_slo_s, tpot_slo_s=req.tpot_slo_s)


def drive(policy, reqs: list[Req], *, num_kvcache_blocks: int, block_size: int = 4, max_num_seqs: int = 256,
          max_model_len: int = 64, max_num_batched_tokens: int = 64, chunked: bool = False,
          num_cpu_blocks: int = 0, eviction=None, max_steps: int = 5000, observe=None,
          fast_forward: bool = False) -> Run:
    """A Scheduler of `policy` over reqs, finishing each step at its own start (t); the recorded timeline
    has one entry per step either way (a fast-forwarded step lists the running set, 1 token each).
    observe(t, scheduler, batch) after every step-by-step step."""
    cfg = SchedulerConfig(num_kvcache_blocks=num_kvcache_blocks, block_size=block_size, max_num_seqs=max_num_seqs,
                          max_num_batched_tokens=max_num_batched_tokens, max_model_len=max_model_len,
                          enable_chunked_prefill=chunked, num_cpu_blocks=num_cpu_blocks)
    sched = Scheduler(cfg, policy, eviction)
    seqs = [seq_of(r, i) for i, r in enumerate(reqs)]
    run = Run([], [], [], [], {s.request_id: s for s in seqs}, sched)

    def on_step(t, batch, running):
        if batch is None:          # a fast-forwarded decode step of `running`
            run.timeline.append([(s.request_id, 1) for s in running])
            run.preempted.append([]), run.swap_out.append([]), run.swap_in.append([])
            return
        run.timeline.append([(s.request_id, n) for s, n in zip(batch.seqs, batch.num_new_tokens)])
        run.preempted.append([s.request_id for s in batch.preempted])
        run.swap_out.append(list(batch.swap_out))
        run.swap_in.append(list(batch.swap_in))
        run.batches.append(batch)
        if observe is not None:
            observe(t, sched, batch)

    step_through(sched, seqs, max_steps=max_steps, finish_offset=0, fast_forward=fast_forward, on_step=on_step)
    return run


def worst_backlogged_difference(diff, backlogged) -> float:
    """The largest |sum of diff[a:b]| over the intervals [a, b) of steps inside one stretch of backlogged steps
    (diff: per step, one tenant's service less the other's; backlogged: per step, whether both were)."""
    worst, i, n = 0.0, 0, len(diff)
    while i < n:
        if not backlogged[i]:
            i += 1
            continue
        j = i
        while j < n and backlogged[j]:
            j += 1
        partial, low, high = 0.0, 0.0, 0.0       # an interval's sum is a difference of two prefix sums
        for k in range(i, j):
            partial += diff[k]
            low, high = min(low, partial), max(high, partial)
        worst = max(worst, high - low)
        i = j
    return worst

