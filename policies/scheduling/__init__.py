"""Scheduling policies: one file per policy, each a SchedulingPolicy subclass.

One file per policy; policies/registry.py discovers them.
"""
from policies.scheduling.base import SchedulingPolicy

__all__ = ["SchedulingPolicy"]
