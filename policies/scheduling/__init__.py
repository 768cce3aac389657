"""Scheduling policies: one file per policy, each a SchedulingPolicy subclass."""
from policies.scheduling.base import SchedulingPolicy
from policies.scheduling.fcfs import FCFSPolicy
from policies.scheduling.vllm import VLLMPolicy

__all__ = ["SchedulingPolicy", "FCFSPolicy", "VLLMPolicy"]
