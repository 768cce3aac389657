"""Shared test helpers: the public trace files, and a Scheduler driven with a null executor on a step clock."""
from __future__ import annotations

from pathlib import Path

import pytest

from engine.core.scheduler import Scheduler
from engine.core.sequence import SamplingParams, Sequence

ROOT = Path(__file__).resolve().parents[1]
# The public traces sit beside the repository root, never inside it: ../shared/traces/<file>.
TRACES_REL = "../shared/traces"
TRACES = ROOT.parent / "shared" / "traces"


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
        base = 1000 * (hash(rid) % 997 + 1)
        prompt = [base + i for i in range(prompt)]
    return Sequence(rid, prompt, SamplingParams(max_tokens=max_tokens, ignore_eos=True),
                    arrival_time_s=arrival_time_s, priority=priority, **kw)


def run_timeline(sched: Scheduler, seqs, max_steps: int = 10_000, token: int = 0, check=True):
    """Run to completion; seqs are added when the step clock reaches their arrival time.

    Returns one list per step of (request_id, num_new_tokens), prefills first, and
    checks the block manager's invariants after every step.
    """
    pending = sorted(seqs, key=lambda s: s.arrival_time_s)
    timeline = []
    t = 0
    while pending or sched.has_unfinished():
        while pending and pending[0].arrival_time_s <= t:
            sched.add(pending.pop(0))
        batch = sched.schedule(float(t))
        timeline.append([(s.request_id, n) for s, n in zip(batch.seqs, batch.num_new_tokens)])
        sched.postprocess(batch, [token] * len(batch.seqs), float(t + 1))
        if check:
            sched.block_manager.check_invariants(sched.running)
        t += 1
        if t > max_steps:
            raise AssertionError(f"no termination within {max_steps} steps")
    return timeline
