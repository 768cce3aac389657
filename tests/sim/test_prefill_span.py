"""The prefill kernel's makespan (sim/cost_model/prefill_span.py): an exact hand-built schedule, equality with an
independent event-by-event list schedule, the resident case (one walk), the equal-entries rule of a step table,
and the grid of the engine's kernel."""
import inspect
import math

import numpy as np
import pytest

from sim.cost_model.prefill_span import (
    PREFILL_BLOCK_M,
    PREFILL_BLOCK_N,
    PREFILL_PROGRAMS_PER_SM,
    PrefillSpanGrid,
    riding_decode_contexts,
    table_entries,
    table_makespan_keys,
    table_riding_walk_keys,
)


def _reference(grid, entries, decodes=(), scale=1.0):
    """The list schedule written out: programs in launch order (tiles fastest, then heads), each on the slot
    that frees first (the lowest-numbered among ties), finishing at its start plus its key blocks; decodes (their
    keys) one program a head after the entries' tiles, scale times a block each."""
    work = []
    for n, c in entries:
        work += [math.ceil((c - n + min(grid.tile_tokens * (i + 1), n)) / grid.block_keys) + 1
                 for i in range(math.ceil(n / grid.tile_tokens))]
    work += [scale * (math.ceil(d / grid.block_keys) + 1) for d in decodes]
    free_at = [0] * grid.slots
    end = 0
    for _ in range(grid.num_kv_heads):
        for w in work:
            s = min(range(grid.slots), key=lambda j: (free_at[j], j))
            free_at[s] += w
            end = max(end, free_at[s])
    return end * grid.block_keys


def test_a_hand_built_schedule():
    """2 slots, 2 heads, 2-token tiles, 1 key a block: 4 new tokens on 4 keys are tiles of 2 + 1 and 4 + 1 key
    blocks per head. Launch order 3, 5, 3, 5: slot A runs 3 then 3 (ends 6), slot B 5 then 5 (ends 10)."""
    grid = PrefillSpanGrid(slots=2, num_kv_heads=2, tile_tokens=2, block_keys=1)
    assert grid.makespan_keys(1, 4, 4) == 10
    # one head: both programs resident at once, the longest walk sets it
    assert PrefillSpanGrid(slots=2, num_kv_heads=1, tile_tokens=2, block_keys=1).makespan_keys(1, 4, 4) == 5
    assert grid.makespan_keys(0, 0, 0) == 0 and grid.makespan_keys(1, 0, 5) == 0


def test_matches_an_independent_list_schedule():
    rng = np.random.default_rng(0)
    for _ in range(60):
        grid = PrefillSpanGrid(int(rng.integers(1, 12)), int(rng.integers(1, 4)), int(rng.integers(1, 9)),
                               int(rng.integers(1, 9)))
        k, n = int(rng.integers(1, 4)), int(rng.integers(1, 60))
        c = n + int(rng.integers(0, 80))
        assert grid.makespan_keys(k, k * n, k * c) == _reference(grid, [(n, c)] * k), (grid, k, n, c)


def test_between_the_spread_and_the_walk():
    """Qwen3-0.6B on an H200: a short chunk on a long cached prefix is one walk (its programs all resident); a
    long prompt's makespan lies between its work spread over the slots and that plus the longest walk."""
    grid = PrefillSpanGrid.from_counts(num_sms=132, num_q_heads=16, num_kv_heads=8)
    assert grid == PrefillSpanGrid(slots=264, num_kv_heads=8, tile_tokens=32, block_keys=64, programs_per_sm=2,
                                   ragged_entries=True)
    assert grid.makespan_keys(1, 512, 8192) == 8192 + 64             # 128 programs <= 264 slots
    assert grid.num_sms == 132 and grid.programs(1, 512) == 128 and grid.runs_alone(1, 512)   # one an SM
    assert grid.programs(1, 1024) == 256 and not grid.runs_alone(1, 1024)                    # two share one
    assert not grid.runs_alone(0, 0) and not grid.runs_alone(2, 1024)
    span = grid.makespan_keys(1, 8192, 8192)
    work = 8 * sum(math.ceil(32 * (i + 1) / 64) + 1 for i in range(256)) * 64
    assert work / 264 < span < work / 264 + 8192 + 64
    assert span == 37376


