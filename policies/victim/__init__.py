"""Preemption-victim policies: which running sequence a preemptive scheduler evicts.

One file per policy; policies/registry.py discovers them.
"""
from policies.victim.base import VictimPolicy

__all__ = ["VictimPolicy"]
