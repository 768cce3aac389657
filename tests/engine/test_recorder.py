"""Recorder tables on hand-built sequences and batches, with values worked out by hand."""
import math

import numpy as np
import pytest

from engine.core.batch import Batch
from engine.core.recorder import REQUEST_COLUMNS, STEP_COLUMNS, Recorder, concat_frames
from engine.core.sequence import SamplingParams, Sequence, SequenceStatus


def finished_seq(rid, prompt_len, outputs, arrival, scheduled, first_tok, finish, **kw):
    seq = Sequence(rid, list(range(1, prompt_len + 1)), SamplingParams(max_tokens=max(outputs, 1) + 2, ignore_eos=True),
                   arrival_time_s=arrival, **kw)
    seq.set_status(SequenceStatus.RUNNING)
    seq.token_ids.extend([7] * outputs)
    seq.first_scheduled_time_s, seq.first_token_time_s, seq.finish_time_s = scheduled, first_tok, finish
    seq.set_status(SequenceStatus.FINISHED)
    return seq


def test_request_rows_exact_values():
    rec = Recorder(replica=2)
    a = finished_seq(10, 4, 3, arrival=1.0, scheduled=1.5, first_tok=2.0, finish=3.0, priority=1)
    a.num_preemptions, a.num_swaps, a.num_cached_tokens = 2, 1, 16
    b = finished_seq(11, 5, 1, arrival=0.5, scheduled=0.75, first_tok=1.25, finish=1.25)
    c = Sequence(12, [1, 2, 3], SamplingParams(max_tokens=8), arrival_time_s=2.0)
    c.reject_reason = "prompt longer than max_model_len"
    c.set_status(SequenceStatus.REJECTED)
    for s in (a, b, c):
        rec.on_finish(s)
    df = rec.requests_frame()
    assert list(df.columns) == list(REQUEST_COLUMNS)
    assert df["request_id"].tolist() == [10, 11, 12]
    assert df["status"].tolist() == ["finished", "finished", "rejected"]
    ra = df.iloc[0]
    assert (ra.num_prompt_tokens, ra.num_output_tokens, ra.max_output_tokens) == (4, 3, 5)
    assert ra.ttft_s == 1.0 and ra.e2e_s == 2.0 and ra.queueing_delay_s == 0.5
    assert ra.tpot_s == 0.5                       # (2.0 - 1.0) / (3 - 1)
    assert (ra.num_preemptions, ra.num_swaps, ra.num_cached_tokens, ra.priority, ra.replica) == (2, 1, 16, 1, 2)
    rb = df.iloc[1]
    assert rb.ttft_s == 0.75 and rb.e2e_s == 0.75 and math.isnan(rb.tpot_s)   # 1-token output: TPOT undefined
    rc = df.iloc[2]
    assert rc.reject_reason == "prompt longer than max_model_len" and rc.num_output_tokens == 0
    assert all(math.isnan(rc[k]) for k in ("first_token_time_s", "finish_time_s", "ttft_s", "tpot_s", "e2e_s"))
    assert df["reject_reason"].isna().tolist() == [True, True, False]


def test_on_finish_refuses_live_sequence():
    seq = Sequence(1, [1, 2], SamplingParams(max_tokens=2))
    with pytest.raises(ValueError, match="WAITING"):
        Recorder().on_finish(seq)


def make_step_batch():
    p1 = Sequence(1, list(range(10)), SamplingParams(max_tokens=4))            # whole prompt, samples
    p2 = Sequence(2, list(range(20)), SamplingParams(max_tokens=4))            # chunk [8, 12): no sample
    p2.num_computed_tokens = 8
    decodes = []
    for rid, ctx in ((3, 5), (4, 7), (5, 9)):
        d = Sequence(rid, list(range(ctx - 1)), SamplingParams(max_tokens=4))
        d.token_ids.append(0)
        d.num_computed_tokens = ctx - 1
        decodes.append(d)
    victim = Sequence(9, [1], SamplingParams(max_tokens=1))
    return Batch(seqs=[p1, p2, *decodes], num_new_tokens=[10, 4, 1, 1, 1], num_prefill_seqs=2,
                 context_lens=[10, 12, 5, 7, 9], swap_in=[(0, 1), (2, 3)], swap_out=[(4, 5)],
                 preempted=[victim], swapped_out=[decodes[0]], swapped_in=[])


