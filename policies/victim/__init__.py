"""Preemption-victim policies: which running sequence a preemptive scheduler evicts."""
from policies.victim.base import VictimPolicy
from policies.victim.newest import NewestVictim

__all__ = ["VictimPolicy", "NewestVictim"]
