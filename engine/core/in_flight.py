"""Placeholder tokens of a step still in flight (overlap scheduling; torch-free).

With overlap scheduling the backend schedules step N+1 before step N's sampled tokens reach the
host. `Scheduler.mark_in_flight(batch)` then appends, for each entry of step N that samples, a
placeholder to the sequence's token_ids: PLACEHOLDER_BASE + k, where k is the entry's row among
step N's sampled rows (entries in batch order). The scheduler counts it like a real token (the
sequence decodes it in step N+1); the engine's runner replaces it on the device with row k of
step N's sampled-token tensor (no host round trip); `Scheduler.postprocess_in_flight` writes the
real token over it once step N's tokens are on the host.

Real token ids are >= 0 in the engine and small negative numbers in the simulator (its dummy
tokens, -1 - request_id), so the placeholder range, far below both, never collides with them.
"""
from __future__ import annotations

PLACEHOLDER_BASE = -(1 << 62)               # placeholder of sampled row k: PLACEHOLDER_BASE + k
_PLACEHOLDER_END = PLACEHOLDER_BASE + (1 << 40)


def is_placeholder(token: int) -> bool:
    """Whether token stands for a token sampled by a step still in flight."""
    return token < _PLACEHOLDER_END


def settled_tokens(token_ids, start: int) -> list:
    """token_ids[start:] without the trailing placeholders of a step in flight (the tokens a reader may
    send on: what follows them is not sampled yet)."""
    new = list(token_ids[start:])
    while new and is_placeholder(new[-1]):
        new.pop()
    return new
