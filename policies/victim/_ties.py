"""Shared tie-break: among equals, the newest sequence (latest arrival, then latest admission)."""
from __future__ import annotations


def newness(seq) -> tuple:
    return (seq.arrival_time_s, seq.admit_order)
