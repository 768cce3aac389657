"""engine/step_inputs.py: host inputs of a step; decode-graph block tables patched in place equal a rebuild."""
import random

import numpy as np
import pytest

from engine.core.batch import Batch
from engine.core.sequence import SamplingParams, Sequence
from engine.step_inputs import StepInputBuilder

BS, WIDTH, MAX_BS = 4, 12, 8


def _rebuilt(seqs, graph_bs):
    """The padded [graph_bs, WIDTH] tables written from scratch."""
    out = np.zeros((graph_bs, WIDTH), dtype=np.int32)
    for i, s in enumerate(seqs):
        n = -(-len(s.token_ids) // BS)
        out[i, :n] = s.block_table[:n]
    return out


def _decode_batch(seqs):
    return Batch(seqs=list(seqs), num_new_tokens=[1] * len(seqs), context_lens=[len(s.token_ids) for s in seqs],
                 block_size=BS)


def test_graph_block_tables_track_growth_reordering_and_rebuilt_tables():
    """Random decode steps: sequences grow (same list, appended), get their table rebuilt (a new list, as the
    block manager does on free / swap / prefix hit, possibly of the same length), leave, join, reorder."""
    rng = random.Random(0)
    builder = StepInputBuilder(BS, WIDTH, MAX_BS)
    next_block = iter(range(10_000))
    pool = []
    for i in range(12):
        s = Sequence(i, [1] * rng.randint(1, 20), SamplingParams())
        s.block_table = [next(next_block) for _ in range(-(-len(s.token_ids) // BS))]
        pool.append(s)
    patched_rows = 0
    seqs = pool[:5]
    for step in range(400):
        seqs = rng.sample(pool, rng.randint(1, MAX_BS)) if step % 7 == 0 else seqs
        for s in seqs:
            if rng.random() < 0.1:           # rebuilt table: new list object with new block ids, same length
                s.block_table = [next(next_block) for _ in s.block_table]
            if len(s.token_ids) < WIDTH * BS:
                s.token_ids.append(2)
                if len(s.block_table) * BS < len(s.token_ids):
                    s.block_table.append(next(next_block))
        graph_bs = rng.choice([b for b in (1, 2, 4, 8) if b >= len(seqs)])
        step_inputs = builder.build(_decode_batch(seqs), graph_bs)
        assert np.array_equal(step_inputs.block_tables, _rebuilt(seqs, graph_bs)), f"step {step}"
        ctx = np.array([len(s.token_ids) for s in seqs])
        want_slots = [s.block_table[(c - 1) // BS] * BS + (c - 1) % BS for s, c in zip(seqs, ctx)]
        assert step_inputs.slots.tolist() == want_slots
        assert step_inputs.sample_rows.tolist() == list(range(len(seqs)))
        patched_rows += sum(builder.row_list[i] is s.block_table for i, s in enumerate(seqs))
    assert patched_rows > 0


def test_graph_tables_are_built_in_the_given_buffer():
    """The model runner hands over its pinned host mirror: the step's tables are a view of it, no copy."""
    buf = np.zeros((MAX_BS, WIDTH), dtype=np.int32)
    s = Sequence(0, [1] * 9, SamplingParams())
    s.block_table = [4, 7, 2]
    step = StepInputBuilder(BS, WIDTH, MAX_BS, buf).build(_decode_batch([s]), 2)
    assert np.shares_memory(step.block_tables, buf) and buf[0, :3].tolist() == [4, 7, 2]
    with pytest.raises(ValueError, match="graph_tables"):
        StepInputBuilder(BS, WIDTH, MAX_BS, np.zeros((MAX_BS, WIDTH + 1), dtype=np.int32))


def test_eager_step_tables_and_sample_rows():
    a = Sequence("a", list(range(10)), SamplingParams())     # a prefill chunk of 6 of its 10 prompt tokens
    b = Sequence("b", list(range(7)), SamplingParams())      # a decode
    a.block_table, b.block_table = [5, 6, 7], [9, 3]
    batch = Batch(seqs=[a, b], num_new_tokens=[6, 1], num_prefill_seqs=1, context_lens=[6, 7], block_size=BS)
    step = StepInputBuilder(BS, WIDTH).build(batch, None)
    assert step.block_tables.tolist() == [[5, 6], [9, 3]]
    assert step.input_ids.tolist() == [0, 1, 2, 3, 4, 5, 6]
    assert step.positions.tolist() == [0, 1, 2, 3, 4, 5, 6]
    assert step.slots.tolist() == [20, 21, 22, 23, 24, 25, 14]
    assert step.sample_rows.tolist() == [1]                  # the chunk has not reached its last prompt token
