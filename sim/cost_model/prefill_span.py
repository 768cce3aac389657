"""The prefill attention kernel's makespan: the keys its busiest program slot reads in one step.

    grid = PrefillSpanGrid.from_counts(num_sms=132, num_q_heads=16, num_kv_heads=8)   # Qwen3-0.6B on an H200
    grid.makespan_keys(num_entries=1, new_tokens=8192, context_tokens=8192)          # 37,376 keys

The kernel (engine/kernels/paged_prefill) runs one program per tile of `tile_tokens` query tokens of
one entry and one KV head; a program walks its keys `block_keys` at a time, tile i of an entry with n new
tokens on c keys reading c - n + tile_tokens * (i + 1) of them (the causal limit of its last token). The
GPU places programs in launch order (grid x, the tiles, fastest; then the KV heads) on `slots` resident
programs (SMs x programs per SM), each on the slot that frees first. So the step's attention lasts the
greedy list schedule's makespan: one serial walk over the longest context when the programs fit in the
slots (a short chunk on a long cached prefix), and the spread work plus a tail when they do not; between
those two bounds, max(spread, walk) priced a 2k-token prompt 0.93 of its H200 device time and an 8k one
1.03 (benchmarks/results/generalize/device_swap/). A program's fixed work (loads, the epilogue) counts
as one key block.

A grid with `ragged_entries` (fits made since) schedules each entry's own programs, longest entry first (the
launch order is not recorded, and the table form must price a step as the batch form does): the simulator passes the
step's entries, and a step table row, which keeps sums only, is read as its longest entry beside k - 1 equal
others (`table_entries`: for fresh prompts the longest is its whole context; with cached prefixes its new tokens
are the ones that give the row's recorded query-key pairs), exact for two entries and for equal ones. Priced as k
equal entries of the mean (a grid without it, files fitted before), two fresh prompts of 6k and 1.5k tokens read
three quarters of their keys, and the H200 replays' steps of 2-6 fresh prompts were priced 0.84-0.95 of their
device seconds.
"""
from __future__ import annotations

import heapq
from dataclasses import dataclass
from functools import lru_cache
from typing import Mapping

import numpy as np

PREFILL_BLOCK_M = 64          # engine/kernels/paged_prefill.paged_prefill_attention's block_m (query rows a program)
PREFILL_BLOCK_N = 64          # its block_n: keys a program reads per iteration
PREFILL_PROGRAMS_PER_SM = 2   # its 64 x 64 tiles, 2 stages: ~80 KB of shared memory a program, two fit an H200 SM


