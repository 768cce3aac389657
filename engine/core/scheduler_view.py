"""What a scheduling policy sees of the scheduler: a read-only view (torch-free).

The scheduler hands its policy one `SchedulerView` (policies.scheduling.base): the
clock of the step being built, block counts, the running / waiting / swapped
collections and the block arithmetic. The collections are the scheduler's own, not
copies (a view costs nothing per step); policies must not change them.
"""
from __future__ import annotations

from typing import TYPE_CHECKING

from engine.core.sequence import Sequence

if TYPE_CHECKING:
    from engine.core.scheduler import Scheduler, SchedulerConfig


class SchedulerView:
    """What a policy may look at. The sequence collections are the scheduler's own;
    policies must treat them (and the sequences) as read-only."""

    __slots__ = ("_sched", "now_s")

    def __init__(self, sched: "Scheduler"):
        self._sched = sched
        self.now_s = 0.0

    @property
    def num_free_blocks(self) -> int:
        return self._sched.block_manager.num_free_blocks

    @property
    def num_kvcache_blocks(self) -> int:
        return self._sched.block_manager.num_kvcache_blocks

    @property
    def block_size(self) -> int:
        return self._sched.block_manager.block_size

    @property
    def running(self) -> list[Sequence]:
        return self._sched.running

    @property
    def waiting(self):
        return self._sched.waiting

    @property
    def swapped(self) -> list[Sequence]:
        return self._sched.swapped

    @property
    def config(self) -> "SchedulerConfig":
        return self._sched.config

    def blocks_needed(self, seq: Sequence, num_new_tokens: int) -> int:
        return self._sched.block_manager.blocks_needed(seq, num_new_tokens)
