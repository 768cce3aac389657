"""The synthetic shared-prefix workload: groups share their prefix's whole blocks in tokens, and both the
streams and the simulator's prefix cache see exactly that."""
import numpy as np
import pandas as pd
import pytest
from hydra import compose, initialize_config_dir

from experiments.run import execute
from experiments.workloads import Fixed, Poisson, Uniform, prompt_token_ids, shared_prefix_workload, synthetic_workload
from tests.experiments.test_run import CONF, QUIET


def make(n=60, seed=3, **kw):
    args = dict(num_groups=4, prefix_len=Uniform(40, 300), suffix_len=Uniform(1, 50), output_len=Uniform(2, 9))
    args.update(kw)
    return shared_prefix_workload(n, Poisson(5.0), seed=seed, **args)


def test_groups_share_whole_prefix_blocks_in_tokens():
    wl = make()
    specs = wl.specs()
    groups = {}
    for s in specs:
        groups.setdefault(s.prefix_hash_ids, []).append(s)
    assert len(groups) == 4 and all(len(g) > 1 for g in groups.values())
    firsts = []
    for ids, members in groups.items():
        shared = 16 * len(ids)
        toks = [prompt_token_ids(s, 151_936, 0) for s in members]
        assert all(t[:shared] == toks[0][:shared] for t in toks)
        # past the whole blocks every prompt is its own (the prefix's last partial block included)
        assert all(a[shared:shared + 1] != b[shared:shared + 1] for a, b in zip(toks, toks[1:]) if len(a) > shared)
        firsts.append(toks[0][:16])
    assert len({tuple(f) for f in firsts}) == 4                # no two groups open alike
    # a prompt is its group's drawn prefix plus its suffix: at least the shared blocks, at most 15 + 50 more
    for s in specs:
        assert 16 * len(s.prefix_hash_ids) < s.num_prompt_tokens <= 16 * len(s.prefix_hash_ids) + 15 + 50


def test_seeded_and_paired_with_the_plain_synthetic_workload():
    a, b = make(seed=5), make(seed=5)
    np.testing.assert_array_equal(a.num_prompt_tokens, b.num_prompt_tokens)
    assert a.prefix_hash_ids == b.prefix_hash_ids
    assert (make(seed=6).num_prompt_tokens != a.num_prompt_tokens).any()
    # arrivals and outputs are drawn from the same streams as synthetic_workload's: a paired comparison
    plain = synthetic_workload(60, Poisson(5.0), Uniform(1, 50), Uniform(2, 9), seed=5)
    np.testing.assert_array_equal(a.arrival_time_s, plain.arrival_time_s)
    np.testing.assert_array_equal(a.num_output_tokens, plain.num_output_tokens)


def test_bad_arguments_name_the_field():
    with pytest.raises(ValueError, match="num_groups must be >= 1"):
        make(num_groups=0)
    with pytest.raises(ValueError, match="prefix_block_tokens must be >= 1"):
        make(prefix_block_tokens=0)


def test_clipping_to_max_model_len_is_counted():
    wl = make(prefix_len=Fixed(400), max_model_len=300)
    assert wl.stats.num_clipped == 60 and (wl.num_prompt_tokens + wl.num_output_tokens <= 300).all()
    # the hash ids are cut with the prompt: to the blocks it still touches
    assert all(16 * (len(h) - 1) < p for h, p in zip(wl.prefix_hash_ids, wl.num_prompt_tokens))


def test_simulated_hits_are_the_shared_blocks(tmp_path):
    # Requests 10 s apart, 10 ms a step: each finishes before the next arrives, so a request hits exactly its
    # group's whole prefix blocks once its group has been seen, and nothing before.
    overrides = ["workload=shared_prefix", "workload.num_requests=24", "workload.arrival.rate_rps=0.1",
                 "workload.num_groups=3", "workload.prefix_len.lo=100", "workload.prefix_len.hi=700",
                 "workload.suffix_len.lo=1", "workload.suffix_len.hi=40", "workload.output_len.lo=2",
                 "workload.output_len.hi=4", "backend/cost_model=constant", "backend.cost_model.step_s=0.01",
                 "model=qwen3_0p6b", "max_model_len=1024"]
    with initialize_config_dir(str(CONF), version_base="1.3"):
        cfg = compose("config", overrides=overrides + list(QUIET))
    execute(cfg, tmp_path)
    req = pd.read_parquet(tmp_path / "requests.parquet").sort_values("request_id")
    from experiments.runner_sim import build_workload
    specs = build_workload(cfg).specs()
    seen, expected = set(), []
    for s in specs:
        expected.append(16 * len(s.prefix_hash_ids) if s.prefix_hash_ids in seen else 0)
        seen.add(s.prefix_hash_ids)
    assert req["num_cached_tokens"].tolist() == expected and sum(expected) > 0
