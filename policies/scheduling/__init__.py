"""Scheduling policies: one file per policy, each a SchedulingPolicy subclass."""
from policies.scheduling.base import SchedulingPolicy
from policies.scheduling.fcfs import FCFSPolicy
from policies.scheduling.mlfq import MLFQPolicy
from policies.scheduling.priority import PriorityPolicy
from policies.scheduling.sarathi import SarathiPolicy
from policies.scheduling.sjf import SJFPolicy
from policies.scheduling.srpt import SRPTPolicy
from policies.scheduling.vllm import VLLMPolicy
from policies.scheduling.vllm_swap import VLLMSwapPolicy

__all__ = ["SchedulingPolicy", "FCFSPolicy", "VLLMPolicy", "VLLMSwapPolicy", "PriorityPolicy", "SJFPolicy",
           "SRPTPolicy", "MLFQPolicy", "SarathiPolicy"]
