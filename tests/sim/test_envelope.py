"""The fitted envelope and a run's coverage by it: exact counts on hand-made step rows."""
import pandas as pd
import pytest

from sim.cost_model.envelope import ENVELOPE_KEYS, coverage, coverage_warning, envelope_of

ENV = dict(max_prefill_tokens=1000, max_prefill_context_tokens=2000, max_decode_context_tokens=3000,
           max_batch_size=8, max_num_batched_tokens=1004, max_decode_context_sum=10000,
           max_prefill_attention_pairs=10 ** 6, max_swap_blocks=4)


def steps(rows):
    cols = ("duration_s", "num_prefill_seqs", "num_prefill_tokens", "prefill_context_sum", "prefill_attention_pairs",
            "num_decode_seqs", "decode_context_sum", "num_swap_blocks", "max_prefill_context_tokens",
            "max_decode_context_tokens")
    return pd.DataFrame([dict(zip(cols, r)) for r in rows])


ROWS = [  # duration, prefill seqs, tokens, context sum, pairs, decodes, decode sum, swaps, longest prefill, decode
    (1.0, 1, 500, 500, 125250, 2, 100, 0, 500, 60),          # inside
    (2.0, 0, 0, 0, 0, 8, 9000, 0, 0, 2900),                  # inside (at the edges is inside)
    (3.0, 1, 100, 2100, 200000, 0, 0, 0, 2100, 0),           # longest prefill context 2100 > 2000
    (4.0, 0, 0, 0, 0, 4, 3100, 0, 0, 3001),                  # longest decode context 3001 > 3000
    (5.0, 0, 0, 0, 0, 9, 900, 0, 0, 100),                    # batch 9 > 8 (and 9 tokens: inside)
    (6.0, 0, 0, 0, 0, 0, 0, 5, 0, 0),                        # 5 swap blocks > 4
    (7.0, 1, 1000, 1000, 500500, 5, 500, 0, 1000, 100),      # 1,005 tokens in the pass > 1,004
]


def test_coverage_counts_steps_and_time_outside_exactly():
    cov = coverage(steps(ROWS), ENV)
    assert (cov["num_steps"], cov["num_steps_outside"]) == (7, 5)
    assert cov["share_steps_outside"] == pytest.approx(5 / 7)
    assert cov["time_s"] == 28.0 and cov["time_outside_s"] == 25.0
    assert cov["share_time_outside"] == pytest.approx(25 / 28)
    assert cov["outside_by"] == {"max_prefill_context_tokens": 1, "max_decode_context_tokens": 1,
                                 "max_batch_size": 1, "max_swap_blocks": 1, "max_num_batched_tokens": 1}
    assert coverage(steps(ROWS[:2]), ENV)["num_steps_outside"] == 0
    assert coverage(steps(ROWS), None) is None


def test_envelope_of_a_table_is_its_largest_step_and_covers_it():
    env = envelope_of(steps(ROWS))
    assert set(env) == set(ENVELOPE_KEYS)
    assert env["max_prefill_context_tokens"] == 2100 and env["max_decode_context_tokens"] == 3001
    assert env["max_num_batched_tokens"] == 1005 and env["max_batch_size"] == 9 and env["max_swap_blocks"] == 5
    assert coverage(steps(ROWS), env)["num_steps_outside"] == 0


def test_a_table_without_the_longest_context_columns_uses_the_mean_context():
    """Tables made before the columns existed: the mean context, rounded up (exact for uniform rows)."""
    old = steps(ROWS).drop(columns=["max_prefill_context_tokens", "max_decode_context_tokens"])
    env = envelope_of(old)
    assert env["max_decode_context_tokens"] == 1125          # 9000 keys over 8 decodes; 3100 / 4 -> 775
    assert env["max_prefill_context_tokens"] == 2100


def test_warning_only_past_the_threshold():
    cov = coverage(steps(ROWS), ENV)
    line = coverage_warning(cov, "profile.json")
    assert line.startswith("WARNING: 71.4% of the steps (89.3% of the simulated step time) are outside the "
                           "envelope profile.json was fitted on") and "\n" not in line
    assert coverage_warning(coverage(steps(ROWS[:2]), ENV)) is None
    assert coverage_warning(None) is None
