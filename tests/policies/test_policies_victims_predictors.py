"""Victim selection rules and output-length predictors."""
from __future__ import annotations

import numpy as np
import pytest

from policies.predictors.noisy import NoisyPredictor
from policies.predictors.oracle import OraclePredictor
from policies.victim.longest_remaining import LongestRemainingVictim
from policies.victim.lowest_priority import LowestPriorityVictim
from policies.victim.most_blocks import MostBlocksVictim
from policies.victim.newest import NewestVictim
from tests.helpers import Req, seq_of


def _seq(rid, arrival, priority=0, blocks=0, out_len=8, produced=0, admit_order=0):
    s = seq_of(Req(rid, 4, out_len, arrival=arrival, priority=priority), admit_order)
    s.block_table = list(range(blocks))
    s.token_ids.extend([0] * produced)
    s.admit_order = admit_order
    return s


def test_victim_rules_and_ties():
    a = _seq("a", 0, priority=2, blocks=5, out_len=9, produced=1, admit_order=0)   # 8 remaining
    b = _seq("b", 1, priority=2, blocks=3, out_len=9, produced=5, admit_order=1)   # 4 remaining
    c = _seq("c", 1, priority=1, blocks=5, out_len=12, produced=4, admit_order=2)  # 8 remaining
    cands = [a, b, c]
    assert NewestVictim().select(cands, None) is c              # arrival 1, admitted last
    assert LowestPriorityVictim().select(cands, None) is b      # priority 2 tie (a, b): newest b
    assert MostBlocksVictim().select(cands, None) is c          # 5 blocks tie (a, c): newest c
    assert LongestRemainingVictim().select(cands, None) is c    # 8 remaining tie (a, c): newest c
    assert LongestRemainingVictim().select([a, b], None) is a


def test_oracle_is_the_workload_length():
    assert OraclePredictor().predict(seq_of(Req("r", 3, 17), 0)) == 17


def test_noisy_is_deterministic_per_request_and_order_independent():
    seqs = [seq_of(Req(f"r{i}", 2, 100), i) for i in range(50)]
    p1, p2 = NoisyPredictor(sigma=0.8, seed=7), NoisyPredictor(sigma=0.8, seed=7)
    first = [p1.predict(s) for s in seqs]
    assert [p2.predict(s) for s in reversed(seqs)][::-1] == first     # call order does not matter
    assert [p1.predict(s) for s in seqs] == first                     # repeat calls are stable
    p1.forget("r3")
    assert p1.predict(seqs[3]) == first[3]                             # forgetting loses nothing
    assert [NoisyPredictor(sigma=0.8, seed=8).predict(s) for s in seqs] != first
    assert len(set(first)) > 10 and min(first) >= 1


def test_noisy_sigma_zero_is_oracle_and_errors_are_lognormal():
    seqs = [seq_of(Req(i, 2, 1000), 0) for i in range(2000)]   # int request ids work too
    assert [NoisyPredictor(sigma=0.0).predict(s) for s in seqs[:20]] == [1000] * 20
    p = NoisyPredictor(sigma=0.5, seed=3)
    log_err = np.log([p.error_factor(s.request_id) for s in seqs])
    assert abs(log_err.mean()) < 0.05 and abs(log_err.std() - 0.5) < 0.05   # N(0, 0.5): 2000 draws


def test_noisy_accepts_a_generator_and_rejects_bad_input():
    a = NoisyPredictor(sigma=0.5, seed=np.random.default_rng(11))
    b = NoisyPredictor(sigma=0.5, seed=np.random.default_rng(11))
    s = seq_of(Req("r", 2, 64), 0)
    assert a.seed == b.seed and a.predict(s) == b.predict(s)
    with pytest.raises(ValueError, match="sigma must be a finite float >= 0"):
        NoisyPredictor(sigma=-0.1)
    with pytest.raises(ValueError, match="seed must be an int >= 0"):
        NoisyPredictor(seed=-1)