def test_step_rows_and_bulk():
    rec = Recorder()
    rec.on_step(0.0, 0.25, make_step_batch(), num_used_blocks=30, num_free_blocks=70, num_cached_blocks=5)
    rec.on_steps_bulk(start_s=[0.25, 0.5, 0.75], duration_s=0.25, num_decode_seqs=4,
                      decode_context_sum=np.array([40, 44, 48]), kv_blocks_used=[31, 31, 32],
                      kv_blocks_free=[69, 69, 68], kv_blocks_cached=5)
    rec.on_steps_bulk(start_s=[], duration_s=[], num_decode_seqs=1, decode_context_sum=1,
                      kv_blocks_used=0, kv_blocks_free=0, kv_blocks_cached=0)     # k = 0 is a no-op
    df = rec.steps_frame()
    assert list(df.columns) == list(STEP_COLUMNS)
    assert df["step"].tolist() == [0, 1, 2, 3] and rec.num_steps == 4
    s0 = df.iloc[0].to_dict()
    assert {k: s0[k] for k in ("num_prefill_tokens", "num_prefill_seqs", "num_decode_seqs", "batch_size",
                               "num_batched_tokens", "kv_blocks_used", "kv_blocks_free", "kv_blocks_cached",
                               "num_preempted", "num_swapped_out", "num_swapped_in")} == {
        "num_prefill_tokens": 14, "num_prefill_seqs": 2, "num_decode_seqs": 3, "batch_size": 5,
        "num_batched_tokens": 17, "kv_blocks_used": 30, "kv_blocks_free": 70, "kv_blocks_cached": 5,
        "num_preempted": 1, "num_swapped_out": 1, "num_swapped_in": 0}
    # 1 + ... + 10 = 55 causal pairs for the full prompt; 9 + 10 + 11 + 12 = 42 for the chunk
    assert s0["prefill_context_sum"] == 22 and s0["prefill_attention_pairs"] == 97
    assert s0["num_prefill_samples"] == 1 and s0["decode_context_sum"] == 21 and s0["num_swap_blocks"] == 3
    bulk = df.iloc[1:]
    assert bulk["start_time_s"].tolist() == [0.25, 0.5, 0.75] and bulk["duration_s"].tolist() == [0.25] * 3
    assert bulk["batch_size"].tolist() == [4, 4, 4] and bulk["num_batched_tokens"].tolist() == [4, 4, 4]
    assert bulk["decode_context_sum"].tolist() == [40, 44, 48] and bulk["kv_blocks_used"].tolist() == [31, 31, 32]
    assert bulk["num_prefill_tokens"].sum() == 0 and bulk["num_preempted"].sum() == 0
    assert bulk["kv_blocks_cached"].tolist() == [5, 5, 5]
    assert df["start_time_s"].dtype == np.float64 and df["batch_size"].dtype == np.int64


def test_empty_frames_and_concat():
    r0, r1 = Recorder(0), Recorder(1)
    assert list(r0.requests_frame().columns) == list(REQUEST_COLUMNS) and len(r0.steps_frame()) == 0
    r1.on_finish(finished_seq(1, 2, 2, 0.0, 0.0, 0.5, 1.0))
    req, steps = concat_frames([r0, r1])
    assert req["replica"].tolist() == [1] and len(steps) == 0


def test_token_times_frame():
    rec = Recorder()
    seq = finished_seq(5, 2, 3, 0.0, 0.0, 1.0, 2.0)
    seq.token_times_s = [1.0, 1.5, 2.0]
    rec.on_finish(seq)
    tt = rec.token_times_frame()
    assert tt["request_id"].tolist() == [5, 5, 5] and tt["token_index"].tolist() == [0, 1, 2]
    assert tt["time_s"].tolist() == [1.0, 1.5, 2.0]


