"""Request state shared by the engine and the simulator (torch-free).

A Sequence is one request as the scheduler sees it. Both backends use the same
field names, so per-request tables from a real run and from a simulation join on
`request_id` column for column.

Status machine::

    WAITING --admit--> RUNNING --finish--> FINISHED
       ^                 |  |
       |   (recompute)   |  +--swap out--> SWAPPED --swap in--> RUNNING
       +---- PREEMPTED <-+
    WAITING --reject--> REJECTED   (reason in `reject_reason`)
    WAITING / PREEMPTED / RUNNING / SWAPPED --abort--> ABORTED   (Scheduler.abort: the client gave up)
    PREEMPTED / SWAPPED --finish--> FINISHED   (overlap scheduling: the token of a step still in flight when
                                                 the sequence was preempted ends it; engine/core/in_flight.py)

A PREEMPTED sequence waits again for admission; its KV blocks were freed and it
re-prefills everything it had computed (prompt plus the outputs so far), which
the prefix cache may partly spare.
"""
from __future__ import annotations

import math
import numbers
from enum import Enum

DEFAULT_TENANT = "default"      # the tenant of a request whose workload names none


class SequenceStatus(Enum):
    WAITING = "waiting"
    RUNNING = "running"
    PREEMPTED = "preempted"
    SWAPPED = "swapped"
    FINISHED = "finished"
    REJECTED = "rejected"
    ABORTED = "aborted"


# Allowed transitions; anything else is a scheduler bug and raises.
_TRANSITIONS = {
    SequenceStatus.WAITING: {SequenceStatus.RUNNING, SequenceStatus.REJECTED, SequenceStatus.ABORTED},
    SequenceStatus.PREEMPTED: {SequenceStatus.RUNNING, SequenceStatus.REJECTED, SequenceStatus.ABORTED,
                               SequenceStatus.FINISHED},
    SequenceStatus.RUNNING: {SequenceStatus.PREEMPTED, SequenceStatus.SWAPPED, SequenceStatus.FINISHED,
                             SequenceStatus.ABORTED},
    SequenceStatus.SWAPPED: {SequenceStatus.RUNNING, SequenceStatus.ABORTED, SequenceStatus.FINISHED},
    SequenceStatus.FINISHED: set(),
    SequenceStatus.REJECTED: set(),
    SequenceStatus.ABORTED: set(),
}
# The same by name, for set_status (once per admission and per finish): an Enum member hashes by a Python call,
# its name's hash is cached.
_ALLOWED = {old.name: frozenset(new.name for new in to) for old, to in _TRANSITIONS.items()}


def _real(name: str, value) -> float:
    """value as a finite float, or a ValueError naming the field (NaN would pass every range check)."""
    if type(value) is not float and (isinstance(value, (bool, str)) or not isinstance(value, numbers.Real)):
        raise ValueError(f"SamplingParams.{name} must be a number, got {value!r}")
    value = float(value)
    if not math.isfinite(value):
        raise ValueError(f"SamplingParams.{name} must be a finite number, got {value!r}")
    return value


def _integer(name: str, value) -> int:
    """value as an int (an integral float such as 64.0 too), or a ValueError naming the field."""
    if type(value) is int:
        return value
    if isinstance(value, numbers.Integral) and not isinstance(value, bool):
        return int(value)
    if isinstance(value, numbers.Real) and not isinstance(value, bool) and math.isfinite(value) \
            and float(value).is_integer():
        return int(value)
    raise ValueError(f"SamplingParams.{name} must be an integer, got {value!r}")


# Temperatures below this sample greedily (vLLM's _SAMPLING_EPS): logits / T overflows float32 to inf below ~1e-37
# and the argmax of a row of infinities is token 0; well before that the draw is greedy but for exact ties.
GREEDY_BELOW = 1e-5


