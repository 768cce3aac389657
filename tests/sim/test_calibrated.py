"""The calibrated cost model: NNLS optimality, exact recovery of known coefficients, the cost-model
contract (decode fast path, empty steps, bad shapes), file round trip, and agreement between the
table form (predict_table) and the per-batch form (step_time_s)."""
import json

import numpy as np
import pandas as pd
import pytest

from engine.core.recorder import Recorder
from experiments.profile import Shape, build_batch
from sim.cost_model import get_cost_model
from sim.cost_model.base import CostModelError
from sim.cost_model.calibrated import FEATURES, CalibratedCostModel, design_matrix, nnls
from sim.cost_model.calibrated_fit import MIXED_WALK_RATIOS

COEF = dict(step=2e-3, eager_step=5e-3, num_seqs=1e-5, prefill_tokens=3e-6, prefill_attention_pairs=1e-9,
            decode_context_sum=2e-8, lm_head_rows=4e-6, tokens_over_knee=2e-6, swap_step=5e-4, swap_out_blocks=3e-4,
            swap_in_blocks=1e-4, loop_step=2e-4, loop_seqs=0.0,      # fits leave loop_seqs at 0 (UNFITTED)
            loop_prefill_tokens=5e-7, prefill_context_tokens=4e-8,
            loop_prefill_step=3e-4, mixed_decode_tail_keys=6e-8, decode_tail_keys=0.0, tier_step=2e-4,
            tier_out_blocks=6e-5, tier_in_blocks=9e-5, decode_split_keys=3e-7, decode_graph_1=1e-4, decode_graph_2=0.0,
            decode_graph_4=5e-5, decode_graph_8=0.0, decode_graph_16=0.0, decode_graph_32=2e-5,
            prefill_attention_span=0.0, prefill_attention_span_alone=0.0,   # their own test: they need a grid
            prefill_small_tokens=7e-7, decode_step=0.0,   # decode_step 0: canonical_step_base's choice
            loop_hit_step=6e-4, loop_hit_blocks=3e-6, lm_head_step=8e-5,
            cold_step=0.0,   # cold_step 0: the tables below have no idle gaps (its own test)
            mixed_decode_rest_keys=2e-8, mixed_decode_rest_over=2e-8)   # without prefill graphs: a decode's price
SPLIT = 16     # single_split_min_seqs of the models below: decode batches from 16 sequences price their tail


def test_nnls_satisfies_kkt_conditions():
    rng = np.random.default_rng(0)
    for _ in range(100):
        m, n = rng.integers(4, 25), rng.integers(1, 8)
        a, b = rng.normal(size=(m, n)), rng.normal(size=m)
        x = nnls(a, b)
        g = a.T @ (a @ x - b)                       # gradient of 0.5 * ||a x - b||^2
        assert (x >= 0).all()
        assert np.all(g[x == 0] >= -1e-9)           # no descent direction into the feasible set
        np.testing.assert_allclose(g[x > 0], 0.0, atol=1e-8)


def test_nnls_clips_a_coefficient_plain_least_squares_makes_negative():
    a = np.array([[1.0, 1.0], [1.0, 2.0], [1.0, 3.0]])
    b = np.array([3.0, 2.0, 1.0])                   # unconstrained fit: 4 - 1 * col1
    np.testing.assert_allclose(np.linalg.lstsq(a, b, rcond=None)[0], [4.0, -1.0])
    np.testing.assert_allclose(nnls(a, b), [2.0, 0.0])   # best non-negative: the mean, no slope


def _shapes():
    shapes = [Shape("prefill", ((n, c),)) for n in (8, 100, 700, 3000) for c in (0, 500)]
    shapes += [Shape("multi_prefill", ((n, 0),) * k) for n in (50, 300) for k in (2, 5)]
    shapes += [Shape("decode", (), (c,) * b) for b in (1, 3, 20, 90) for c in (10, 300, 2000)]
    shapes += [Shape("mixed", ((n, 0),), (c,) * b) for n, c, b in ((64, 100, 4), (900, 40, 30))]
    # a short chunk beside longer decodes (mixed_decode_tail_keys), ragged so the longest is not the mean
    shapes += [Shape("mixed", ((n, c),), d) for n, c, d in ((32, 0, (500, 2000)), (128, 256, (90, 700, 3000)))]
    shapes += [Shape(k, swap_blocks=s) for k in ("swap_out", "swap_in") for s in (1, 7, 40)]
    shapes += [Shape(k, (), (c,) * 4, tier_blocks=s) for k in ("tier_out", "tier_in") for s in (1, 9, 50)
               for c in (64, 700)]
    return shapes


def _table(shapes, model, loop: bool = True):
    """(steps table, batches): the recorder's columns plus swap directions and serving_loop; durations from model."""
    rng = np.random.default_rng(1)
    rec = Recorder()
    batches = []
    for i, sh in enumerate(shapes):
        b = build_batch(sh, 16, 1000, 0.0, rng)
        if sh.prefills and i % 3 == 0:      # an intermediate chunk: more tokens follow, nothing is sampled
            b.seqs[0].token_ids.extend([1] * 10)
        if sh.prefills and i % 2 == 0:      # admitted on prefix-cache hits (the recorder's column), 1-9 blocks
            b.num_gpu_hit_blocks = 1 + i % 9
        batches.append(b)
        rec.on_step(0.0, 0.0, b, 0, 0, 0)
    table = rec.steps_frame().assign(block_size=16, serving_loop=int(loop),
                                      num_swap_out_blocks=[len(b.swap_out) for b in batches],
                                      num_swap_in_blocks=[len(b.swap_in) for b in batches])
    return table.assign(duration_s=model.predict_table(table)), batches


def test_fit_recovers_known_coefficients_exactly():
    """A profile (no loop terms) and a run's table (with them), fitted together, give back every coefficient."""
    truth = CalibratedCostModel(coefficients=COEF, single_split_min_seqs=SPLIT, knee_tokens=256)
    profile, _ = _table(_shapes(), truth, loop=False)
    run, _ = _table(_shapes(), truth, loop=True)
    table = pd.concat([profile, run], ignore_index=True)
    fitted = CalibratedCostModel.fit(table, single_split_min_seqs=SPLIT, knee_candidates=(None, 128, 256, 512))
    assert fitted.knee_tokens == 256
    np.testing.assert_allclose(fitted.predict_table(table), table["duration_s"], rtol=1e-7)
    for f in FEATURES:
        assert fitted.coefficients[f] == pytest.approx(COEF[f], rel=1e-5, abs=1e-15), f


def test_a_table_where_every_step_samples_leaves_lm_head_step_in_step():
    """Without an intermediate chunk, lm_head_step and step are the same column on every forward row: the fit keeps
    the sum in step (lm_head_step 0) and prices every row as the truth does; with intermediate chunks it splits them."""
    truth = CalibratedCostModel(coefficients=COEF, single_split_min_seqs=SPLIT, knee_tokens=256)
    table, _ = _table(_shapes(), truth, loop=False)
    final = table[~((table.num_prefill_seqs > 0) & (table.num_prefill_samples + table.num_decode_seqs == 0))]
    assert len(final) < len(table)
    fitted = CalibratedCostModel.fit(final, single_split_min_seqs=SPLIT, knee_candidates=(256,))
    assert fitted.coefficients["lm_head_step"] == 0.0
    assert fitted.coefficients["step"] == pytest.approx(COEF["step"] + COEF["lm_head_step"], rel=1e-5)
    np.testing.assert_allclose(fitted.predict_table(final), final["duration_s"], rtol=1e-7)
    split = CalibratedCostModel.fit(table, single_split_min_seqs=SPLIT, knee_candidates=(256,))
    assert split.coefficients["lm_head_step"] == pytest.approx(COEF["lm_head_step"], rel=1e-5)


def test_fit_weighs_profile_and_run_rows_equally_and_leaves_loop_seqs_at_zero():
    """A run table with 10x the rows of the profile: both sources carry half the weight; and a per-sequence loop
    cost in the data is not fitted into loop_seqs (it would extrapolate), whatever the data say."""
    from sim.cost_model.calibrated_fit import source_weights
    truth = CalibratedCostModel(coefficients=dict(COEF, loop_seqs=5e-5), single_split_min_seqs=SPLIT, knee_tokens=256)
    profile, _ = _table(_shapes(), truth, loop=False)
    run, _ = _table(_shapes() * 10, truth, loop=True)
    table = pd.concat([profile, run], ignore_index=True)
    w = source_weights(table)
    loop = table["serving_loop"].to_numpy() == 1
    assert w[loop].sum() == pytest.approx(w[~loop].sum()) and w.sum() == pytest.approx(len(table))
    assert np.array_equal(source_weights(run), np.ones(len(run)))
    fitted = CalibratedCostModel.fit(table, single_split_min_seqs=SPLIT, knee_candidates=(256,))
    assert fitted.coefficients["loop_seqs"] == 0.0 and fitted.coefficients["num_seqs"] > 0


def test_loop_terms_come_from_the_host_gap_when_run_rows_keep_their_measured_duration():
    """Run rows with measured_duration_s: loop_step and loop_seqs are fitted on cycle - measured (the host gap)
    and recovered exactly, including loop_seqs, which a joint fit leaves at 0; the other terms fit the rest."""
    truth = CalibratedCostModel(coefficients=dict(COEF, loop_seqs=3e-6), single_split_min_seqs=SPLIT, knee_tokens=256)
    profile, _ = _table(_shapes(), truth, loop=False)
    run, _ = _table(_shapes() * 4, truth, loop=True)
    seqs = (run["num_prefill_seqs"] + run["num_decode_seqs"]).to_numpy()
    gap = np.where(seqs > 0, COEF["loop_step"] + 3e-6 * seqs, 0.0)
    run = run.assign(measured_duration_s=run["duration_s"] - gap)
    fitted = CalibratedCostModel.fit(pd.concat([profile, run], ignore_index=True),
                                     single_split_min_seqs=SPLIT, knee_candidates=(256,))
    assert fitted.coefficients["loop_seqs"] == pytest.approx(3e-6, rel=1e-6)
    assert fitted.coefficients["loop_step"] == pytest.approx(COEF["loop_step"], rel=1e-6)
    for f in ("step", "num_seqs", "decode_context_sum", "prefill_tokens"):
        assert fitted.coefficients[f] == pytest.approx(COEF[f], rel=1e-5), f