def test_a_table_prices_a_steps_entries_as_equal_ones():
    grid = PrefillSpanGrid(slots=16, num_kv_heads=2, tile_tokens=4, block_keys=8)
    shared, alone = table_makespan_keys([0, 1, 3, 2, 1], [0, 100, 300, 101, 8], [0, 150, 600, 151, 40], grid)
    assert list(shared + alone) == [0, grid.makespan_keys(1, 100, 150), _reference(grid, [(100, 200)] * 3),
                                    _reference(grid, [(50, 76)] * 2), grid.makespan_keys(1, 8, 40)]
    # 8 new tokens: 2 tiles x 2 heads = 4 programs on 16 // 2 = 8 SMs, each alone; the rest share SMs
    assert list(alone) == [0, 0, 0, 0, grid.makespan_keys(1, 8, 40)] and shared[4] == 0
    with pytest.raises(ValueError, match="prefill_span_grid.slots"):
        PrefillSpanGrid(slots=0, num_kv_heads=1, tile_tokens=1)
    assert PrefillSpanGrid.from_counts(None, 16, 8) is None
    assert PrefillSpanGrid.from_dict(grid.to_dict()) == grid


def test_the_grid_follows_the_prefill_kernel():
    """The kernel's own defaults: block_m and block_n, and tiles of block_m // group query tokens per KV head."""
    from engine.kernels.paged_prefill import paged_prefill_attention
    params = inspect.signature(paged_prefill_attention).parameters
    assert params["block_m"].default == PREFILL_BLOCK_M and params["block_n"].default == PREFILL_BLOCK_N
    assert PrefillSpanGrid.from_counts(132, 32, 8).tile_tokens == 16
    assert PrefillSpanGrid.from_counts(132, 24, 8).tile_tokens == 21          # 64 // 3 tokens
    assert PrefillSpanGrid.from_counts(100, 16, 8).slots == 100 * PREFILL_PROGRAMS_PER_SM


def test_resident_programs_walk_the_longest_entry():
    """Given the longest entry's keys, a step whose programs are all resident lasts that entry's walk; one whose
    programs queue keeps the equal-entries schedule."""
    grid = PrefillSpanGrid(slots=264, num_kv_heads=8, tile_tokens=32, block_keys=64)
    assert grid.makespan_keys(2, 500, 4696) == grid.makespan_keys(2, 500, 4696, None) == (37 + 1) * 64
    assert grid.makespan_keys(2, 500, 4696, longest_context=4196) == (66 + 1) * 64
    assert grid.makespan_keys(2, 8192, 16384, longest_context=12000) == grid.makespan_keys(2, 8192, 16384)