class SamplingParams:
    """How tokens are chosen and when a sequence stops.

    `max_tokens` is the output length cap; with `ignore_eos` the sequence
    produces exactly `max_tokens` tokens (what the simulator assumes and what
    experiments use by default). temperature == 0 means greedy; so does any below GREEDY_BELOW
    (`sample_temperature`, what the sampler uses: 0 there).
    """

    FIELDS = ("temperature", "top_k", "top_p", "max_tokens", "ignore_eos", "seed")
    __slots__ = (*FIELDS, "sample_temperature")

    def __init__(self, temperature: float = 1.0, top_k: int = 0, top_p: float = 1.0,
                 max_tokens: int = 64, ignore_eos: bool = False, seed: int | None = None):
        # Finite floats and ints as given (the simulator builds one SamplingParams per request) need no
        # conversion; anything else goes through the converters, which check and convert it. (A sum of two
        # finite floats that overflows only sends them the long way.)
        if not (type(temperature) is float and type(top_p) is float and type(top_k) is int
                and type(max_tokens) is int and math.isfinite(temperature + top_p)):
            temperature, top_p = _real("temperature", temperature), _real("top_p", top_p)
            top_k, max_tokens = _integer("top_k", top_k), _integer("max_tokens", max_tokens)
        if seed is not None:
            seed = _integer("seed", seed)
        if max_tokens < 1:
            raise ValueError(f"SamplingParams.max_tokens must be >= 1, got {max_tokens}")
        if temperature < 0:
            raise ValueError(f"SamplingParams.temperature must be >= 0 (0 = greedy), got {temperature}")
        if top_k < 0:
            raise ValueError(f"SamplingParams.top_k must be >= 0 (0 = off), got {top_k}")
        if not 0.0 < top_p <= 1.0:
            raise ValueError(f"SamplingParams.top_p must be in (0, 1], got {top_p}")
        self.temperature = temperature
        self.sample_temperature = temperature if temperature >= GREEDY_BELOW else 0.0    # once, not every step
        self.top_k = top_k
        self.top_p = top_p
        self.max_tokens = max_tokens
        self.ignore_eos = bool(ignore_eos)
        self.seed = seed

    def __repr__(self) -> str:
        fields = ", ".join(f"{k}={getattr(self, k)!r}" for k in self.FIELDS)
        return f"SamplingParams({fields})"