@dataclass(frozen=True)
class PrefillSpanGrid:
    slots: int                # programs resident at once (SMs x PREFILL_PROGRAMS_PER_SM)
    num_kv_heads: int         # programs per tile (grid y)
    tile_tokens: int          # query tokens a program owns (block_m // query heads per KV head)
    block_keys: int = PREFILL_BLOCK_N
    programs_per_sm: int = PREFILL_PROGRAMS_PER_SM   # slots an SM holds: slots // this is the SM count
    ragged_entries: bool = False   # each entry's own programs (module docstring); False: k equal mean entries

    def __post_init__(self):
        for name in ("slots", "num_kv_heads", "tile_tokens", "block_keys", "programs_per_sm"):
            if int(getattr(self, name)) < 1:
                raise ValueError(f"prefill_span_grid.{name} must be >= 1, got {getattr(self, name)}")

    @classmethod
    def from_counts(cls, num_sms: int | None, num_q_heads: int | None,
                    num_kv_heads: int | None) -> "PrefillSpanGrid | None":
        """The grid of a GPU and model (None when a count is unknown)."""
        if not num_sms or not num_q_heads or not num_kv_heads:
            return None
        group = int(num_q_heads) // int(num_kv_heads)
        block_m = max(PREFILL_BLOCK_M, 16, 1 << max(group - 1, 0).bit_length())
        return cls(int(num_sms) * PREFILL_PROGRAMS_PER_SM, int(num_kv_heads), block_m // group, ragged_entries=True)

    @classmethod
    def from_dict(cls, data: Mapping) -> "PrefillSpanGrid":
        return cls(int(data["slots"]), int(data["num_kv_heads"]), int(data["tile_tokens"]),
                   int(data.get("block_keys", PREFILL_BLOCK_N)),
                   int(data.get("programs_per_sm", PREFILL_PROGRAMS_PER_SM)),
                   bool(data.get("ragged_entries", False)))

    def to_dict(self) -> dict:
        return {"slots": self.slots, "num_kv_heads": self.num_kv_heads, "tile_tokens": self.tile_tokens,
                "block_keys": self.block_keys, "programs_per_sm": self.programs_per_sm,
                "ragged_entries": self.ragged_entries}

    @property
    def num_sms(self) -> int:
        return max(1, self.slots // self.programs_per_sm)

    def programs(self, num_entries: int, new_tokens: float) -> int:
        """Programs the kernel launches for num_entries equal entries holding new_tokens new tokens in all."""
        if num_entries < 1 or new_tokens < 1:
            return 0
        n = max(1, int(round(new_tokens / num_entries)))
        return int(num_entries) * -(-n // self.tile_tokens) * self.num_kv_heads

    def runs_alone(self, num_entries: int, new_tokens: float) -> bool:
        """Whether every program has an SM to itself (at most one program per SM): such a program reads its keys
        faster than one sharing its SM's bandwidth and pipelines with a second (H200, Qwen3-0.6B: a 512-token chunk
        on 16k cached keys, 128 programs, walks 0.90x the time per key of a 1,024-token one, 256 programs), so its
        keys are priced by their own coefficient, prefill_attention_span_alone."""
        return 0 < self.programs(num_entries, new_tokens) <= self.num_sms

    def makespan_keys(self, num_entries: int, new_tokens: float, context_tokens: float,
                      longest_context: float | None = None) -> float:
        """Keys the busiest slot reads in a step of num_entries prefill entries holding new_tokens new tokens and
        context_tokens keys (cached + new) in all, priced as equal entries (module docstring); 0 for none.
        longest_context (the longest entry's keys, engine.core.recorder's max_prefill_context_tokens): when every
        program is resident, the step lasts that entry's walk, not the mean entry's (a 100-token tail on 4k cached
        keys beside a fresh 400-token prompt reads 4k keys, not their mean's 2.2k)."""
        return self.span(num_entries, new_tokens, context_tokens, longest_context)[0]

    def span(self, num_entries: int, new_tokens: float, context_tokens: float,
             longest_context: float | None = None) -> tuple[float, bool]:
        """(makespan_keys, runs_alone) of one step, its programs counted once (the simulator prices every step)."""
        programs = self.programs(num_entries, new_tokens)
        if not programs:
            return 0.0, False
        k = int(num_entries)
        if longest_context is not None and longest_context >= 1 and programs <= self.slots:
            keys = (-(-int(longest_context) // self.block_keys) + 1) * self.block_keys
        else:
            keys = _makespan(self, k, *_equal_entry(k, new_tokens, context_tokens))
        return float(keys), programs <= self.num_sms

    def span_entries(self, new_tokens, context_tokens) -> tuple[float, bool]:
        """(makespan_keys, runs_alone) of one step from its entries' own new tokens and contexts (cached + new):
        with ragged_entries each entry's programs, else span() of their sums (the rule the grid was fitted with)."""
        k = len(new_tokens)
        if not k:
            return 0.0, False
        if k == 1 or not self.ragged_entries:
            return self.span(k, sum(new_tokens), sum(context_tokens), max(context_tokens))
        t, longest = self.tile_tokens, max(context_tokens)
        programs = sum(-(-int(n) // t) for n in new_tokens) * self.num_kv_heads
        if programs > self.slots:
            return float(_makespan_ragged(self, tuple(_longest_first(new_tokens, context_tokens)))), False
        # every program resident: the longest entry's walk, alone on its SM where the programs of long walks (half
        # the longest or more) fit one an SM (a short entry's programs beside them finish early: on the H200 a
        # 300-token tail on 6k cached keys beside a fresh 212-token prompt, 136 programs, walked as one alone)
        keys = (-(-int(longest) // self.block_keys) + 1) * self.block_keys
        long_programs = sum(-(-int(n) // t) for n, c in zip(new_tokens, context_tokens)
                            if 2 * c >= longest) * self.num_kv_heads
        return float(keys), long_programs <= self.num_sms

    def riding_walk_keys(self, new_tokens, context_tokens, decode_contexts, key_scale: float = 1.0,
                         alone_keys: float | None = None) -> float:
        """Keys (a prefill program's) by which a step's riding decodes lengthen the prefill kernel's makespan (module
        docstring): a step run from a padded prefill graph launches each decode as an entry of one query row, one
        program per KV head after the prefill entries' programs of that head, walking its whole context at key_scale
        times a prefill program's time per key; 0 when they run beside the prefill programs and end first.
        new_tokens, context_tokens: the prefill entries' (as span_entries); decode_contexts: the decodes' keys;
        alone_keys: span_entries(new_tokens, context_tokens)'s keys where the caller has them already."""
        if not len(decode_contexts) or not len(new_tokens):
            return 0.0
        if alone_keys is None:
            alone_keys = self.span_entries(new_tokens, context_tokens)[0]
        k = len(new_tokens)
        entries = _longest_first(new_tokens, context_tokens) if self.ragged_entries \
            else [_equal_entry(k, sum(new_tokens), sum(context_tokens))] * k
        work = (*map(float, _tile_work(entries, self.tile_tokens, self.block_keys)),
                *(key_scale * (-(-int(d) // self.block_keys) + 1) for d in sorted(decode_contexts, reverse=True)))
        return max(_riding_schedule(self.slots, self.num_kv_heads, work) * self.block_keys - alone_keys, 0.0)


def _equal_entry(k: int, new_tokens: float, context_tokens: float) -> tuple[int, int]:
    """(new tokens, keys) of one of k equal entries holding new_tokens and context_tokens in all (at least 1 new
    token, and never fewer keys than new tokens)."""
    n = max(1, int(round(new_tokens / k)))
    return n, max(n, int(round(context_tokens / k)))


def _longest_first(new_tokens, context_tokens) -> list[tuple[int, int]]:
    """[(new tokens, keys)] of the entries, longest context first: the order a step table row gives back
    (table_entries), so that the fit's table form and the simulator's batch form price a step alike (the launch
    order is not recorded)."""
    return sorted(zip(map(int, new_tokens), map(int, context_tokens)), key=lambda e: (-e[1], -e[0]))


def table_entries(k: int, new_tokens: float, context_tokens: float, longest_context: float,
                  pairs: float) -> tuple[list[int], list[int]]:
    """([k] new tokens, [k] contexts) of a step table row's prefill entries: its longest entry (longest_context
    keys) and k - 1 equal others of the rest, the longest entry's new tokens all its keys where every entry is
    fresh (contexts sum to the new tokens), else those whose query-key pairs (n c - n (n - 1) / 2 an entry, as
    engine.core.recorder sums them) bring the row's total closest to `pairs`."""
    k, n_sum, c_sum, big = int(k), int(round(new_tokens)), int(round(context_tokens)), int(round(longest_context))
    if k == 1:
        return [n_sum], [c_sum]
    rest_c = (c_sum - big) / (k - 1)
    if c_sum == n_sum:
        n_big = big
    else:
        cand = np.arange(1, max(1, min(big, n_sum - (k - 1))) + 1, dtype=np.float64)
        rest_n = (n_sum - cand) / (k - 1)
        est = cand * big - cand * (cand - 1) / 2 + (k - 1) * (rest_n * rest_c - rest_n * (rest_n - 1) / 2)
        est = np.where(rest_n <= rest_c + 1e-9, est, np.inf)       # an entry holds no more new tokens than keys
        n_big = int(cand[int(np.argmin(np.abs(est - pairs)))]) if np.isfinite(est).any() else n_sum // k
    n_rest, c_rest = _split(n_sum - n_big, k - 1), _split(c_sum - big, k - 1)
    return [n_big, *n_rest], [big, *(max(c, n) for c, n in zip(c_rest, n_rest))]


def _split(total: int, parts: int) -> list[int]:
    """total as `parts` integers differing by at most 1 (the larger first), each >= 1."""
    q, r = divmod(max(int(total), parts), parts)
    return [q + 1] * r + [q] * (parts - r)


def _tile_work(entries, t: int, b: int) -> list[int]:
    """[programs of one KV head] key blocks of the tiles of entries ((new tokens, keys) each) in launch order: tile i
    of an entry of n new tokens on c keys reads c - n + t (i + 1) keys (its last token's causal limit), +1 block for a
    program's fixed work."""
    return [-(-(c - n + min(t * (i + 1), n)) // b) + 1 for n, c in entries for i in range(-(-n // t))]


def _list_schedule(slots: int, copies: int, work: tuple) -> float:
    """Greedy list schedule, in key blocks, of `copies` runs of work in turn (the KV heads, or equal entries times
    the heads), each program on the slot that frees first. The first `slots` start at once, each on a slot of its
    own (all resident: the longest walk); only the rest pass through the heap."""
    jobs = work * copies
    free = list(jobs[:slots])
    heapq.heapify(free)
    for w in jobs[slots:]:
        heapq.heapreplace(free, free[0] + w)
    return max(free)


# riding_walk_keys' schedules: keys of up to ~300 floats (a chunk's tiles and its decodes), ~40 MB at most
_riding_schedule = lru_cache(maxsize=4096)(_list_schedule)


@lru_cache(maxsize=65536)
def _makespan_ragged(grid: PrefillSpanGrid, entries: tuple[tuple[int, int], ...]) -> int:
    """Greedy list schedule of the programs of entries ((new tokens, keys) each) in launch order, in keys: the
    tiles of every entry in turn (grid x), then the KV heads."""
    work = tuple(_tile_work(entries, grid.tile_tokens, grid.block_keys))
    return _list_schedule(grid.slots, grid.num_kv_heads, work) * grid.block_keys


def riding_decode_contexts(num_decodes: int, decode_context_sum: float, longest: float) -> list[int]:
    """[num_decodes] keys of a step's riding decodes as a step table row keeps them (sums and the longest): the
    longest and num_decodes - 1 equal others of the rest (the simulator prices its batches by the same rule, so
    that the fit's table form and its batch form agree)."""
    nd = int(num_decodes)
    if nd < 1:
        return []
    big = int(round(min(max(longest, 1.0), decode_context_sum)))
    return [big] if nd == 1 else [big, *_split(int(round(decode_context_sum)) - big, nd - 1)]


@lru_cache(maxsize=65536)
def _makespan(grid: PrefillSpanGrid, k: int, n: int, c: int) -> int:
    """Greedy list schedule of k entries of n new tokens on c keys, in keys (grid.block_keys a work unit)."""
    # one entry's tiles; the entries and the heads repeat them
    work = tuple(_tile_work([(n, c)], grid.tile_tokens, grid.block_keys))
    return _list_schedule(grid.slots, k * grid.num_kv_heads, work) * grid.block_keys


def table_makespan_keys(num_prefill_seqs, num_prefill_tokens, prefill_context_sum,
                        grid: PrefillSpanGrid, max_prefill_context_tokens=None,
                        prefill_attention_pairs=None) -> tuple[np.ndarray, np.ndarray]:
    """([rows] makespan_keys of each step table row whose programs share SMs, [rows] of each row whose programs
    each have an SM to itself (PrefillSpanGrid.runs_alone)); both 0 on rows without prefill entries.
    max_prefill_context_tokens: [rows] each row's longest entry (NaN or None: unknown, the mean's walk).
    prefill_attention_pairs: [rows] (a ragged_entries grid reads rows of several entries with it and the
    longest context as table_entries does; None or NaN: k equal entries)."""
    k, n, c = (np.asarray(a, dtype=np.float64) for a in (num_prefill_seqs, num_prefill_tokens, prefill_context_sum))
    longest = np.full(len(k), np.nan) if max_prefill_context_tokens is None \
        else np.asarray(max_prefill_context_tokens, dtype=np.float64)
    shared, alone = np.zeros(len(k)), np.zeros(len(k))
    pairs = np.full(len(k), np.nan) if prefill_attention_pairs is None \
        else np.asarray(prefill_attention_pairs, dtype=np.float64)
    for i in np.nonzero(k > 0)[0]:
        if grid.ragged_entries and k[i] > 1 and np.isfinite(longest[i]) and np.isfinite(pairs[i]):
            keys, lone = grid.span_entries(*table_entries(k[i], n[i], c[i], longest[i], pairs[i]))
        else:
            keys, lone = grid.span(int(k[i]), n[i], c[i], None if np.isnan(longest[i]) else longest[i])
        (alone if lone else shared)[i] = keys
    return shared, alone


def table_riding_walk_keys(steps, grid: PrefillSpanGrid, riding: np.ndarray, key_scale: float) -> np.ndarray:
    """[rows] PrefillSpanGrid.riding_walk_keys of each step table row marked `riding` (0 elsewhere): its prefill
    entries as table_makespan_keys reads them, its decodes as riding_decode_contexts (longest
    max_decode_context_tokens; the mean where a table lacks it)."""
    def col(name):
        return np.asarray(steps[name], dtype=np.float64) if name in steps else np.full(len(riding), np.nan)
    k, n, c = col("num_prefill_seqs"), col("num_prefill_tokens"), col("prefill_context_sum")
    longest, pairs = col("max_prefill_context_tokens"), col("prefill_attention_pairs")
    nd, dsum, dmax = col("num_decode_seqs"), col("decode_context_sum"), col("max_decode_context_tokens")
    out = np.zeros(len(riding))
    for i in np.nonzero(riding)[0]:
        if grid.ragged_entries and k[i] > 1 and np.isfinite(longest[i]) and np.isfinite(pairs[i]):
            new, ctx = table_entries(k[i], n[i], c[i], longest[i], pairs[i])
        else:
            new, ctx = [n[i] / k[i]] * int(k[i]), [c[i] / k[i]] * int(k[i])
            if np.isfinite(longest[i]):
                ctx[0] = longest[i]
        top = dmax[i] if np.isfinite(dmax[i]) and dmax[i] > 0 else dsum[i] / nd[i]
        out[i] = grid.riding_walk_keys(new, ctx, riding_decode_contexts(nd[i], dsum[i], top), key_scale)
    return out