def _pairs(entries):
    return sum(n * c - n * (n - 1) // 2 for n, c in entries)


def test_ragged_entries_schedule_each_entrys_own_programs():
    """A ragged_entries grid schedules the step's own entries (equal to the written-out list schedule where the
    programs queue, the longest walk where they are all resident) and prices equal entries as span() does; a grid
    without it (files fitted before) keeps the equal-entries rule whatever the entries."""
    rng = np.random.default_rng(1)
    for _ in range(80):
        grid = PrefillSpanGrid(int(rng.integers(1, 12)), int(rng.integers(1, 4)), int(rng.integers(1, 9)),
                               int(rng.integers(1, 9)), ragged_entries=True)
        entries = [(n, n + int(rng.integers(0, 80))) for n in rng.integers(1, 60, size=int(rng.integers(2, 5)))]
        n, c = [e[0] for e in entries], [e[1] for e in entries]
        keys, _ = grid.span_entries(n, c)
        programs = sum(-(-x // grid.tile_tokens) for x in n) * grid.num_kv_heads
        longest_first = sorted(entries, key=lambda e: (-e[1], -e[0]))      # the table's order, whatever the batch's
        want = _reference(grid, longest_first) if programs > grid.slots \
            else (-(-max(c) // grid.block_keys) + 1) * grid.block_keys
        assert keys == want, (grid, entries)
        assert grid.span_entries(n[::-1], c[::-1])[0] == keys                # the same step in any order
        assert grid.span_entries([n[0]] * 3, [c[0]] * 3) == grid.span(3, 3 * n[0], 3 * c[0], c[0])
        old = PrefillSpanGrid(grid.slots, grid.num_kv_heads, grid.tile_tokens, grid.block_keys)
        assert old.span_entries(n, c) == old.span(len(n), sum(n), sum(c), max(c))
    # H200, Qwen3-0.6B: fresh prompts of 6,000 and 1,500 tokens read more than two equal ones of 3,750
    h200 = PrefillSpanGrid.from_counts(num_sms=132, num_q_heads=16, num_kv_heads=8)
    ragged, _ = h200.span_entries([6000, 1500], [6000, 1500])
    assert ragged == _reference(h200, [(6000, 6000), (1500, 1500)]) > h200.makespan_keys(2, 7500, 7500) * 1.2


def test_resident_long_walks_alone_beside_a_short_entry():
    """A 300-token tail on 6k cached keys beside a fresh 212-token prompt: 136 programs on 132 SMs, but the
    long walks (80 programs) have an SM each, so the step walks alone; two long walks of 128 programs do not."""
    h200 = PrefillSpanGrid.from_counts(num_sms=132, num_q_heads=16, num_kv_heads=8)
    assert h200.span_entries([300, 212], [6300, 212]) == ((99 + 1) * 64, True)
    assert h200.span_entries([300, 300], [6300, 6000]) == ((99 + 1) * 64, False)


def test_a_table_row_is_read_as_its_longest_entry_and_equal_others():
    """table_entries gives back two entries exactly (fresh ones from the longest context, cached ones from the
    query-key pairs) and equal ones of any count; a ragged_entries grid prices such rows as their entries."""
    for entries in ([(6000, 6000), (1500, 1500)], [(300, 6300), (212, 212)], [(100, 4196), (400, 400)],
                    [(256, 2304)] * 3, [(50, 50)] * 4, [(512, 512), (512, 8704)]):
        n, c = [e[0] for e in entries], [e[1] for e in entries]
        got = table_entries(len(entries), sum(n), sum(c), max(c), _pairs(entries))
        assert sorted(zip(*got)) == sorted(entries), entries
    grid = PrefillSpanGrid.from_counts(num_sms=132, num_q_heads=16, num_kv_heads=8)
    rows = [[(6000, 6000), (1500, 1500)], [(300, 6300), (212, 212)], [(4000, 4000)]]
    shared, alone = table_makespan_keys([len(r) for r in rows], [sum(e[0] for e in r) for r in rows],
                                        [sum(e[1] for e in r) for r in rows], grid,
                                        [max(e[1] for e in r) for r in rows], [_pairs(r) for r in rows])
    want = [grid.span_entries([e[0] for e in r], [e[1] for e in r]) for r in rows]
    assert list(shared + alone) == [k for k, _ in want] and [a > 0 for a in alone] == [lone for _, lone in want]
    # without the pairs (a table that lacks them) the row keeps the equal-entries rule
    shared, alone = table_makespan_keys([2], [7500], [7500], grid, [6000])
    assert shared[0] + alone[0] == grid.span(2, 7500, 7500, 6000)[0]


def test_riding_decodes_lengthen_the_makespan_by_their_walk_or_their_queue():
    """riding_walk_keys: the makespan with the decodes' programs after the chunk's, less the chunk's own. 4 slots,
    1 head, 2-token tiles, 1 key a block: a 4-token chunk on 4 keys is 3 + 5 blocks; a decode of 6 keys (7 blocks)
    beside it walks 2 past it, two of 6 at 1.5x run 10.5 blocks each: 5.5 past it. Five decodes of 2 keys (3 blocks)
    outnumber the 2 free slots: three of them wait for the first to end (at 3) and end at 6, one past the chunk;
    seven of them, 9."""
    grid = PrefillSpanGrid(slots=4, num_kv_heads=1, tile_tokens=2, block_keys=1)
    assert grid.riding_walk_keys([4], [4], [6]) == 2
    assert grid.riding_walk_keys([4], [4], [6, 6], 1.5) == 5.5
    assert grid.riding_walk_keys([4], [4], [3]) == 0                        # ends before the chunk's longest tile
    assert grid.riding_walk_keys([4], [4], [2] * 5) == _reference(grid, [(4, 4)], [2] * 5) - 5 == 1
    assert grid.riding_walk_keys([4], [4], [2] * 7) == 4
    assert grid.riding_walk_keys([4], [4], []) == 0 and grid.riding_walk_keys([], [], [6]) == 0


def test_riding_walk_matches_an_independent_list_schedule():
    rng = np.random.default_rng(1)
    for _ in range(60):
        grid = PrefillSpanGrid(int(rng.integers(1, 24)), int(rng.integers(1, 4)), int(rng.integers(1, 9)),
                               int(rng.integers(1, 9)), ragged_entries=True)
        n = int(rng.integers(1, 60))
        c = n + int(rng.integers(0, 80))
        decodes = sorted((int(d) for d in rng.integers(1, 200, int(rng.integers(1, 12)))), reverse=True)
        scale = float(rng.choice([1.0, 1.25]))
        alone = grid.span_entries([n], [c])[0]
        want = max(_reference(grid, [(n, c)], decodes, scale) - alone, 0)
        assert grid.riding_walk_keys([n], [c], decodes, scale) == pytest.approx(want), (grid, n, c, decodes)


def test_resident_riding_walk_is_the_longest_decode_past_the_chunk():
    """Where every program is resident (an H200: a 512-token chunk's 128 programs and a few decodes' 8 each on 264
    slots) the walk is the rule of files fitted before it, max(longest decode - ratio x chunk context, 0), over
    the ratio, to a key block; 24 decodes beside the chunk (320 programs) queue and lengthen the step although
    none walks past the chunk."""
    h200 = PrefillSpanGrid.from_counts(num_sms=132, num_q_heads=16, num_kv_heads=8)
    for longest, ratio in ((6000, 0.9), (3000, 0.9), (9000, 1.0)):
        got = h200.riding_walk_keys([512], [2048], [longest, 100], 1 / ratio)
        assert got == pytest.approx(max(longest - ratio * 2048, 0) / ratio, abs=2 * 64 / ratio)
    assert h200.riding_walk_keys([512], [2048], [1024] * 12) == 0
    assert h200.riding_walk_keys([512], [2048], [1024] * 24) > 1000


def test_a_table_row_reads_its_riding_decodes_as_the_longest_and_equal_others():
    assert riding_decode_contexts(3, 3000, 2000) == [2000, 500, 500]
    assert riding_decode_contexts(4, 1001, 500) == [500, 167, 167, 167]
    assert riding_decode_contexts(1, 700, 700) == [700] and riding_decode_contexts(0, 0, 0) == []
    h200 = PrefillSpanGrid.from_counts(num_sms=132, num_q_heads=16, num_kv_heads=8)
    steps = dict(num_prefill_seqs=[1, 1, 0], num_prefill_tokens=[512, 512, 0], prefill_context_sum=[2048, 1024, 0],
                 max_prefill_context_tokens=[2048, 1024, np.nan], prefill_attention_pairs=[np.nan] * 3,
                 num_decode_seqs=[24, 1, 8], decode_context_sum=[24 * 1024, 6000, 8000],
                 max_decode_context_tokens=[1024, 6000, 1000])
    got = table_riding_walk_keys(steps, h200, np.array([True, True, False]), 1.0)
    assert list(got) == [h200.riding_walk_keys([512], [2048], [1024] * 24), h200.riding_walk_keys([512], [1024],
                                                                                                  [6000]), 0.0]