@pytest.mark.parametrize("offset_s, per_key_s", [(1e-4, 0.0), (-5e-5, 0.0), (1e-4, 3e-8), (-5e-5, -1e-8)])
def test_profile_harness_offset_is_fitted_apart_from_the_step_term(offset_s, per_key_s):
    """Profile rows timed `offset_s` slower (or faster) per step, and `per_key_s` per key their prefill entries
    read, than the serving loop runs the same shapes: the fit returns the run's coefficients exactly and both
    offsets in metadata, and never prices them (the run rows keep their measured step, so the loop terms are
    known). Without run rows there is no offset to fit (it would duplicate `step`)."""
    truth = CalibratedCostModel(coefficients=COEF, single_split_min_seqs=SPLIT, knee_tokens=256)
    profile, _ = _table(_shapes(), truth, loop=False)
    runs = (profile["num_prefill_seqs"] + profile["num_decode_seqs"] + profile["num_swap_blocks"]) > 0
    assert runs.all()
    profile = profile.assign(duration_s=profile["duration_s"] + offset_s + per_key_s * profile["prefill_context_sum"])
    run, _ = _table(_shapes() * 3, truth, loop=True)
    seqs = (run["num_prefill_seqs"] + run["num_decode_seqs"]).to_numpy()
    run = run.assign(measured_duration_s=run["duration_s"] - np.where(seqs > 0, COEF["loop_step"], 0.0))
    fitted = CalibratedCostModel.fit(pd.concat([profile, run], ignore_index=True),
                                     single_split_min_seqs=SPLIT, knee_candidates=(256,))
    assert fitted.metadata["profile_offset_s"] == pytest.approx(offset_s, rel=1e-5)
    assert fitted.metadata["profile_offset_per_prefill_key_s"] == pytest.approx(per_key_s, rel=1e-5, abs=1e-15)
    for f in FEATURES:
        assert fitted.coefficients[f] == pytest.approx(COEF[f], rel=1e-5, abs=1e-15), f
    np.testing.assert_allclose(fitted.predict_table(run), run["duration_s"], rtol=1e-7)
    if per_key_s:
        return          # alone, the per-key offset goes into the prefill terms: nothing to compare it with
    alone = CalibratedCostModel.fit(profile, single_split_min_seqs=SPLIT, knee_candidates=(256,))
    assert "profile_offset_s" not in alone.metadata
    assert alone.coefficients["step"] == pytest.approx(COEF["step"] + offset_s, rel=1e-5)


def test_robust_fit_ignores_a_few_stalled_steps():
    """Noisy times (2% jitter) plus 3 steps stalled 20x (a compile, a host hiccup): the robust fit stays close
    (p90 relative error on the clean steps under 4%; plain NNLS about 9%)."""
    truth = CalibratedCostModel(coefficients=COEF, single_split_min_seqs=SPLIT, knee_tokens=256)
    table, _ = _table(_shapes() * 3, truth)
    rng = np.random.default_rng(3)
    y = table["duration_s"].to_numpy() * rng.normal(1.0, 0.02, len(table))
    y[[2, 17, 40]] *= 20.0
    table = table.assign(duration_s=y)
    # the sqrt objective, where a stalled step weighs more than under the relative one
    robust = CalibratedCostModel.fit(table, single_split_min_seqs=SPLIT, knee_candidates=(256,), objective="sqrt")
    plain = CalibratedCostModel.fit(table,
                                    single_split_min_seqs=SPLIT, knee_candidates=(256,), objective="sqrt", robust=False)
    clean = np.delete(np.arange(len(table)), [2, 17, 40])
    true = truth.predict_table(table)[clean]
    err = (lambda m: np.percentile(np.abs(m.predict_table(table)[clean] - true) / true, 90))
    assert err(robust) < 0.04 < err(plain)
    # the context slope; the fixed costs (step, loop_step, eager_step, the decode graphs) and the per-token ones
    # trade a little noise among themselves
    for f in ("decode_context_sum",):
        assert robust.coefficients[f] == pytest.approx(COEF[f], rel=0.1), f


def test_hand_computed_step_time():
    cm = CalibratedCostModel(coefficients=dict(step=1.0, eager_step=10.0, num_seqs=100.0, prefill_tokens=1e3,
                                               prefill_attention_pairs=1e4, decode_context_sum=1e5,
                                               lm_head_rows=1e6, tokens_over_knee=1e9, swap_step=1e7,
                                               swap_out_blocks=1e8, swap_in_blocks=3e8, loop_step=0.5,
                                               loop_seqs=0.25, loop_prefill_tokens=1e-2), knee_tokens=5)
    # prefill entries (n=3, c=3) and (n=2, c=6, not sampling); 2 decodes with contexts summing to 9; 1 swap block
    # pairs: 3*3 - 3 + 2*6 - 1 = 17; tokens 5 + 2 = 7 -> 2 over the knee; lm rows 1 + 2 = 3; 4 sequences
    forward = 1 + 10 + 100 * 4 + 1e3 * 5 + 1e4 * 17 + 1e5 * 9 + 1e6 * 3 + 1e9 * 2 + 0.5 + 0.25 * 4 + 1e-2 * 5
    t = cm.step_time_from_shape([3, 2], [3, 6], 2, 9, num_swap_blocks=1, num_prefill_samples=1)
    assert t == forward + 1e7 + 0.5 * (1e8 + 3e8)       # direction unknown: the mean per-block cost
    assert cm.step_time_from_shape([], [], 0, 0) == 0.0
    assert cm.step_time_from_shape([], [], 0, 0, num_swap_blocks=2) == 1e7 + 4e8 + 0.5
    # a block size twice the fitted one copies twice the bytes per block
    assert cm.step_time_from_shape([], [], 0, 0, num_swap_blocks=2, block_size=32) == 1e7 + 8e8 + 0.5
    # a decode-only step: no eager cost, no knee (a CUDA graph runs it)
    assert cm.step_time_from_shape([], [], 3, 30) == 1 + 100 * 3 + 1e5 * 30 + 1e6 * 3 + 0.5 + 0.25 * 3


def test_a_long_decode_beside_a_short_chunk_is_priced_by_its_excess_keys():
    """mixed_decode_tail_keys: keys of the longest decode beyond the longest prefill context, only in steps with
    prefill entries; the batch form reads the longest context, the shape form takes it as an argument."""
    cm = CalibratedCostModel(coefficients=dict(step=1.0, decode_context_sum=1e-3, mixed_decode_tail_keys=1.0))
    rng = np.random.default_rng(0)
    mixed = build_batch(Shape("mixed", ((32, 100),), (50, 900)), 16, 1000, 0.0, rng)   # prefill context 132
    assert cm.step_time_s(mixed) == pytest.approx(1.0 + 1e-3 * 950 + (900 - 132))
    assert cm.step_time_from_shape([32], [132], 2, 950, max_decode_context_len=900) == cm.step_time_s(mixed)
    # no longest context given: the mean (475) is the bound the sum gives
    assert cm.step_time_from_shape([32], [132], 2, 950) == pytest.approx(1.0 + 0.95 + (475 - 132))
    # a decode shorter than the chunk's context, and a decode-only step: no tail
    assert cm.step_time_from_shape([32], [132], 1, 100, max_decode_context_len=100) == pytest.approx(1.1)
    decode = build_batch(Shape("decode", decode_ctx=(50, 900)), 16, 1000, 0.0, rng)
    assert cm.step_time_s(decode) == pytest.approx(1.0 + 0.95)


def test_decode_tail_keys_prices_the_longest_context_of_unsplit_decode_batches():
    """decode_tail_keys: in a pure-decode step of at least single_split_min_seqs sequences, the keys of the
    longest context beyond the mean; the table, batch, shape and fast-path forms agree, and a fit recovers it."""
    coef = dict(step=1e-3, num_seqs=1e-5, decode_context_sum=2e-8, decode_tail_keys=4e-7)
    cm = CalibratedCostModel(coefficients=coef, single_split_min_seqs=4)
    rng = np.random.default_rng(0)
    ragged = build_batch(Shape("decode", decode_ctx=(100, 100, 100, 900)), 16, 1000, 0.0, rng)   # mean 300
    assert cm.step_time_s(ragged) == pytest.approx(1e-3 + 4e-5 + 2e-8 * 1200 + 4e-7 * 600)
    few = build_batch(Shape("decode", decode_ctx=(100, 900)), 16, 1000, 0.0, rng)                 # 2 < 4: split
    assert cm.step_time_s(few) == pytest.approx(1e-3 + 2e-5 + 2e-8 * 1000)
    assert cm.step_time_from_shape([], [], 4, 1200, max_decode_context_len=900) == cm.step_time_s(ragged)
    # the fast path: every context grows by 1 a step, so the tail stays 600
    ref = [cm.step_time_from_shape([], [], 4, 1200 + 4 * i, max_decode_context_len=900 + i) for i in range(5)]
    np.testing.assert_allclose(cm.decode_step_times_s(4, 1200, 5, start_max_context=900), ref, rtol=1e-12)
    assert cm.decode_step_times_list(4, 1200, 5, 900) == pytest.approx(ref)
    # a file without the threshold prices no tail
    assert CalibratedCostModel(coefficients=coef).step_time_s(ragged) == pytest.approx(1e-3 + 4e-5 + 2e-8 * 1200)
    # recovered by a fit from ragged and uniform batches either side of the threshold
    shapes = [Shape("decode", (), d) for d in ((50,) * 3 + (900,), (50,) * 7 + (2000,), (300,) * 8, (50, 3000),
                                                (20,) * 5 + (400,), (700,) * 6, (10,) * 5 + (90,) * 4)]
    table, batches = _table([Shape(s.kind, s.prefills, s.decode_ctx[:-1] + (s.decode_ctx[-1] + 37 * i,))
                             for i in range(6) for s in shapes], cm, loop=False)
    np.testing.assert_allclose(cm.predict_table(table), [cm.step_time_s(b) for b in batches], rtol=1e-12)
    fitted = CalibratedCostModel.fit(table, knee_candidates=(None,), single_split_min_seqs=4)
    assert fitted.coefficients["decode_tail_keys"] == pytest.approx(4e-7, rel=1e-5)
    assert CalibratedCostModel.from_dict(fitted.to_dict()).single_split_min_seqs == 4