class Sequence:
    """One request: its tokens, progress, KV block table and timestamps.

    `token_ids` holds prompt then outputs. `num_computed_tokens` counts the
    leading tokens whose KV is in the cache (including prefix-cache hits); the
    scheduler advances it after each step. Times are seconds on the run's clock
    (simulated or wall), never read from the system clock here.
    """

    __slots__ = (
        "request_id", "arrival_time_s", "token_ids", "num_prompt_tokens",
        "num_computed_tokens", "num_cached_tokens", "max_output_tokens",
        "priority", "sampling_params", "eos_token_id", "status", "reject_reason",
        "block_table", "first_scheduled_time_s", "first_token_time_s",
        "finish_time_s", "num_preemptions", "num_swaps", "finish_reason",
        "last_token_time_s", "token_times_s", "admit_order", "extra", "block_hashes",
        "num_registered_blocks", "private_from", "private_key", "prefix_chain", "num_cpu_cached_tokens", "tenant",
        "ttft_slo_s", "tpot_slo_s",
    )

    def __init__(self, request_id, prompt_token_ids, sampling_params: SamplingParams | None = None,
                 arrival_time_s: float = 0.0, priority: int = 0, eos_token_id: int | None = None,
                 record_token_times: bool = False, tenant: str = DEFAULT_TENANT, ttft_slo_s: float | None = None,
                 tpot_slo_s: float | None = None):
        if len(prompt_token_ids) == 0:
            raise ValueError(f"request {request_id!r}: prompt_token_ids is empty; a request needs at least one "
                             "prompt token")
        self.request_id = request_id
        self.arrival_time_s = float(arrival_time_s)
        self.token_ids: list[int] = list(prompt_token_ids)
        self.num_prompt_tokens = len(self.token_ids)
        self.num_computed_tokens = 0
        self.num_cached_tokens = 0          # prompt tokens served by the prefix cache at first admission
        self.num_cpu_cached_tokens = 0      # of those, served by its CPU tier (loaded from host memory)
        self.sampling_params = sampling_params or SamplingParams()
        self.max_output_tokens = self.sampling_params.max_tokens
        self.priority = priority            # lower value = more important
        # Service class (engine.core.requests.RequestSpec): the client, and latency targets in seconds
        # (None = no target), read by SLO-aware and fair policies and written to the request table.
        self.tenant = tenant
        self.ttft_slo_s = ttft_slo_s
        self.tpot_slo_s = tpot_slo_s
        self.eos_token_id = eos_token_id
        self.status = SequenceStatus.WAITING
        self.reject_reason: str | None = None
        self.finish_reason: str | None = None   # "length" | "eos" | "abort"
        self.block_table: list[int] = []
        # Chained content hash of each full block of token_ids (prefix caching); survives
        # preemption so a recompute can find its own blocks again.
        self.block_hashes: list[int] = []
        self.num_registered_blocks = 0      # leading blocks of block_table already offered to the prefix cache
        # Tokens from private_from on are private: no other sequence ever has a block of equal content
        # there (a simulated request's own prompt stream and dummy outputs), so the block manager keys
        # those blocks by (sequence, block index) instead of hashing their tokens (engine.core.block_manager).
        # None (the engine, and any Sequence built by hand): every block is hashed by content.
        self.private_from: int | None = None
        self.private_key = 0                # block manager's: 0 until the private blocks get keys
        # (B, ids) names the shared part's content instead of its tokens: ids[j] >= 0 is equal for two
        # sequences exactly when their tokens [0, (j + 1) * B) are (the simulator's prefix-hash blocks);
        # the block manager then keys the blocks before private_from by it. None: hash their tokens.
        self.prefix_chain: tuple[int, list[int]] | None = None
        self.first_scheduled_time_s: float | None = None
        self.first_token_time_s: float | None = None
        self.last_token_time_s: float | None = None
        self.finish_time_s: float | None = None
        self.num_preemptions = 0
        self.num_swaps = 0
        self.admit_order = -1               # set by the scheduler on first admission
        # Per-token emission times (for inter-token latency); off by default to keep
        # million-request simulations lean.
        self.token_times_s: list[float] | None = [] if record_token_times else None
        self.extra: dict | None = None      # workload-specific facts (e.g. trace row), never read by the core

    # -- derived facts (cheap; used by policies and the cost model) --------------
    def __len__(self) -> int:
        return len(self.token_ids)

    @property
    def num_tokens(self) -> int:
        return len(self.token_ids)

    @property
    def num_output_tokens(self) -> int:
        return len(self.token_ids) - self.num_prompt_tokens

    @property
    def output_token_ids(self) -> list[int]:
        return self.token_ids[self.num_prompt_tokens:]

    @property
    def remaining_output_tokens(self) -> int:
        return self.max_output_tokens - self.num_output_tokens

    @property
    def num_uncomputed_tokens(self) -> int:
        """Known tokens whose KV is not cached yet: the whole prompt at first, 1 while decoding."""
        return len(self.token_ids) - self.num_computed_tokens

    @property
    def is_prefilling(self) -> bool:
        """True until the sequence is in plain decode (one uncomputed token after some output).

        A recompute after preemption is a prefill too: it re-computes prompt and outputs.
        """
        return len(self.token_ids) - self.num_computed_tokens > 1 or len(self.token_ids) == self.num_prompt_tokens

    @property
    def is_finished(self) -> bool:
        return self.status in (SequenceStatus.FINISHED, SequenceStatus.REJECTED, SequenceStatus.ABORTED)

    def set_status(self, new: SequenceStatus) -> None:
        if new._name_ not in _ALLOWED[self.status._name_]:
            raise RuntimeError(f"request {self.request_id!r}: illegal status change {self.status.name} -> {new.name}")
        self.status = new

    def __repr__(self) -> str:
        return (f"Sequence(id={self.request_id!r}, {self.status.name}, prompt={self.num_prompt_tokens}, "
                f"out={self.num_output_tokens}/{self.max_output_tokens}, computed={self.num_computed_tokens}, "
                f"blocks={len(self.block_table)})")
