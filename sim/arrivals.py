"""Arrivals: light request specs in, Sequences out, one request at a time.

A run's requests are RequestSpecs (engine.core.requests: a few numbers per
request) or prebuilt engine Sequences. Specs become Sequences only when the
request arrives, so a million-request run holds only the requests in flight.
Prompt ids matter only to the prefix cache. `prompts` says how a spec gets them:

  "hashed"   every token from `prompt_token_ids`, every block hashed by content;
  "private"  the same cache decisions, cheaper: no token is made (all are 0). The
             tokens past the spec's prefix blocks (`prefix_hash_ids`, the only ones
             another request can share) are private (`Sequence.private_from`): the
             block manager keys their blocks by (request, block) instead of hashing
             them; the shared part is keyed by `Sequence.prefix_chain`, one id per
             distinct sequence of leading hash ids (equal ids, equal tokens: what
             prompt_token_ids makes of them). Needs unique non-negative int request
             ids (their dummy outputs differ) and a vocabulary where two blocks of
             different streams never match by chance (vocab_size ** block_size >=
             2**64; the Simulator checks);
  "zeros"    every token 0 (without a prefix cache nothing reads token values).

The simulator "samples" one dummy token per request, `dummy_token_id(request_id)`,
for every output position (step-by-step and fast path alike). It is negative, so
it never equals a prompt token or an eos id, and it differs between requests, so
the outputs of unrelated requests never look like a shared prefix to the cache.
"""
from __future__ import annotations

import zlib
from collections import namedtuple
from dataclasses import fields
from functools import partial
from typing import Iterable, Iterator

from engine.core.requests import RequestSpec, Workload, prompt_token_ids
from engine.core.sequence import SamplingParams, Sequence

# A RequestSpec's fields as a named tuple: what materialize reads of a workload's request (its attributes).
_SpecRow = namedtuple("_SpecRow", [f.name for f in fields(RequestSpec)])


def dummy_token_id(request_id) -> int:
    """-1 - id for non-negative int ids; a crc32 of the id's text (below -2**40) otherwise."""
    if type(request_id) is int and request_id >= 0:
        return -1 - request_id
    return -(1 << 40) - zlib.crc32(str(request_id).encode())


def token_of(seq: Sequence) -> int:
    return dummy_token_id(seq.request_id)


def negative_id_token(seq: Sequence) -> int:
    """token_of for a sequence whose id is a non-negative int (dummy_token_id's first case, unchecked)."""
    return -1 - seq.request_id


def check_sequence(seq: Sequence) -> None:
    if seq.arrival_time_s < 0:
        raise ValueError(f"request {seq.request_id!r}: arrival_time_s must be >= 0, got {seq.arrival_time_s}")
    if seq.eos_token_id is not None and not seq.sampling_params.ignore_eos:
        raise ValueError(f"request {seq.request_id!r}: the simulator runs every request to max_tokens, so an "
                         f"eos_token_id ({seq.eos_token_id}) would never be honoured; set "
                         "SamplingParams(ignore_eos=True) or eos_token_id=None")


class Arrivals:
    """The run's requests in arrival order (stable for equal times), materialized on demand.

    requests: an experiments.workloads Workload (already sorted; iterated lazily),
    or any iterable of RequestSpec and/or Sequence (listed and sorted here).
    """

    def __init__(self, requests, vocab_size: int = 151936, prompt_seed: int = 0, prompts: str = "hashed"):
        if vocab_size < 2:
            raise ValueError(f"vocab_size must be >= 2, got {vocab_size}")
        if prompts not in PROMPTS:
            raise ValueError(f"prompts must be one of {PROMPTS}, got {prompts!r}")
        self.vocab_size = int(vocab_size)
        self.prompt_seed = int(prompt_seed)
        self.prompts = prompts
        self._chains: dict = {}             # (parent chain id, hash id) -> chain id; roots (-B, hash id)
        self.all_sequences = False          # True when every request came prebuilt
        self._rows = isinstance(requests, Workload)        # iterate it as _SpecRows
        if self._rows:
            self._items: Iterable = requests
            self.num_requests = len(requests)
        else:
            items = list(requests)
            for x in items:
                if not hasattr(x, "arrival_time_s") or not hasattr(x, "request_id"):
                    raise TypeError(f"requests must be RequestSpec or Sequence objects, got {type(x).__name__}")
            items.sort(key=_arrival)
            self._items = items
            self.num_requests = len(items)
            self.all_sequences = all(isinstance(x, Sequence) for x in items)
            if prompts == "private" and not _unique_int_ids(items):
                self.prompts = "hashed"     # equal ids would give equal private streams: hash them

    def __iter__(self) -> Iterator:
        if self._rows:
            # A workload's rows as _SpecRows, built by tuple.__new__ directly (no Python call per request:
            # a frozen dataclass sets its fields one object.__setattr__ at a time).
            return map(partial(tuple.__new__, _SpecRow), self._items.spec_rows())
        return iter(self._items)

    def materialize(self, item) -> Sequence:
        if isinstance(item, Sequence):
            check_sequence(item)
            return item
        if item.arrival_time_s < 0:
            raise ValueError(f"request {item.request_id!r}: arrival_time_s must be >= 0, got {item.arrival_time_s}")
        if item.num_output_tokens < 1:
            raise ValueError(f"request {item.request_id!r}: num_output_tokens must be >= 1, "
                             f"got {item.num_output_tokens}")
        n = item.num_prompt_tokens
        if n < 1:
            raise ValueError(f"request {item.request_id!r}: num_prompt_tokens must be >= 1, got {n}")
        prompts = self.prompts
        if prompts == "hashed":
            prompt = prompt_token_ids(item, self.vocab_size, self.prompt_seed)
        else:
            prompt = [0] * n
        seq = Sequence(item.request_id, prompt, SamplingParams(max_tokens=item.num_output_tokens, ignore_eos=True),
                       arrival_time_s=item.arrival_time_s, priority=item.priority, tenant=item.tenant,
                       ttft_slo_s=item.ttft_slo_s, tpot_slo_s=item.tpot_slo_s)
        if prompts == "private":
            hashes = item.prefix_hash_ids
            seq.private_from = 0
            if hashes:
                b = int(item.prefix_block_tokens)
                used = hashes[:-(-n // b)]              # the prefix blocks the prompt reaches
                seq.private_from = min(n, len(used) * b)
                seq.prefix_chain = (b, self._chain_ids(b, used))
        return seq

    def _chain_ids(self, block_tokens: int, hash_ids) -> list[int]:
        """One id per leading prefix of hash_ids: equal ids <=> equal hash ids up to there."""
        chains = self._chains
        ids = []
        parent = -block_tokens
        for h in hash_ids:
            key = (parent, h)
            parent = chains.get(key)
            if parent is None:
                parent = chains[key] = len(chains)
            ids.append(parent)
        return ids


PROMPTS = ("hashed", "private", "zeros")


def private_blocks_exact(vocab_size: int, block_size: int) -> bool:
    """Whether two blocks of independent token streams match only with probability <= 2**-64, as
    two different 64-bit content hashes do: then keying private blocks by (request, block) gives
    the hits of hashing them."""
    return vocab_size ** block_size >= 1 << 64


def _unique_int_ids(items) -> bool:
    ids = [x.request_id for x in items]
    return all(type(i) is int and i >= 0 for i in ids) and len(set(ids)) == len(ids)


def _arrival(x) -> float:
    return x.arrival_time_s
