"""Routers for multi-replica simulation: one file per policy, each a Router subclass.

    from sim.router import get_router
    router = get_router("prefix_affinity")
"""
import sys

from engine.core.registry import discover
from sim.router.base import ReplicaView, RoutedTally, Router
from sim.router.least_outstanding_tokens import LeastOutstandingTokensRouter
from sim.router.prefix_affinity import PrefixAffinityRouter
from sim.router.round_robin import RoundRobinRouter

# Every Router subclass in this package's files, by name (adding a router: one file + conf/router/NAME.yaml).
ROUTERS: dict[str, type[Router]] = discover(sys.modules[__name__], Router)


def get_router(name: str, **kwargs) -> Router:
    cls = ROUTERS.get(name)
    if cls is None:
        raise ValueError(f"unknown router {name!r}; known routers: {sorted(ROUTERS)}")
    return cls(**kwargs)


__all__ = ["ROUTERS", "LeastOutstandingTokensRouter", "PrefixAffinityRouter", "ReplicaView", "RoundRobinRouter",
           "RoutedTally", "Router", "get_router"]
