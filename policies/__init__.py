"""Pluggable policies (torch-free): scheduling, KV eviction and preemption-victim families.

Each family is a small base class whose docstring states the contract, plus one
file per policy. Policies read a narrow view and return decisions; they never
mutate engine objects.
"""