def test_decode_graph_and_split_terms_price_small_decode_batches():
    """decode_graph_<b>: a pure-decode step pays the term of the CUDA graph its batch pads to (1, 2, 4, 8, 16, 32;
    none above); decode_split_keys: below single_split_min_seqs, min(longest context, 256) keys. Steps with
    prefill entries pay neither; the table, batch, shape and fast-path forms agree, and a fit recovers them."""
    coef = dict(step=1e-3, num_seqs=1e-5, decode_context_sum=2e-8, decode_split_keys=3e-7, decode_graph_1=1e-4,
                decode_graph_2=2e-4, decode_graph_4=3e-4, decode_graph_8=4e-4, decode_graph_16=5e-4,
                decode_graph_32=6e-4)
    cm = CalibratedCostModel(coefficients=coef, single_split_min_seqs=12)
    rng = np.random.default_rng(0)
    graph = {1: 1e-4, 2: 2e-4, 3: 3e-4, 4: 3e-4, 5: 4e-4, 8: 4e-4, 9: 5e-4, 16: 5e-4, 17: 6e-4, 32: 6e-4, 33: 0.0}
    for n, g in graph.items():
        b = build_batch(Shape("decode", decode_ctx=(100,) * (n - 1) + (900,)), 16, 1000, 0.0, rng)
        split = 3e-7 * 256 if n < 12 else 0.0
        assert cm.step_time_s(b) == pytest.approx(1e-3 + 1e-5 * n + 2e-8 * (100 * (n - 1) + 900) + g + split), n
    short = build_batch(Shape("decode", decode_ctx=(40, 90)), 16, 1000, 0.0, rng)       # longest 90 < 256 keys
    assert cm.step_time_s(short) == pytest.approx(1e-3 + 2e-5 + 2e-8 * 130 + 2e-4 + 3e-7 * 90)
    mixed = build_batch(Shape("mixed", ((64, 0),), (500,)), 16, 1000, 0.0, rng)
    assert cm.step_time_s(mixed) == pytest.approx(1e-3 + 2e-5 + 2e-8 * 500)
    # the fast path: the longest context grows by 1 a step and crosses 256 keys on the way
    ref = [cm.step_time_from_shape([], [], 2, 130 + 2 * i, max_decode_context_len=250 + i) for i in range(10)]
    np.testing.assert_allclose(cm.decode_step_times_s(2, 130, 10, start_max_context=250), ref, rtol=1e-12)
    assert ref[8] - ref[7] == pytest.approx(2 * 2e-8)                        # flat in the split term past 256
    # recovered by a fit from batches of every bucket, short and long contexts
    shapes = [Shape("decode", (), (c,) * (n - 1) + (c + 3 * n,)) for n in (1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 48, 64)
              for c in (30, 200, 700, 2000)]
    table, batches = _table(shapes, cm, loop=False)
    np.testing.assert_allclose(cm.predict_table(table), [cm.step_time_s(b) for b in batches], rtol=1e-12)
    fitted = CalibratedCostModel.fit(table, knee_candidates=(None,), single_split_min_seqs=12)
    for f, v in coef.items():
        assert fitted.coefficients[f] == pytest.approx(v, rel=1e-5), f


