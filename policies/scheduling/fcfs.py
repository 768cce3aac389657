"""fcfs: non-preemptive first-come-first-served with full-footprint reservation.

Source: the classic FCFS baseline of serving papers (e.g. Orca-style admission
with reserved memory). A request is admitted only when its whole footprint,
prompt plus `max_output_tokens`, fits in the blocks not already reserved for the
remaining growth of running sequences. Running sequences therefore never run
out of memory and are never preempted; the price is memory left idle for
outputs that may never be produced, and head-of-line blocking behind a large
request.
"""
from __future__ import annotations

from policies.scheduling.base import SchedulingPolicy


class FCFSPolicy(SchedulingPolicy):
    fast_forward_ok = True
    name = "fcfs"

    def _blocks_to_finish(self, seq, view) -> int:
        total = seq.num_prompt_tokens + seq.max_output_tokens
        return -(-total // view.block_size) - len(seq.block_table)

    def admits(self, seq, view) -> bool:
        reserved = sum(self._blocks_to_finish(s, view) for s in view.running)
        return self._blocks_to_finish(seq, view) <= view.num_free_blocks - reserved
