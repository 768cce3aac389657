"""Preemption-victim policies: which running sequence a preemptive scheduler evicts."""
from policies.victim.base import VictimPolicy
from policies.victim.longest_remaining import LongestRemainingVictim
from policies.victim.lowest_priority import LowestPriorityVictim
from policies.victim.most_blocks import MostBlocksVictim
from policies.victim.newest import NewestVictim

__all__ = ["VictimPolicy", "NewestVictim", "LowestPriorityVictim", "MostBlocksVictim", "LongestRemainingVictim"]