def test_prefill_attention_span_prices_the_busiest_program_slot():
    """prefill_attention_span: in a step with prefill entries, max(pairs / prefill_span_pairs, longest prefill
    context): the kernel's work spread over its program slots, or one program's walk over the longest context
    (a short chunk on a long cached prefix). The table, batch and shape forms agree; a fit recovers it."""
    coef = dict(step=1e-3, prefill_tokens=2e-6, prefill_attention_pairs=1e-10, prefill_attention_span=3e-7)
    cm = CalibratedCostModel(coefficients=coef, prefill_span_pairs=1000.0)
    rng = np.random.default_rng(0)
    # 128 new tokens after 16,384 cached: 2,105,408 pairs / 1,000 = 2,105 < 16,512 keys: the walk sets it
    chunk = build_batch(Shape("prefill", ((128, 16384),)), 16, 1000, 0.0, rng)
    pairs = 128 * 16512 - (128 * 128 - 128) // 2
    assert cm.step_time_s(chunk) == pytest.approx(1e-3 + 2e-6 * 128 + 1e-10 * pairs + 3e-7 * 16512)
    # 4,096 new tokens, nothing cached: 8,390,656 pairs / 1,000 = 8,391 > 4,096 keys: the spread sets it
    whole = build_batch(Shape("prefill", ((4096, 0),)), 16, 1000, 0.0, rng)
    pairs = 4096 * 4097 // 2
    assert cm.step_time_s(whole) == pytest.approx(1e-3 + 2e-6 * 4096 + 1e-10 * pairs + 3e-7 * pairs / 1000)
    decode = build_batch(Shape("decode", decode_ctx=(900,)), 16, 1000, 0.0, rng)
    assert cm.step_time_s(decode) == pytest.approx(1e-3)
    assert CalibratedCostModel(coefficients=coef).step_time_s(chunk) == pytest.approx(
        1e-3 + 2e-6 * 128 + 1e-10 * (128 * 16512 - (128 * 128 - 128) // 2))      # no divisor: not priced
    shapes = [Shape("prefill", ((n, c),)) for n in (16, 128, 512, 2048, 4096, 8192)
              for c in (0, 1024, 4096, 8192, 16384)]
    shapes += [Shape("multi_prefill", ((n, 0),) * k) for n in (64, 1024) for k in (2, 4, 8, 16)]
    table, batches = _table(shapes, cm, loop=False)
    np.testing.assert_allclose(cm.predict_table(table), [cm.step_time_s(b) for b in batches], rtol=1e-12)
    fitted = CalibratedCostModel.fit(table, knee_candidates=(None,), prefill_span_pairs=1000.0)
    for f, v in coef.items():
        assert fitted.coefficients[f] == pytest.approx(v, rel=1e-5), f
    assert CalibratedCostModel.from_dict(fitted.to_dict()).prefill_span_pairs == 1000.0


def test_the_prefill_span_divisor_follows_the_prefill_kernel():
    """prefill_span_pairs_per_key: the kernel's query tokens per program (block_m // group, block_m from its own
    rule) times the program slots, per KV head."""
    import inspect

    from engine.kernels.paged_prefill import paged_prefill_attention
    from sim.cost_model.calibrated_fit import prefill_span_pairs_per_key
    from sim.cost_model.prefill_span import PREFILL_BLOCK_M, PREFILL_PROGRAMS_PER_SM
    assert inspect.signature(paged_prefill_attention).parameters["block_m"].default == PREFILL_BLOCK_M
    assert prefill_span_pairs_per_key(132, 16, 8) == 32 * 132 * PREFILL_PROGRAMS_PER_SM / 8     # Qwen3-0.6B
    assert prefill_span_pairs_per_key(132, 32, 8) == 16 * 132 * PREFILL_PROGRAMS_PER_SM / 8
    assert prefill_span_pairs_per_key(132, 24, 8) == 21 * 132 * PREFILL_PROGRAMS_PER_SM / 8    # 64 // 3 tokens
    assert prefill_span_pairs_per_key(None, 16, 8) is None


def test_prefill_steps_pay_their_graphs_padded_tokens():
    """With prefill_graph_max_tokens, a step with prefill entries pays prefill_tokens (and the knee) on the token
    count of the CUDA graph it pads to; the serving loop's per-token cost stays on its own tokens. Above the
    largest graph, and without graphs, a step pays its own count. Table and batch forms agree."""
    from engine.core.graph_sizes import prefill_graph_sizes
    from engine.prefill_graphs import prefill_graph_sizes as engine_sizes
    from sim.cost_model.calibrated_fit import padded_step_tokens
    assert prefill_graph_sizes(8192) == engine_sizes(8192) and prefill_graph_sizes(1000) == engine_sizes(1000)
    np.testing.assert_array_equal(padded_step_tokens([1, 16, 17, 257, 1163, 3376, 8192, 8193], 8192),
                                  [16, 16, 32, 320, 1216, 3584, 8192, 8193])
    coef = dict(step=1e-3, prefill_tokens=2e-6, loop_prefill_tokens=5e-7, num_seqs=1e-5, tokens_over_knee=1e-6)
    cm = CalibratedCostModel(coefficients=coef, knee_tokens=1024, prefill_graph_max_tokens=8192)
    rng = np.random.default_rng(0)
    one = build_batch(Shape("mixed", ((1160, 0),), (500, 700, 900)), 16, 1000, 0.0, rng)     # 1,163 -> 1,216
    assert cm.step_time_s(one) == pytest.approx(1e-3 + 4e-5 + 2e-6 * (1216 - 3) + 5e-7 * 1160 + 1e-6 * (1216 - 1024))
    big = build_batch(Shape("prefill", ((9000, 0),)), 16, 1000, 0.0, rng)                     # eager: its own
    assert cm.step_time_s(big) == pytest.approx(1e-3 + 1e-5 + 2e-6 * 9000 + 5e-7 * 9000 + 1e-6 * (9000 - 1024))
    eager = CalibratedCostModel(coefficients=coef, knee_tokens=1024)
    assert eager.step_time_s(one) == pytest.approx(1e-3 + 4e-5 + 2.5e-6 * 1160 + 1e-6 * (1163 - 1024))
    shapes = [Shape("prefill", ((n, 0),)) for n in (5, 300, 1163, 3376, 9000)]
    shapes += [Shape("mixed", ((100, 0),), (40, 50)), Shape("decode", (), (30, 60))]
    table, batches = _table(shapes, cm)
    np.testing.assert_allclose(cm.predict_table(table), [cm.step_time_s(b) for b in batches], rtol=1e-12)
    assert CalibratedCostModel.from_dict(cm.to_dict()).prefill_graph_max_tokens == 8192


def test_riding_decodes_beside_the_longest_pay_two_pieces():
    """In a step run from a padded prefill graph, the decodes riding a chunk: the longest at decode_context_sum's
    price, the others' keys at mixed_decode_rest_keys up to RIDING_REST_KNEE_KEYS and mixed_decode_rest_over past it
    (by hand); table and batch forms agree; a fit gives the three prices back; a file without the two pieces (and a
    fit whose table has no key past the knee) prices them as decodes."""
    from sim.cost_model.calibrated_fit import RIDING_REST_KNEE_KEYS
    assert RIDING_REST_KNEE_KEYS == 8192
    coef = dict(step=1e-3, prefill_tokens=2e-6, num_seqs=1e-5, decode_context_sum=3e-8, lm_head_rows=4e-6,
                mixed_decode_rest_keys=5e-9, mixed_decode_rest_over=2.5e-8)
    cm = CalibratedCostModel(coefficients=coef, prefill_graph_max_tokens=8192)
    rng = np.random.default_rng(0)
    decodes = (3000,) + (1000,) * 12                           # the longest and 12,000 more keys: 8,192 + 3,808
    b = build_batch(Shape("mixed", ((500, 0),), decodes), 16, 1000, 0.0, rng)      # 513 tokens -> graph 576
    base = 1e-3 + 1e-5 * 14 + 2e-6 * (576 - 13) + 4e-6 * 14      # the whole prompt samples too
    assert cm.step_time_s(b) == pytest.approx(base + 3e-8 * 3000 + 5e-9 * 8192 + 2.5e-8 * 3808)
    assert CalibratedCostModel(coefficients={**coef, "mixed_decode_rest_keys": 3e-8, "mixed_decode_rest_over": 3e-8},
                               prefill_graph_max_tokens=8192).step_time_s(b) == pytest.approx(base + 3e-8 * 15000)
    old = {k: v for k, v in coef.items() if not k.startswith("mixed_decode_rest")}
    assert CalibratedCostModel(coefficients=old, prefill_graph_max_tokens=8192).step_time_s(b) \
        == pytest.approx(base + 3e-8 * 15000)                  # a file fitted before the pieces
    eager = CalibratedCostModel(coefficients=coef)                # no prefill graphs: every key a decode's
    assert eager.step_time_s(b) == pytest.approx(base - 2e-6 * (576 - 513) + 3e-8 * 15000)
    shapes = [Shape("mixed", ((n, 0),), (c,) + (m,) * k) for n in (200, 500, 900) for c in (2500, 3000, 4000)
              for m, k in ((200, 2), (300, 4), (500, 8), (700, 10), (1000, 12), (1500, 30))]
    shapes += [Shape("decode", (), (c,) * 8) for c in (100, 900)]
    shapes += [Shape("prefill", ((n, 0),)) for n in (100, 700, 2000)]
    table, batches = _table(shapes, cm, loop=False)
    np.testing.assert_allclose(cm.predict_table(table), [cm.step_time_s(x) for x in batches], rtol=1e-12)
    fitted = CalibratedCostModel.fit(table, knee_candidates=(None,), prefill_graph_max_tokens=8192)
    for f in ("decode_context_sum", "mixed_decode_rest_keys", "mixed_decode_rest_over"):
        assert fitted.coefficients[f] == pytest.approx(coef[f], rel=1e-5), f
    short = table[table["decode_context_sum"] - table["max_decode_context_tokens"] <= RIDING_REST_KNEE_KEYS]
    part = CalibratedCostModel.fit(short, knee_candidates=(None,), prefill_graph_max_tokens=8192)
    assert part.coefficients["mixed_decode_rest_keys"] == pytest.approx(5e-9, rel=1e-5)
    assert part.coefficients["mixed_decode_rest_over"] == part.coefficients["decode_context_sum"]


def test_the_walk_ratio_is_chosen_without_the_chunks_carrying_many_decodes(monkeypatch):
    """Chunks with 1-4 riding decodes priced at walk ratio 0.9 beside three times as many chunks carrying 12 (one
    long, eleven short) priced at 0.7: chosen on every row, the many-decode chunks win (0.7); chosen as the fit
    does, on the rows with at most WALK_RATIO_MAX_RIDING decodes, they do not."""
    import sim.cost_model.calibrated_fit as fit_module
    coef = dict(step=1e-3, prefill_tokens=2e-6, num_seqs=1e-5, decode_context_sum=3e-8, lm_head_rows=4e-6,
                mixed_decode_tail_keys=6e-7)
    few = [Shape("mixed", ((n, c),), (d,) * k) for n in (64, 256, 512) for c in (1000, 3000)
           for d in (900, 2500, 4000) for k in (1, 2, 4)]
    few += [Shape("prefill", ((n, 0),)) for n in (100, 700, 2000)] + [Shape("decode", (), (c,) * 8) for c in (100, 900)]
    many = [Shape("mixed", ((n, c),), (d,) + (500,) * 11) for n in (32, 64, 128, 256) for c in (2000, 4000, 6000)
            for d in (3000, 5000, 7000)] * 3
    t_few, _ = _table(few, CalibratedCostModel(coefficients=coef, mixed_walk_ratio=0.9), loop=False)
    t_many, _ = _table(many, CalibratedCostModel(coefficients=coef, mixed_walk_ratio=0.7), loop=False)
    table = pd.concat([t_few, t_many], ignore_index=True)
    ratios = (1.0, 0.9, 0.8, 0.7)
    assert fit_module.WALK_RATIO_MAX_RIDING == 8
    chosen = CalibratedCostModel.fit(table, knee_candidates=(None,), mixed_walk_ratios=ratios).mixed_walk_ratio
    monkeypatch.setattr(fit_module, "WALK_RATIO_MAX_RIDING", 10 ** 9)
    every_row = CalibratedCostModel.fit(table, knee_candidates=(None,), mixed_walk_ratios=ratios).mixed_walk_ratio
    assert every_row == 0.7 and chosen in (0.9, 0.8)


def test_device_fit_takes_the_runs_level_and_share():
    """A device-time table (fit_group 0 profile, 1 run) whose run rows take 0.2 ms more than the profile's
    same shapes: the profile offset absorbs the difference, so the fit prices the runs' level exactly; and
    run_share sets the runs' share of the row weights."""
    from sim.cost_model.calibrated_fit import source_weights
    cm = CalibratedCostModel(coefficients=dict(step=1e-3, num_seqs=1e-5, prefill_tokens=2e-6,
                                               decode_context_sum=2e-8), single_split_min_seqs=12)
    shapes = [Shape("decode", (), (c,) * n) for n in (1, 4, 40) for c in (50, 900)]
    shapes += [Shape("prefill", ((n, n),)) for n in (100, 2000)]
    prof, _ = _table(shapes, cm, loop=False)
    run, _ = _table(shapes * 5, cm, loop=False)
    table = pd.concat([prof.assign(fit_group=0), run.assign(fit_group=1, duration_s=run["duration_s"] + 2e-4)],
                      ignore_index=True)
    fitted = CalibratedCostModel.fit(table, knee_candidates=(None,), single_split_min_seqs=12)
    assert fitted.coefficients["step"] == pytest.approx(1.2e-3, rel=1e-6)
    assert fitted.metadata["profile_offset_s"] == pytest.approx(-2e-4, rel=1e-6)
    w = source_weights(table, run_share=0.95)
    assert w[table["fit_group"] == 1].sum() / w.sum() == pytest.approx(0.95)
    with pytest.raises(ValueError, match="run_share"):
        source_weights(table, run_share=1.0)


def test_kind_floor_lifts_a_rare_step_kind_to_its_share_of_the_runs_weight():
    """source_weights(kind_floor): among the run rows, a kind below the floor (2 intermediate chunks alone in 200
    rows) gets the floor's share, normalised with the others, which keep their proportions; the profile's share
    and every row's weight within its kind are unchanged; a floor of 0 changes nothing."""
    from sim.cost_model.calibrated_fit import STEP_KINDS, source_weights, step_kind_codes
    n_prof, n_dec, n_mix, n_chunk = 20, 150, 48, 2
    table = pd.DataFrame(dict(
        fit_group=[0] * n_prof + [1] * (n_dec + n_mix + n_chunk),
        num_prefill_seqs=[0] * n_prof + [0] * n_dec + [1] * n_mix + [1] * n_chunk,
        num_decode_seqs=[4] * n_prof + [4] * n_dec + [3] * n_mix + [0] * n_chunk,
        num_prefill_samples=[0] * n_prof + [0] * n_dec + [1] * n_mix + [0] * n_chunk))
    kind = step_kind_codes(table)
    assert [STEP_KINDS[k] for k in kind[-3:]] == ["mixed", "chunk", "chunk"]
    plain = source_weights(table, run_share=0.95)
    w = source_weights(table, run_share=0.95, kind_floor=0.05)
    run = table["fit_group"].to_numpy() == 1
    assert w[run].sum() / w.sum() == pytest.approx(0.95)
    assert np.array_equal(w[~run], plain[~run])
    share = {k: w[run & (kind == k)].sum() / w[run].sum() for k in (0, 2, 3)}
    norm = 150 / 200 + 48 / 200 + 0.05
    assert share[2] == pytest.approx(0.05 / norm)
    assert share[0] / share[3] == pytest.approx(150 / 48)
    for k in (0, 2, 3):
        assert np.ptp(w[run & (kind == k)]) == 0
    assert np.array_equal(source_weights(table, run_share=0.95, kind_floor=0.0), plain)
    with pytest.raises(ValueError, match="kind_floor"):
        source_weights(table, run_share=0.95, kind_floor=0.3)


def test_the_split_threshold_matches_the_decode_kernel(monkeypatch):
    """calibrated_fit.decode_single_split_min_seqs is the batch size from which choose_num_splits picks 1."""
    import torch

    from engine.kernels import paged_decode
    from sim.cost_model.calibrated_fit import decode_single_split_min_seqs
    for sms, kv_heads in ((132, 8), (108, 8), (132, 4), (78, 2)):
        monkeypatch.setattr(paged_decode, "_num_sms", lambda device, n=sms: n)
        first = next(n for n in range(1, 1000)
                     if paged_decode.choose_num_splits(n, kv_heads, 8192, 64, torch.device("cpu")) == 1)
        assert decode_single_split_min_seqs(sms, kv_heads) == first
    assert decode_single_split_min_seqs(None, 8) is None


def test_the_decode_graph_buckets_and_partition_match_the_engine():
    """DECODE_GRAPH_BUCKETS are the engine's smallest decode graphs and SPLIT_PARTITION_KEYS its kernel's
    shortest split partition (the graphs read from engine/core/graph_sizes.py; the partition a copy, as sim imports
    only the engine's core)."""
    from engine.core.graph_sizes import decode_graph_sizes
    from engine.kernels.paged_decode import MIN_PARTITION
    from sim.cost_model.calibrated_fit import DECODE_GRAPH_BUCKETS, SPLIT_PARTITION_KEYS
    assert tuple(decode_graph_sizes(512)[:len(DECODE_GRAPH_BUCKETS)]) == DECODE_GRAPH_BUCKETS
    assert SPLIT_PARTITION_KEYS == MIN_PARTITION


def test_batch_prices_each_swap_direction():
    cm = CalibratedCostModel(coefficients=dict(step=1.0, swap_step=10.0, swap_out_blocks=100.0,
                                               swap_in_blocks=1000.0, loop_step=0.5))
    rng = np.random.default_rng(0)
    out = build_batch(Shape("swap_out", swap_blocks=3), 16, 1000, 0.0, rng)
    inn = build_batch(Shape("swap_in", swap_blocks=3), 16, 1000, 0.0, rng)
    assert cm.step_time_s(out) == 10.0 + 300.0 + 0.5
    assert cm.step_time_s(inn) == 10.0 + 3000.0 + 0.5
    dec = build_batch(Shape("decode", decode_ctx=(5, 7)), 16, 1000, 0.0, rng)
    dec.swap_out = [(0, 0), (1, 1)]
    assert cm.step_time_s(dec) == 1.0 + 0.5 + 10.0 + 200.0


def test_features_of_hand_built_rows():
    """design_matrix on two rows written out by hand: a profile's prefill and a run's decode step with a swap-in."""
    rows = pd.DataFrame(dict(duration_s=[1.0, 1.0], num_prefill_seqs=[2, 0], num_prefill_tokens=[300, 0],
                             prefill_context_sum=[400, 0], prefill_attention_pairs=[1000, 0],
                             num_prefill_samples=[1, 0], num_decode_seqs=[0, 5], decode_context_sum=[0, 60],
                             num_swap_blocks=[0, 4], num_swapped_out=[0, 0], num_swapped_in=[0, 1],
                             serving_loop=[0, 1]))
    x = pd.DataFrame(design_matrix(rows, knee_tokens=256), columns=FEATURES)
    # no single_split_min_seqs: no decode_split_keys; 5 decode sequences pad to the graph of 8
    no_graphs = dict(decode_split_keys=0, decode_graph_1=0, decode_graph_2=0, decode_graph_4=0, decode_graph_8=0,
                     decode_graph_16=0, decode_graph_32=0, prefill_attention_span=0,
                     prefill_attention_span_alone=0, loop_hit_step=0, loop_hit_blocks=0, cold_step=0,
                     mixed_decode_rest_keys=0, mixed_decode_rest_over=0)      # no prefill graphs: no riding pieces
    # prefill_small_tokens: min(300, 256); decode_step: 1 on the pure-decode row only
    assert x.iloc[0].to_dict() == dict(step=1, eager_step=1, prefill_small_tokens=256, decode_step=0, num_seqs=2,
                                       prefill_tokens=300,
                                       prefill_attention_pairs=1000, decode_context_sum=0, lm_head_rows=1,
                                       tokens_over_knee=44, swap_step=0, swap_out_blocks=0, swap_in_blocks=0,
                                       loop_step=0, loop_seqs=0, loop_prefill_tokens=0, prefill_context_tokens=400,
                                       loop_prefill_step=0, mixed_decode_tail_keys=0, decode_tail_keys=0, tier_step=0,
                                       tier_out_blocks=0, tier_in_blocks=0, lm_head_step=1, **no_graphs)
    assert x.iloc[1].to_dict() == dict(step=1, eager_step=0, prefill_small_tokens=0, decode_step=1,
                                       num_seqs=5, prefill_tokens=0,
                                       prefill_attention_pairs=0, decode_context_sum=60, lm_head_rows=5,
                                       tokens_over_knee=0, swap_step=1, swap_out_blocks=0, swap_in_blocks=4,
                                       loop_step=1, loop_seqs=5, loop_prefill_tokens=0, prefill_context_tokens=0,
                                       loop_prefill_step=0, mixed_decode_tail_keys=0, decode_tail_keys=0, tier_step=0,
                                       tier_out_blocks=0, tier_in_blocks=0, lm_head_step=1,
                                       **dict(no_graphs, decode_graph_8=1))
    # cold_step: a run row scheduled after the loop idled COLD_IDLE_S or more (idle_before_s); never a profile row
    from sim.cost_model.calibrated_fit import COLD_IDLE_S
    for loop, idle, want in ((1, COLD_IDLE_S, 1), (1, 0.5 * COLD_IDLE_S, 0), (1, np.nan, 0), (0, 1.0, 0)):
        x = design_matrix(rows.assign(serving_loop=[loop, loop], idle_before_s=[idle, idle]), knee_tokens=256)
        assert x[:, FEATURES.index("cold_step")].tolist() == [want, want], (loop, idle)
    # an intermediate chunk samples nothing: no LM-head row, so no LM-head weight read (lm_head_step 0)
    inter = design_matrix(rows.assign(num_prefill_samples=[0, 0]), knee_tokens=256)
    assert (inter[0, FEATURES.index("lm_head_rows")], inter[0, FEATURES.index("lm_head_step")]) == (0, 0)
    assert inter[1, FEATURES.index("lm_head_step")] == 1
    run_prefill = design_matrix(rows.assign(serving_loop=[1, 1]), knee_tokens=256)[0]
    assert run_prefill[FEATURES.index("loop_prefill_tokens")] == 300     # schedule()'s work on its 300 tokens
    # prefix hits admitted (the recorder's num_gpu_hit_blocks): host work of the serving loop, none in a profile
    hits = rows.assign(num_gpu_hit_blocks=[25, 0])
    for loop, want in ((0, (0, 0)), (1, (1, 25))):
        x = design_matrix(hits.assign(serving_loop=[loop, loop]), knee_tokens=256)
        assert (x[0, FEATURES.index("loop_hit_step")], x[0, FEATURES.index("loop_hit_blocks")]) == want
        assert x[1, FEATURES.index("loop_hit_step")] == x[1, FEATURES.index("loop_hit_blocks")] == 0


def test_prefix_hits_are_host_work_before_the_launch():
    """A batch admitting prefix-cache hits pays loop_hit_step + loop_hit_blocks a block, in step_time_s and (with a
    device model, which has no such cost) all of it in the host's part before the launch."""
    coef = dict(step=1e-3, num_seqs=1e-5, prefill_tokens=2e-6, loop_step=1e-4, loop_hit_step=5e-4,
                loop_hit_blocks=2e-6)
    device = CalibratedCostModel(coefficients=dict(step=1e-3, num_seqs=1e-5, prefill_tokens=2e-6))
    cm = CalibratedCostModel(coefficients=coef, device=device)
    b = build_batch(Shape("prefill", ((100, 0),)), 16, 1000, 0.0, np.random.default_rng(0))
    base = cm.step_time_s(b)
    before, dev, after = cm.overlap_parts_s(b)
    b.num_gpu_hit_blocks = 40
    assert cm.step_time_s(b) == pytest.approx(base + 5e-4 + 40 * 2e-6, rel=1e-12)
    before2, dev2, after2 = cm.overlap_parts_s(b)
    assert (dev2, after2) == (dev, after) and before2 == pytest.approx(before + 5e-4 + 80e-6, rel=1e-12)
    no_device = CalibratedCostModel(coefficients=coef)
    assert no_device.host_time_s(b) == pytest.approx(1e-4 + 5e-4 + 80e-6, rel=1e-12)


def test_decode_fast_path_matches_step_by_step():
    cm = CalibratedCostModel(coefficients=COEF, single_split_min_seqs=SPLIT, knee_tokens=16)
    for n, s0, k in ((1, 5, 7), (20, 400, 50), (3, 3, 1)):
        ref = [cm.step_time_from_shape([], [], n, s0 + i * n) for i in range(k)]
        np.testing.assert_allclose(cm.decode_step_times_s(n, s0, k), ref, rtol=1e-12)
    assert len(cm.decode_step_times_s(4, 10, 0)) == 0


def test_table_and_batch_forms_agree():
    cm = CalibratedCostModel(coefficients=COEF, single_split_min_seqs=SPLIT, knee_tokens=64)
    table, batches = _table(_shapes(), cm)
    np.testing.assert_allclose(cm.predict_table(table), [cm.step_time_s(b) for b in batches], rtol=1e-12)


def test_overlap_parts_table_is_overlap_parts_s_of_every_row():
    """The table form of a device-plus-host model's three parts (before the launch, device, after the tokens)
    equals the batch form row by row, and the parts add up to the step's price."""
    device = CalibratedCostModel(coefficients={k: 0.8 * v for k, v in COEF.items()}, single_split_min_seqs=SPLIT,
                                 knee_tokens=64)
    cm = CalibratedCostModel(coefficients=dict(COEF, loop_step=2e-5, loop_seqs=1e-6), single_split_min_seqs=SPLIT,
                             knee_tokens=64, device=device)
    table, batches = _table(_shapes(), cm)
    parts = np.column_stack(cm.overlap_parts_table(table))
    np.testing.assert_allclose(parts, [cm.overlap_parts_s(b) for b in batches], rtol=1e-12, atol=1e-15)
    np.testing.assert_allclose(parts.sum(axis=1), cm.predict_table(table), rtol=1e-12)
    assert (parts[:, 2] > 0).any() and (parts[:, 0] > 0).any()


def test_v1_file_loads_with_one_swap_cost_for_both_directions(tmp_path):
    v1 = {"format": "servelab.calibrated_cost_model/v1", "knee_tokens": 2048, "block_size": 16,
          "coefficients": {"step": 4e-3, "prefill_step": 2e-2, "swap_step": 3e-4, "swap_blocks": 2e-4,
                           "tokens_over_knee": 4e-6}}
    cm = CalibratedCostModel(v1)
    assert cm.coefficients["eager_step"] == 2e-2
    assert cm.coefficients["swap_out_blocks"] == cm.coefficients["swap_in_blocks"] == 2e-4
    assert cm.to_dict()["format"] == "servelab.calibrated_cost_model/v3"


def test_round_trip_and_registry(tmp_path):
    cm = CalibratedCostModel(coefficients=COEF,
                             single_split_min_seqs=SPLIT, knee_tokens=128, metadata={"hardware": "H200"})
    path = cm.save(tmp_path / "p.json")
    data = json.loads(path.read_text())
    assert data["format"] == "servelab.calibrated_cost_model/v3" and data["metadata"]["hardware"] == "H200"
    for other in (CalibratedCostModel.load(path), CalibratedCostModel.from_dict(data),
                  get_cost_model("calibrated", profile=str(path))):
        assert other.coefficients == cm.coefficients and other.knee_tokens == 128
        assert other.step_time_from_shape([100], [300], 5, 700) == cm.step_time_from_shape([100], [300], 5, 700)


def test_bad_inputs_fail_clearly(tmp_path):
    with pytest.raises(ValueError, match="coefficients must be finite and >= 0"):
        CalibratedCostModel(coefficients={"step": -1.0})
    with pytest.raises(ValueError, match="unknown coefficient"):
        CalibratedCostModel(coefficients={"stepp": 1.0})
    with pytest.raises(ValueError, match="needs profile="):
        CalibratedCostModel()
    bad = tmp_path / "x.json"
    bad.write_text(json.dumps({"format": "something-else"}))
    with pytest.raises(CostModelError, match="not a calibrated cost model file"):
        CalibratedCostModel(bad)
    cm = CalibratedCostModel(coefficients=COEF, single_split_min_seqs=SPLIT)
    with pytest.raises(CostModelError, match="smaller than its new tokens"):
        cm.step_time_from_shape([10], [5], 0, 0)
    with pytest.raises(ValueError, match="lacks column"):
        design_matrix(pd.DataFrame({"duration_s": [1.0]}), None)


def _grid_table(shapes, cost_of, loop: bool = False):
    """A steps table of `shapes` (as experiments.profile writes it) timed by cost_of(batch) -> seconds."""
    rng = np.random.default_rng(2)
    rec, batches = Recorder(), []
    for i, sh in enumerate(shapes):
        b = build_batch(sh, 16, 1000, 0.0, rng)
        if sh.prefills and i % 3 == 0:      # an intermediate chunk: nothing sampled (else lm_head_rows ~ num_seqs)
            b.seqs[0].token_ids.extend([1] * 10)
        batches.append(b)
        rec.on_step(0.0, 0.0, b, 0, 0, 0)
    table = rec.steps_frame().assign(block_size=16, serving_loop=int(loop), kind=[sh.kind for sh in shapes],
                                      num_swap_out_blocks=[len(b.swap_out) for b in batches],
                                      num_swap_in_blocks=[len(b.swap_in) for b in batches])
    return table.assign(duration_s=[cost_of(b) for b in batches])


def test_fit_recovers_the_kv_read_and_loop_prefill_terms_on_the_long_grid():
    """The full grid to 16k tokens (prefix-cache hits, long chunks, long-tail decodes) plus a replay of its shapes:
    the fit gives back prefill_context_tokens (keys a prefill reads) and loop_prefill_step exactly."""
    from experiments.profile import grid_shapes
    coef = dict(COEF, loop_hit_step=0.0, loop_hit_blocks=0.0)      # its batches admit no prefix-cache hits
    truth = CalibratedCostModel(coefficients=coef, single_split_min_seqs=SPLIT, knee_tokens=4096)
    shapes = grid_shapes("full", 16384, 16384, 256)
    profile = _grid_table(shapes, truth.step_time_s)          # execute() alone: priced without the loop terms
    profile = profile.assign(duration_s=truth.predict_table(profile))
    run = _grid_table([s for s in shapes if not s.swap_blocks], truth.step_time_s, loop=True).drop(columns="kind")
    fitted = CalibratedCostModel.fit(pd.concat([profile, run], ignore_index=True),
                                     single_split_min_seqs=SPLIT, knee_candidates=(None, 2048, 4096))
    assert fitted.knee_tokens == 4096
    for f in FEATURES:
        assert fitted.coefficients[f] == pytest.approx(coef[f], rel=1e-5, abs=1e-15), f
    assert fitted.envelope["max_prefill_context_tokens"] == 16384 and fitted.envelope["max_batch_size"] == 256


def test_fit_on_the_short_grid_extrapolates_a_roofline_cost_law_to_40k_tokens():
    """Synthetic cost law: the roofline with latency floors and engine-like efficiencies (each kernel group bound by
    compute or by memory, so not linear in the terms). Fitted on the full grid at max_model_len 4,096, the model
    prices the long-end shapes (contexts and prefills to 40,960 tokens) within 10% each, 2.5% median and 2% in sum
    (measured: 9.3%, 1.7%, -1.4%). The exception: a short chunk beside one decode ten times longer than any the
    grid holds (within 30%, measured 25%; 18% before the decode-graph terms, which take part of the law's
    small-batch cost from `step` and `num_seqs`). The law has no serial-key cost, and the fit gives
    mixed_decode_tail_keys a small share of the law's non-linear attention cost at 4,096 keys, which then grows
    linearly to 40,960."""
    from experiments.profile import grid_shapes
    from sim.cost_model.roofline import RooflineCostModel
    law = RooflineCostModel("Qwen3-0.6B", "H200", matmul_efficiency=0.6, attention_efficiency=0.5,
                            memory_efficiency=0.7, overhead_s=1.5e-3, per_seq_overhead_s=2e-6, latency_floors=True)
    short = grid_shapes("full", 4096, 16384, 256)
    seen = {s.label for s in short}
    far = [s for s in grid_shapes("full", 40960, 16384, 256) if s.label not in seen and not s.swap_blocks]
    assert max(max((n + c for n, c in s.prefills), default=0) for s in far) == 40960
    fitted = CalibratedCostModel.fit(_grid_table(short, law.step_time_s))
    test = _grid_table(far, law.step_time_s)
    pred, true = fitted.predict_table(test), test["duration_s"].to_numpy()
    err = np.abs(pred / true - 1)
    one_long = np.array([s.kind == "mixed" and len(s.decode_ctx) == 1 and s.decode_ctx[0] > 4096 for s in far])
    assert err[~one_long].max() < 0.10 and err[one_long].max() < 0.30
    assert np.median(err) < 0.025 and abs(pred.sum() / true.sum() - 1) < 0.02


def test_v2_file_loads_with_the_new_terms_at_zero_and_no_envelope():
    v2 = {"format": "servelab.calibrated_cost_model/v2", "knee_tokens": 8192, "block_size": 16,
          "coefficients": {f: v for f, v in COEF.items() if f not in ("prefill_context_tokens", "loop_prefill_step",
                                                                    "prefill_small_tokens", "decode_step",
                                                                    "lm_head_step")},
          "fitted_range": {"num_prefill_tokens": [0, 4096]}, "metadata": {"hardware": "H200"}}
    cm = CalibratedCostModel(v2)
    assert cm.coefficients["prefill_context_tokens"] == 0.0 and cm.coefficients["loop_prefill_step"] == 0.0
    assert cm.envelope is None
    assert cm.step_time_from_shape([100], [300], 0, 0) == pytest.approx(
        COEF["step"] + COEF["loop_step"] + COEF["eager_step"] + COEF["num_seqs"] + COEF["loop_seqs"]
        + 100 * (COEF["prefill_tokens"] + COEF["loop_prefill_tokens"]) + COEF["lm_head_rows"]
        + COEF["prefill_attention_pairs"] * (100 * 300 - 100 * 99 // 2))
    assert cm.to_dict()["format"] == "servelab.calibrated_cost_model/v3"


def test_envelope_round_trips_and_a_bad_one_is_refused(tmp_path):
    env = {k: 10 for k in ("max_prefill_tokens", "max_prefill_context_tokens", "max_decode_context_tokens",
                           "max_batch_size", "max_num_batched_tokens", "max_decode_context_sum",
                           "max_prefill_attention_pairs", "max_swap_blocks")}
    cm = CalibratedCostModel(coefficients=COEF, single_split_min_seqs=SPLIT, knee_tokens=128, envelope=env)
    assert CalibratedCostModel.load(cm.save(tmp_path / "p.json")).envelope == env
    data = cm.to_dict()
    del data["envelope"]["max_batch_size"]
    with pytest.raises(ValueError, match="envelope lacks \\['max_batch_size'\\]"):
        CalibratedCostModel(data)


def test_a_mixed_step_priced_by_its_decode_tail_pays_its_tier_copies_too():
    """A step with prefill entries and a long decode (mixed_decode_tail_keys) that also offloads to the CPU tier:
    both terms, neither replacing the other."""
    rng = np.random.default_rng(0)
    cm = CalibratedCostModel(coefficients=COEF, single_split_min_seqs=SPLIT, knee_tokens=64)
    no_tail = CalibratedCostModel(coefficients={**COEF, "mixed_decode_tail_keys": 0.0}, knee_tokens=64)
    plain = build_batch(Shape("mixed", ((32, 0),), (900,)), 16, 1000, 0.0, rng)
    tier = build_batch(Shape("tier_out", ((32, 0),), (900,), tier_blocks=4), 16, 1000, 0.0, rng)
    copies = cm.with_tier_copies_s(0.0, 4, 0, 16)
    assert copies > 0 and cm.step_time_s(plain) > no_tail.step_time_s(plain)
    assert cm.step_time_s(tier) == pytest.approx(cm.step_time_s(plain) + copies, rel=1e-12)


def test_prefill_span_grid_prices_the_kernels_makespan():
    """With prefill_span_grid, prefill_attention_span is the makespan of the prefill kernel's programs
    (sim/cost_model/prefill_span.py) in the batch form and the table form alike, and a file keeps the grid."""
    from sim.cost_model.prefill_span import PrefillSpanGrid
    grid = PrefillSpanGrid(slots=264, num_kv_heads=8, tile_tokens=32)
    coef = dict(step=1e-3, prefill_tokens=2e-6, prefill_attention_pairs=1e-10, prefill_attention_span=3e-7)
    cm = CalibratedCostModel(coefficients=coef, prefill_span_grid=grid, prefill_span_pairs=1000.0)
    rng = np.random.default_rng(0)
    whole = build_batch(Shape("prefill", ((8192, 0),)), 16, 1000, 0.0, rng)
    pairs = 8192 * 8193 // 2
    assert cm.step_time_s(whole) == pytest.approx(1e-3 + 2e-6 * 8192 + 1e-10 * pairs + 3e-7 * 37376)
    shapes = [Shape("prefill", ((n, c),)) for n in (16, 512, 2048, 8192) for c in (0, 8192)]
    shapes += [Shape("multi_prefill", ((n, 0),) * k) for n in (64, 1024) for k in (2, 4)]
    table, batches = _table(shapes, cm, loop=False)
    np.testing.assert_allclose(cm.predict_table(table), [cm.step_time_s(b) for b in batches], rtol=1e-12)
    again = CalibratedCostModel.from_dict(json.loads(json.dumps(cm.to_dict())))
    assert again.prefill_span_grid == grid
    np.testing.assert_allclose(again.predict_table(table), table["duration_s"], rtol=1e-12)


def test_prefill_span_prices_lone_programs_and_the_longest_walk():
    """prefill_attention_span_alone prices the keys of a step whose programs each have an SM (a 512-token chunk:
    128 programs on 132 SMs), prefill_attention_span the rest (1,024 tokens: 256); a file without the split prices
    both alike. Resident programs walk the longest entry (max_prefill_context_tokens), in both forms."""
    from sim.cost_model.prefill_span import PrefillSpanGrid
    grid = PrefillSpanGrid(slots=264, num_kv_heads=8, tile_tokens=32)
    coef = dict(step=1e-3, prefill_tokens=2e-6, prefill_attention_span=3e-7, prefill_attention_span_alone=2e-7)
    cm = CalibratedCostModel(coefficients=coef, prefill_span_grid=grid)
    rng = np.random.default_rng(0)
    lone = build_batch(Shape("prefill", ((512, 16384),)), 16, 2000, 0.0, rng)
    paired = build_batch(Shape("prefill", ((1024, 16384),)), 16, 2000, 0.0, rng)
    assert cm.step_time_s(lone) == pytest.approx(1e-3 + 2e-6 * 512 + 2e-7 * (16896 + 64))
    assert cm.step_time_s(paired) == pytest.approx(1e-3 + 2e-6 * 1024 + 3e-7 * (17408 + 64))
    one_cost = CalibratedCostModel(coefficients={k: v for k, v in coef.items() if k != "prefill_attention_span_alone"},
                                   prefill_span_grid=grid)
    assert one_cost.coefficients["prefill_attention_span_alone"] == 3e-7
    # a 100-token tail on 4k cached keys beside a fresh 400-token prompt: 16 tiles x 8 heads resident, the
    # step lasts the 4,196-key walk (the mean entry's would be 2,298)
    ragged = build_batch(Shape("multi_prefill", ((100, 4096), (400, 0))), 16, 2000, 0.0, rng)
    assert cm.step_time_s(ragged) == pytest.approx(1e-3 + 2e-6 * 500 + 2e-7 * (66 + 1) * 64)
    table, batches = _table([Shape("multi_prefill", ((100, 4096), (400, 0))), Shape("prefill", ((512, 16384),)),
                             Shape("prefill", ((1024, 16384),)), Shape("multi_prefill", ((2048, 0), (1024, 8192)))],
                            cm, loop=False)
    assert table["max_prefill_context_tokens"].iloc[0] == 4196
    np.testing.assert_allclose(cm.predict_table(table), [cm.step_time_s(b) for b in batches], rtol=1e-12)
    # a ragged_entries grid: the batch form schedules each entry, the table form reads two entries back exactly
    ragged_grid = PrefillSpanGrid.from_counts(num_sms=132, num_q_heads=16, num_kv_heads=8)
    rcm = CalibratedCostModel(coefficients=coef, prefill_span_grid=ragged_grid)
    two = [Shape("multi_prefill", ((6000, 0), (1500, 0))), Shape("multi_prefill", ((300, 6000), (212, 0))),
           Shape("multi_prefill", ((2048, 0), (1024, 8192)))]
    table, batches = _table(two, rcm, loop=False)
    np.testing.assert_allclose(rcm.predict_table(table), [rcm.step_time_s(b) for b in batches], rtol=1e-12)
    assert rcm.step_time_s(batches[0]) > cm.step_time_s(batches[0])      # the 6k prompt's walk, not 3.75k's
    assert CalibratedCostModel.from_dict(json.loads(json.dumps(rcm.to_dict()))).prefill_span_grid == ragged_grid


def test_device_plus_host_fit_recovers_both_shares():
    """A device model and the serving loop's synchronous rows priced as device + host terms + the loop's gap:
    fit_device_plus_host gives back the host terms alone on what the device model leaves (coefficients = the two
    sums), so host_time_s is exactly those terms and a prefill's host share follows its own per-token cost."""
    device = CalibratedCostModel(coefficients=dict(step=1e-3, num_seqs=1e-5, prefill_tokens=2e-6,
                                                   prefill_attention_pairs=1e-10, decode_context_sum=2e-8),
                                 single_split_min_seqs=SPLIT)
    host = dict(step=2e-4, eager_step=3e-4, num_seqs=4e-6, loop_prefill_tokens=2e-7)
    shapes = [Shape("decode", (), (c,) * n) for n in (1, 4, 40) for c in (50, 900)]
    shapes += [Shape("prefill", ((n, 0),)) for n in (100, 700, 2000, 5000)] * 3
    shapes += [Shape("mixed", ((n, 0),), (300,) * 3) for n in (64, 512)]
    truth = CalibratedCostModel(coefficients={f: device.coefficients[f] + host.get(f, 0.0) for f in FEATURES},
                                single_split_min_seqs=SPLIT)
    run, batches = _table(shapes, truth, loop=True)
    seqs = run["num_prefill_seqs"] + run["num_decode_seqs"]
    gap = 3e-5 + 2e-6 * seqs                                    # the loop's host gap after each step
    run = run.assign(measured_duration_s=run["duration_s"], duration_s=run["duration_s"] + gap)
    fitted = CalibratedCostModel.fit_device_plus_host(run, device)
    assert fitted.device_model is device
    assert fitted.coefficients["loop_step"] == pytest.approx(3e-5, rel=1e-4)
    assert fitted.coefficients["loop_seqs"] == pytest.approx(2e-6, rel=1e-4)
    for f in FEATURES:
        want = device.coefficients[f] + host.get(f, 0.0) + dict(loop_step=3e-5, loop_seqs=2e-6).get(f, 0.0)
        assert fitted.coefficients[f] == pytest.approx(want, rel=1e-4, abs=1e-12), f
    b = batches[len(shapes) - 3]                                # a 5,000-token prefill
    want = 2e-4 + 3e-4 + 4e-6 + 2e-7 * 5000 + 3e-5 + 2e-6
    assert fitted.host_time_s(b) == pytest.approx(want, rel=1e-4)
    # a profile alone (no serving-loop rows): nothing to fit the host terms on
    prof, _ = _table(shapes, device, loop=False)
    assert CalibratedCostModel.fit_device_plus_host(prof, device) is None


def test_the_forward_base_is_made_unique():
    """step, eager_step and decode_step price two bases (a prefill step's, a decode step's); canonical_step_base
    keeps both and zeroes the smaller of the two extras, whichever split the fit found."""
    from sim.cost_model.calibrated_fit import canonical_step_base
    i = {f: FEATURES.index(f) for f in ("step", "eager_step", "decode_step")}
    for step, eager, dec in ((1e-3, 4e-4, 1e-4), (0.0, 1.4e-3, 1.1e-3), (1.1e-3, 3e-4, 0.0)):
        coef = np.zeros(len(FEATURES))
        coef[[i["step"], i["eager_step"], i["decode_step"]]] = step, eager, dec
        got = canonical_step_base(coef)
        assert got[i["step"]] + got[i["eager_step"]] == pytest.approx(step + eager)       # a prefill step's base
        assert got[i["step"]] + got[i["decode_step"]] == pytest.approx(step + dec)         # a decode step's
        assert min(got[i["eager_step"]], got[i["decode_step"]]) == 0.0


def test_a_scaled_model_prices_everything_that_much_longer():
    """scaled(f): every price f times as long (batch, fast decode path, overlapped table, the device model's)."""
    cm = CalibratedCostModel(coefficients=COEF, single_split_min_seqs=SPLIT, knee_tokens=256)
    cm.device_model = CalibratedCostModel(coefficients=dict(step=1e-3, prefill_tokens=2e-6))
    cm = CalibratedCostModel.from_dict(cm.to_dict())
    big = cm.scaled(1.25)
    table, batches = _table(_shapes(), cm)
    np.testing.assert_allclose([big.step_time_s(b) for b in batches], [1.25 * cm.step_time_s(b) for b in batches])
    np.testing.assert_allclose(big.decode_step_times_s(3, 300, 5), 1.25 * cm.decode_step_times_s(3, 300, 5))
    np.testing.assert_allclose(big.predict_table(table, overlapped=True),
                               1.25 * cm.predict_table(table, overlapped=True))
    np.testing.assert_allclose(big.device_model.predict_table(table), 1.25 * cm.device_model.predict_table(table))
    with pytest.raises(ValueError, match="factor > 0"):
        cm.scaled(0)


def test_prefill_host_after_share_is_what_the_launches_leave_of_the_host_cost_a_token():
    """The launch's slope in prefill tokens (launch_host_s, prefill-only rows without copies) over the host's cost
    a token gives the share after the tokens: 0.2 of 0.5 us leaves 0.6; clipped to [0, 1]; None without enough
    rows or a host cost; the share survives a save and moves host time from before the launch to after."""
    from sim.cost_model.calibrated_fit import MIN_LAUNCH_ROWS, prefill_host_after_share
    rng = np.random.default_rng(0)
    n = 200
    tokens = rng.integers(16, 8192, size=n).astype(float)
    decode = (np.arange(n) % 4 == 0).astype(float) * 8          # mixed rows: not read
    table = pd.DataFrame(dict(num_prefill_seqs=1.0, num_prefill_tokens=tokens, num_decode_seqs=decode,
                              num_swap_blocks=0.0, launch_host_s=1e-3 + 0.2e-6 * tokens + 5e-3 * (decode > 0)))
    assert prefill_host_after_share([table], 0.5e-6) == pytest.approx(0.6, abs=1e-6)
    assert prefill_host_after_share([table], 0.1e-6) == 0.0 and prefill_host_after_share([table], 0.0) is None
    assert prefill_host_after_share([table.iloc[:MIN_LAUNCH_ROWS - 1]], 0.5e-6) is None
    assert prefill_host_after_share([table.drop(columns="launch_host_s")], 0.5e-6) is None
    device = CalibratedCostModel(coefficients=dict(step=1e-3, prefill_tokens=1e-6))
    cm = CalibratedCostModel(coefficients=dict(step=1.2e-3, prefill_tokens=1e-6, loop_prefill_tokens=0.5e-6,
                                               loop_step=1e-4), device=device)
    assert cm.host_prefill_token_s == pytest.approx(0.5e-6)
    shared = CalibratedCostModel.from_dict(json.loads(json.dumps(cm.with_prefill_host_after_share(0.6).to_dict())))
    assert shared.prefill_host_after_share == 0.6
    batch = build_batch(Shape("prefill", ((4000, 0),)), 16, 2000, 0.0, rng)
    pre0, dev0, loop0 = cm.overlap_parts_s(batch)
    pre, dev, loop = shared.overlap_parts_s(batch)
    assert dev == dev0 and loop - loop0 == pytest.approx(0.6 * 0.5e-6 * 4000)
    assert pre + loop == pytest.approx(pre0 + loop0)
    with pytest.raises(ValueError, match="prefill_host_after_share must be in"):
        cm.with_prefill_host_after_share(1.5)


def test_the_fit_finds_the_walk_ratio_a_riding_decode_costs_from():
    """mixed_walk_ratio: a riding decode's keys cost from that share of the chunk's context on. A table priced with
    0.9 or 0.8 is fitted back with that ratio (and its coefficients) from the default candidates, the least of the
    training errors the fit records per candidate; one priced with 1.0 keeps 1.0; the ratio is saved, loaded and
    priced the same way by the batch and the shape forms."""
    walk = [Shape("mixed", ((512, c - 512),), (int(f * c),) + (256,) * k) for c in (1024, 2048, 3072)
            for f in (0.7, 0.85, 0.95, 1.0, 1.2) for k in (0, 2)]
    for ratio in (0.8, 0.9, 1.0):
        truth = CalibratedCostModel(coefficients=COEF, single_split_min_seqs=SPLIT, knee_tokens=256,
                                    mixed_walk_ratio=ratio)
        table, batches = _table(_shapes() + walk, truth, loop=False)
        fitted = CalibratedCostModel.fit(table, single_split_min_seqs=SPLIT, knee_candidates=(256,),
                                         mixed_walk_ratios=MIXED_WALK_RATIOS)
        assert fitted.mixed_walk_ratio == ratio
        errors = fitted.metadata["mixed_walk_ratio_errors"]     # the search, one error per candidate
        assert list(errors) == [f"{r:g}" for r in MIXED_WALK_RATIOS]
        assert min(errors, key=errors.get) == f"{ratio:g}"
        assert fitted.coefficients["mixed_decode_tail_keys"] == pytest.approx(COEF["mixed_decode_tail_keys"],
                                                                              rel=1e-5)
        again = CalibratedCostModel.from_dict(fitted.to_dict())
        assert again.mixed_walk_ratio == ratio
        np.testing.assert_allclose([again.step_time_s(b) for b in batches], table["duration_s"], rtol=1e-7)
    cm = CalibratedCostModel(coefficients=dict(step=1.0, mixed_decode_tail_keys=1.0), mixed_walk_ratio=0.9)
    assert cm.step_time_from_shape([512], [2048], 1, 2000, max_decode_context_len=2000) == pytest.approx(
        1.0 + (2000 - 0.9 * 2048))
    with pytest.raises(ValueError, match="mixed_walk_ratio"):
        CalibratedCostModel(coefficients=dict(step=1.0), mixed_walk_ratio=1.5)


def test_riding_decodes_are_priced_by_how_far_they_lengthen_the_prefill_makespan():
    """mixed_walk_makespan (fits made with a grid and prefill graphs): a chunk's riding decodes pay
    mixed_decode_tail_keys on PrefillSpanGrid.riding_walk_keys (at 1 / mixed_walk_ratio a key), so 24 decodes of
    1,024 keys beside a 512-token chunk on 2,048 keys, which none outwalks, lengthen the step by their queue for
    program slots; the batch form, the table form and a saved file agree; a fit recovers the ratio and the price;
    a file without the key keeps the longest decode's rule."""
    from sim.cost_model.prefill_span import PrefillSpanGrid
    grid = PrefillSpanGrid.from_counts(num_sms=132, num_q_heads=16, num_kv_heads=8)
    coef = dict(step=1e-3, prefill_tokens=2e-6, num_seqs=1e-5, decode_context_sum=3e-8, lm_head_rows=4e-6,
                prefill_attention_span=6e-7, prefill_attention_span_alone=5e-7, mixed_decode_tail_keys=6e-7)
    opts = dict(prefill_span_grid=grid, prefill_graph_max_tokens=8192)
    shapes = [Shape("mixed", ((512, c - 512),), (int(f * c),) + (1024,) * k) for c in (1024, 2048, 4096)
              for f in (0.5, 0.9, 1.1, 1.6) for k in (0, 3, 12, 23, 40)]
    shapes += [Shape("prefill", ((n, 0),)) for n in (100, 700, 2000, 5000)] + [Shape("decode", (), (c,) * 8)
                                                                               for c in (100, 900)]
    cm = CalibratedCostModel(coefficients=coef, mixed_walk_ratio=0.9, mixed_walk_makespan=True, **opts)
    old = CalibratedCostModel(coefficients=coef, mixed_walk_ratio=0.9, **opts)
    assert cm.mixed_walk_makespan and not old.mixed_walk_makespan
    chunk = build_batch(Shape("mixed", ((512, 1536),), (1024,) * 24), 16, 1000, 0.0, np.random.default_rng(0))
    walk = grid.riding_walk_keys([512], [2048], [1024] * 24, 1 / 0.9)
    assert walk > 1000 and cm.step_time_s(chunk) - old.step_time_s(chunk) == pytest.approx(6e-7 * walk)
    table, batches = _table(shapes, cm, loop=False)
    np.testing.assert_allclose([cm.step_time_s(b) for b in batches], table["duration_s"], rtol=1e-9)
    again = CalibratedCostModel.from_dict(json.loads(json.dumps(cm.to_dict())))
    assert again.mixed_walk_makespan
    np.testing.assert_allclose(again.predict_table(table), table["duration_s"], rtol=1e-9)
    fitted = CalibratedCostModel.fit(table, knee_candidates=(None,), mixed_walk_ratios=MIXED_WALK_RATIOS, **opts)
    assert fitted.mixed_walk_makespan and fitted.mixed_walk_ratio == 0.9
    assert fitted.coefficients["mixed_decode_tail_keys"] == pytest.approx(6e-7, rel=1e-4)
    saved = cm.to_dict()
    del saved["mixed_walk_makespan"]                      # a file fitted before it
    assert not CalibratedCostModel.from_dict(saved).mixed_walk_makespan


def test_a_split_decode_batch_is_priced_by_its_longest_programs_keys():
    """decode_split_keys follows the engine's split rule (paged_decode.choose_num_splits, 33 sequences from which
    it stops splitting): 16 sequences split each context 9 ways into whole 64-key tiles of at least 256 keys, so a
    context of 15,935 keys has programs of 1,792 keys and one of 3,083 of 384; a short context is read whole; the
    batch form, the shape form, the decode fast path and the design matrix agree."""
    from sim.cost_model.calibrated_fit import decode_split_keys, split_walk_keys
    assert split_walk_keys(15935, 16, 33) == 1792 and split_walk_keys(3083, 16, 33) == 384
    assert split_walk_keys(100, 1, 33) == 100 and split_walk_keys(1000, 1, 33) == 256
    assert split_walk_keys(20000, 1, 33) == 320            # 64 splits at most (paged_decode.MAX_SPLITS)
    cm = CalibratedCostModel(coefficients=dict(step=1.0, decode_split_keys=1.0), single_split_min_seqs=33)
    rng = np.random.default_rng(0)
    ctx = (3083,) * 15 + (15935,)
    batch = build_batch(Shape("decode", decode_ctx=ctx), 16, 1000, 0.0, rng)
    assert cm.step_time_s(batch) == pytest.approx(1.0 + 1792)
    assert cm.step_time_from_shape([], [], 16, sum(ctx), max_decode_context_len=15935) == pytest.approx(1.0 + 1792)
    steps = cm.decode_step_times_s(16, sum(ctx), 3, start_max_context=15935)
    assert steps.tolist() == pytest.approx([1.0 + 1792, 1.0 + 1792, 1.0 + 1792])   # 15,936 and 15,937 keys: 1,792
    rec = Recorder()
    rec.on_step(0.0, 0.0, batch, 0, 0, 0)
    assert decode_split_keys(rec.steps_frame(), 33).tolist() == [1792]
    assert decode_split_keys(rec.steps_frame(), None).tolist() == [0]



def test_the_walk_ratio_is_chosen_with_the_profiles_mixed_shapes_at_their_own_level(monkeypatch):
    """Replay rows and profile rows priced at walk ratio 0.9, the profile's chunks beside a decode 0.3 ms slower
    than that at every ratio (a level the replays' same shapes do not share): the ratio's fits give those rows a
    level of their own, so at 0.9 they fit exactly; at the common level they cannot."""
    import sim.cost_model.calibrated_fit as fit_module
    coef = dict(step=1e-3, prefill_tokens=2e-6, num_seqs=1e-5, decode_context_sum=3e-8, lm_head_rows=4e-6,
                mixed_decode_tail_keys=6e-7)
    cm = CalibratedCostModel(coefficients=coef, mixed_walk_ratio=0.9)
    runs = [Shape("mixed", ((n, c),), (d,) * k) for n in (64, 256, 512) for c in (1000, 3000)
            for d in (900, 2500, 4000) for k in (1, 2, 4)]
    runs += [Shape("prefill", ((n, 0),)) for n in (100, 700, 2000)]
    runs += [Shape("decode", (), (c,) * 8) for c in (100, 900)]
    walk = [Shape("mixed", ((511, c - 511),), (int(f * c),)) for c in (2048, 4096, 6144)
            for f in (0.7, 0.85, 0.95, 1.0, 1.1, 1.5)]
    plain = [Shape("prefill", ((n, c - n),)) for n in (128, 512, 2048) for c in (2048, 4096, 6144)]
    run, _ = _table(runs * 3, cm, loop=False)
    prof, _ = _table(walk + plain, cm, loop=False)
    mixed = (prof["num_prefill_seqs"] > 0) & (prof["num_decode_seqs"] > 0)
    prof["duration_s"] += np.where(mixed, 3e-4, 0.0)
    table = pd.concat([prof.assign(fit_group=0), run.assign(fit_group=1)], ignore_index=True)
    ratios = (1.0, 0.9, 0.8)

    def walk_errors():
        fitted = CalibratedCostModel.fit(table, knee_candidates=(None,), mixed_walk_ratios=ratios)
        return fitted.mixed_walk_ratio, fitted.metadata["mixed_walk_ratio_errors"]
    chosen, own = walk_errors()
    monkeypatch.setattr(fit_module, "profile_mixed_offset_columns", lambda steps, offset_cols: None)
    _, common = walk_errors()
    assert chosen == 0.9 and own["0.9"] < 1e-12 < 1e-6 < common["0.9"], (own, common)