def test_recorder_workloads_metrics_import_neither_torch_nor_matplotlib():
    import subprocess
    import sys
    code = ("import sys, engine.core.recorder, experiments.workloads, experiments.metrics; "
            "print(sorted(m for m in ('torch', 'matplotlib') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                         cwd=str(__import__("pathlib").Path(__file__).resolve().parents[2]))
    assert out.stdout.strip() == "[]"


def test_longest_context_columns_per_step_and_per_decode_run():
    """max_prefill / max_decode / max_context_tokens on a hand-built mixed step, a prefill-only step and the
    fast path's runs (the longest context grows by 1 a step; a run without decodes has none)."""
    seqs = [Sequence(i, list(range(n)), SamplingParams(max_tokens=4)) for i, n in enumerate((300, 40, 7, 900, 30))]
    mixed = Batch(seqs=seqs, num_new_tokens=[100, 40, 1, 1, 1], num_prefill_seqs=2, block_size=16,
                  context_lens=[300, 40, 7, 900, 30])
    prefill = Batch(seqs=seqs[:1], num_new_tokens=[300], num_prefill_seqs=1, block_size=16, context_lens=[300])
    rec = Recorder()
    rec.on_step(0.0, 0.1, mixed, 0, 0, 0)
    rec.on_step(0.1, 0.1, prefill, 0, 0, 0)
    rec.on_decode_runs([0.2, 0.3, 0.4], [0.1] * 3, ((2, 3, 60, 50), (1, 2, 66, 41)), [1, 1, 1], 10, 0)
    rec.on_decode_steps([0.5, 0.6], [0.1, 0.1], 2, 80, [1, 1], 10, [0, 0], 70)      # varying cached: per step
    rec.on_steps_bulk([0.7], 0.1, 4, 10, 1, 9, 0)                                     # no max given: the mean
    df = rec.steps_frame()
    assert df["max_prefill_context_tokens"].tolist() == [300, 300, 0, 0, 0, 0, 0, 0]
    assert df["max_decode_context_tokens"].tolist() == [900, 0, 50, 51, 41, 70, 71, 3]
    assert df["max_context_tokens"].tolist() == [900, 300, 50, 51, 41, 70, 71, 3]


def _recorded(rec: Recorder, batch: Batch) -> Recorder:
    """Steps of every kind, an overlap-style late time for an early row, and requests, into rec."""
    for i in range(7):
        rec.on_step(float(i), 0.0, batch, num_used_blocks=30 + i, num_free_blocks=70 - i, num_cached_blocks=i % 3)
        if i == 5:
            rec.set_step_time(1, 1.25, 0.5)          # a row recorded several steps (and flushes) before
    rec.on_decode_runs([7.0, 7.5, 8.0], [0.5] * 3, ((2, 4, 40, 12), (1, 3, 50, 13)), [40, 41, 41], 100, [3, 2, 2])
    rec.on_decode_steps([8.5, 9.0], [0.5, 0.5], 3, 60, [41, 42], 100, 2, 15)
    rec.on_steps_bulk([9.5, 10.0], 0.5, 3, [66, 69], [42, 42], [58, 58], [2, 1])
    rec.set_step_time(rec.num_steps - 1, 10.25, 0.75)
    for rid in range(5):
        rec.on_finish(finished_seq(rid, 3 + rid, 2, 0.5 * rid, 0.5 * rid + 0.25, 0.5 * rid + 0.5, 6.0 + rid))
    return rec


def test_staged_values_reach_the_tables_across_flushes(monkeypatch):
    """Rows staged in lists and moved into the arrays every _STAGE steps or requests: the same tables
    whether the flushes fall between the calls or never before the tables are built."""
    import engine.core.recorder as recorder
    whole = _recorded(Recorder(), make_step_batch())
    monkeypatch.setattr(recorder, "_STAGE", 2)
    flushed = _recorded(Recorder(), make_step_batch())
    assert len(flushed._kept["_step_start"]) > 0 and len(flushed._kept["_req_int"]) > 0    # flushes happened
    for a, b in ((whole.steps_frame(), flushed.steps_frame()), (whole.requests_frame(), flushed.requests_frame())):
        assert a.equals(b)
    steps = flushed.steps_frame()
    assert steps.loc[1, "start_time_s"] == 1.25 and steps.loc[1, "duration_s"] == 0.5
    assert steps["start_time_s"].iloc[-1] == 10.25 and steps["duration_s"].iloc[-1] == 0.75
    assert steps["kv_blocks_cached"].tolist() == [0, 1, 2, 0, 1, 2, 0, 3, 2, 2, 2, 2, 2, 1]


def test_staged_integer_column_refuses_a_float():
    rec = Recorder()
    rec.on_step(0.0, 0.1, make_step_batch(), num_used_blocks=1.5, num_free_blocks=1, num_cached_blocks=0)
    with pytest.raises(Exception, match="integer"):
        rec.steps_frame()
