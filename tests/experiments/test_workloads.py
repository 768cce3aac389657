"""Workloads: trace readers on the real shared files, broken files, seeded streams, prompt tokens."""

import numpy as np
import pytest

from experiments.workloads import (
    AllAtOnce,
    Constant,
    Fixed,
    FromFile,
    Gamma,
    Poisson,
    PriorityClasses,
    RequestSpec,
    Uniform,
    WorkloadFormatError,
    detect_format,
    prompt_token_ids,
    read_azure_trace,
    read_length_file,
    read_mooncake_trace,
    read_trace,
    read_vidur_trace,
    sharegpt_workload,
    synthetic_workload,
)
from tests.helpers import TRACES, trace_file

AZURE = TRACES / "AzureLLMInferenceTrace_conv.csv"
VIDUR = TRACES / "splitwise_conv.csv"
MOONCAKE = TRACES / "conversation_trace.jsonl"
MOONCAKE_SYN = TRACES / "synthetic_trace.jsonl"
SHAREGPT = TRACES / "sharegpt_8k_filtered_stats_llama2_tokenizer.csv"


def need(path):
    return trace_file(path.name)


# -- real traces -------------------------------------------------------------------
def test_azure_trace_real_file():
    wl = read_azure_trace(need(AZURE))
    assert len(wl) == 19_366 and wl.stats.num_rows_read == 19_366 and wl.stats.num_rows_skipped == 0
    assert wl.arrival_time_s[0] == 0.0 and np.all(np.diff(wl.arrival_time_s) >= 0)
    assert wl.duration_s == pytest.approx(3501.721937, abs=1e-6)       # 18:15:46.6805900 -> 19:14:08.4025270
    assert wl.arrival_time_s[1] == pytest.approx(4.314579, abs=1e-6)
    assert (wl.num_prompt_tokens[0], wl.num_output_tokens[0]) == (374, 44)
    assert wl.num_prompt_tokens.max() == 14_050 and wl.num_output_tokens.max() == 1_000
    assert wl.num_prompt_tokens.mean() == pytest.approx(1155, abs=1)
    assert wl.source_line[0] == 2 and wl.source_line[-1] == 19_367
    assert wl.prefix_hash_ids is None


def test_vidur_copy_matches_azure_row_for_row():
    az, vd = read_azure_trace(need(AZURE)), read_vidur_trace(need(VIDUR))
    assert len(vd) == 19_366
    np.testing.assert_array_equal(az.num_prompt_tokens, vd.num_prompt_tokens)
    np.testing.assert_array_equal(az.num_output_tokens, vd.num_output_tokens)
    np.testing.assert_allclose(az.arrival_time_s, vd.arrival_time_s, atol=1e-6)


def test_mooncake_trace_real_file():
    wl = read_mooncake_trace(need(MOONCAKE))
    assert len(wl) == 12_031
    assert wl.arrival_time_s[-1] == pytest.approx(3536.999)              # ms -> s
    assert len(np.unique(wl.arrival_time_s)) == 1_180
    refs = [h for hs in wl.prefix_hash_ids for h in hs]
    assert len(refs) == 288_500 and len(set(refs)) == 182_790
    assert wl.num_prompt_tokens.max() == 126_195 and wl.num_output_tokens.max() == 2_000
    assert all(len(h) == -(-p // 512) for h, p in zip(wl.prefix_hash_ids[:200], wl.num_prompt_tokens[:200]))
    syn = read_mooncake_trace(need(MOONCAKE_SYN))
    assert len(syn) == 3_993 and syn.arrival_time_s[-1] == pytest.approx(1022.025)


def test_mooncake_bucket_spreading_is_uniform_and_stays_in_bucket():
    raw = read_mooncake_trace(need(MOONCAKE))
    spread = read_mooncake_trace(MOONCAKE, spread_within_bucket=True)
    again = read_mooncake_trace(MOONCAKE, spread_within_bucket=True)
    np.testing.assert_array_equal(spread.arrival_time_s, again.arrival_time_s)
    assert len(np.unique(spread.arrival_time_s)) == len(spread)          # no ties left
    buckets = np.unique(raw.arrival_time_s)
    nxt = dict(zip(buckets[:-1], buckets[1:]))
    # every request stays within [its bucket, the next bucket); same request order
    np.testing.assert_array_equal(spread.num_prompt_tokens, raw.num_prompt_tokens)
    assert np.all(spread.arrival_time_s >= raw.arrival_time_s)
    assert all(s < nxt[r] for s, r in zip(spread.arrival_time_s, raw.arrival_time_s) if r in nxt)
    # the 4 requests of a bucket starting at 0 with next bucket 3 s later sit at 0, 0.75, 1.5, 2.25
    from experiments.workloads.formats.mooncake import spread_buckets
    np.testing.assert_allclose(spread_buckets(np.array([0, 0, 0, 0, 3.0])), [0, 0.75, 1.5, 2.25, 3.0])


def test_sharegpt_lengths_with_arrival_process():
    prompt, output, stats = read_length_file(need(SHAREGPT))
    assert len(prompt) == 30_731 and stats.num_rows_read == 30_731
    assert prompt.max() == 8_141 and output.max() == 1_024 and (prompt + output).max() <= 8_149
    wl = sharegpt_workload(SHAREGPT, Poisson(4.0), num_requests=100, seed=3)
    np.testing.assert_array_equal(wl.num_prompt_tokens, prompt[:100])   # pairs in file order
    np.testing.assert_array_equal(wl.num_output_tokens, output[:100])
    sampled = sharegpt_workload(SHAREGPT, Poisson(4.0), num_requests=500, sample=True, seed=3)
    pairs = set(zip(prompt.tolist(), output.tolist()))
    assert all(p in pairs for p in zip(sampled.num_prompt_tokens.tolist(), sampled.num_output_tokens.tolist()))
    with pytest.raises(ValueError, match="sample=True"):
        sharegpt_workload(SHAREGPT, Poisson(4.0), num_requests=40_000)


def test_read_trace_detects_format(tmp_path):
    assert detect_format(need(AZURE)) == "azure" and detect_format(VIDUR) == "vidur"
    assert detect_format(MOONCAKE) == "mooncake"
    assert len(read_trace(AZURE, max_requests=10)) == 10
    with pytest.raises(ValueError, match="sharegpt_workload"):
        detect_format(SHAREGPT)


# -- options -------------------------------------------------------------------------
def write(tmp_path, name, text):
    p = tmp_path / name
    p.write_text(text)
    return p


def test_rescaling_offset_and_max_requests(tmp_path):
    p = write(tmp_path, "t.csv", "arrived_at,num_prefill_tokens,num_decode_tokens\n"
                                 "10,5,2\n11,6,3\n13,7,4\n16,8,5\n")
    wl = read_vidur_trace(p)
    np.testing.assert_array_equal(wl.arrival_time_s, [0, 1, 3, 6])      # shifted to start at 0
    np.testing.assert_array_equal(read_vidur_trace(p, time_scale=2.0).arrival_time_s, [0, 2, 6, 12])
    fast = read_vidur_trace(p, target_rate_rps=1.0)                     # 3 gaps over 6 s = 0.5 rps -> 1 rps
    np.testing.assert_allclose(fast.arrival_time_s, [0, 0.5, 1.5, 3.0])
    assert fast.mean_rate_rps == pytest.approx(1.0)
    cut = read_vidur_trace(p, max_requests=2, start_offset_s=5.0)
    np.testing.assert_array_equal(cut.arrival_time_s, [5, 6])
    assert cut.stats.num_truncated == 2 and cut.stats.num_rows_read == 4
    with pytest.raises(ValueError, match="at most one"):
        read_vidur_trace(p, time_scale=2.0, target_rate_rps=1.0)
    with pytest.raises(TypeError, match="allowed"):
        read_vidur_trace(p, time_scael=2.0)


def test_clip_and_drop_to_max_model_len(tmp_path):
    p = write(tmp_path, "t.csv", "arrived_at,num_prefill_tokens,num_decode_tokens\n"
                                 "0,5,2\n1,9,4\n2,15,3\n3,3,3\n")
    wl = read_vidur_trace(p, max_model_len=10)
    np.testing.assert_array_equal(wl.num_prompt_tokens, [5, 9, 9, 3])
    np.testing.assert_array_equal(wl.num_output_tokens, [2, 1, 1, 3])
    assert wl.stats.num_clipped == 2 and wl.stats.num_clipped_prompt == 1
    dropped = read_vidur_trace(p, max_model_len=10, too_long="drop")
    np.testing.assert_array_equal(dropped.num_prompt_tokens, [5, 3])
    assert dropped.stats.num_dropped_too_long == 2
    with pytest.raises(ValueError, match="too_long must be one of"):
        read_vidur_trace(p, max_model_len=10, too_long="cut")


def test_clip_on_real_azure_trace_is_counted():
    wl = read_azure_trace(need(AZURE), max_model_len=4096)
    raw = read_azure_trace(AZURE)
    assert wl.stats.num_clipped == int(((raw.num_prompt_tokens + raw.num_output_tokens) > 4096).sum()) > 0
    assert ((wl.num_prompt_tokens + wl.num_output_tokens) <= 4096).all() and (wl.num_output_tokens >= 1).all()


def test_clipping_mooncake_trims_hash_ids():
    wl = read_mooncake_trace(need(MOONCAKE), max_requests=50, max_model_len=4096)
    for h, p in zip(wl.prefix_hash_ids, wl.num_prompt_tokens):
        assert len(h) == -(-int(p) // 512)


def test_unsorted_rows_are_sorted_and_counted(tmp_path):
    p = write(tmp_path, "t.csv", "arrived_at,num_prefill_tokens,num_decode_tokens\n2,5,2\n1,6,3\n3,7,4\n")
    wl = read_vidur_trace(p)
    np.testing.assert_array_equal(wl.num_prompt_tokens, [6, 5, 7])
    np.testing.assert_array_equal(wl.source_line, [3, 2, 4])
    assert wl.stats.num_reordered == 1


# -- malformed input -------------------------------------------------------------------
AZ_HEADER = "TIMESTAMP,ContextTokens,GeneratedTokens\n"
GOOD = "2023-11-16 18:15:46.6805900,374,44\n"


@pytest.mark.parametrize("bad_row, line, column", [
    ("2023-11-16 18:15:47.0000000,abc,44\n", 3, "ContextTokens"),
    ("2023-11-16 18:15:47.0000000,12,0\n", 3, "GeneratedTokens"),       # a request makes >= 1 token
    ("2023-11-16 18:15:47.0000000,12.5,3\n", 3, "ContextTokens"),
    ("not a time,12,3\n", 3, "TIMESTAMP"),
])
def test_bad_azure_cell_names_file_line_and_column(tmp_path, bad_row, line, column):
    p = write(tmp_path, "broken.csv", AZ_HEADER + GOOD + bad_row + GOOD)
    with pytest.raises(WorkloadFormatError) as e:
        read_azure_trace(p)
    assert (e.value.line, e.value.column) == (line, column)
    assert "broken.csv" in str(e.value) and f"line {line}" in str(e.value) and column in str(e.value)


def test_plain_and_pandas_timestamp_parsers_agree(tmp_path):
    """Plain timestamps are parsed by numpy, others (here a 'Z' zone) by pandas: same seconds."""
    rows = ["2023-11-16 18:15:46.6805900", "2023-11-16 18:15:52.0000001", "2023-11-17 01:00:00"]
    plain = read_azure_trace(write(tmp_path, "p.csv", AZ_HEADER + "".join(f"{t},10,2\n" for t in rows)))
    zoned = read_azure_trace(write(tmp_path, "z.csv", AZ_HEADER + "".join(f"{t}Z,10,2\n" for t in rows)))
    assert plain.arrival_time_s.tolist() == zoned.arrival_time_s.tolist()
    assert plain.arrival_time_s.tolist() == [0.0, 5.3194101, 24253.31941]


def test_field_count_and_missing_column_errors(tmp_path):
    p = write(tmp_path, "b.csv", AZ_HEADER + GOOD + GOOD + "2023-11-16 18:15:47.0,1,2,3\n")
    with pytest.raises(WorkloadFormatError, match=r"b\.csv, line 4: expected 3 fields"):
        read_azure_trace(p)
    p = write(tmp_path, "c.csv", "TIMESTAMP,Context,GeneratedTokens\n" + GOOD)
    with pytest.raises(WorkloadFormatError, match=r"line 1, column 'ContextTokens': missing column"):
        read_azure_trace(p)
    # two bad rows: the earliest line is reported, whatever kind of error it is
    p = write(tmp_path, "d.csv", AZ_HEADER + GOOD + "x,1\n" + "2023-11-16 18:15:47.0,-4,2\n")
    with pytest.raises(WorkloadFormatError, match="line 3"):
        read_azure_trace(p)
    with pytest.raises(FileNotFoundError):
        read_azure_trace(tmp_path / "missing.csv")
    with pytest.raises(ValueError, match="on_error must be one of"):
        read_azure_trace(p, on_error="ignore")


def test_skip_mode_counts_bad_rows(tmp_path):
    p = write(tmp_path, "s.csv", AZ_HEADER + GOOD + "x,1\n" + "2023-11-16 18:15:47.0,-4,2\n" + "\n"
              + "2023-11-16 18:15:48.6805900,10,20\n")
    wl = read_azure_trace(p, on_error="skip")
    assert len(wl) == 2 and wl.stats.num_rows_read == 4 and wl.stats.num_rows_skipped == 2
    assert wl.stats.skipped_lines == [3, 4] and wl.stats.num_blank_lines == 1
    np.testing.assert_allclose(wl.arrival_time_s, [0.0, 2.0])
    np.testing.assert_array_equal(wl.source_line, [2, 6])


def test_broken_mooncake_jsonl(tmp_path):
    good = '{"timestamp": 0, "input_length": 600, "output_length": 5, "hash_ids": [0, 1]}\n'
    cases = [('{"timestamp": 1, "input_length": 600, "output_length": 5, "hash_ids": [0, 1]\n', None),
             ('{"timestamp": 1, "input_length": 600, "hash_ids": [0, 1]}\n', "output_length"),
             ('{"timestamp": 1, "input_length": 600, "output_length": 5, "hash_ids": [0, "a"]}\n', "hash_ids"),
             ('{"timestamp": -1, "input_length": 600, "output_length": 5, "hash_ids": [0]}\n', "timestamp"),
             ('{"timestamp": 1, "input_length": "600", "output_length": 5, "hash_ids": [0]}\n', "input_length")]
    for bad, column in cases:
        p = write(tmp_path, "m.jsonl", good + bad + good)
        with pytest.raises(WorkloadFormatError) as e:
            read_mooncake_trace(p)
        assert e.value.line == 2 and e.value.column == column and "m.jsonl" in str(e.value)
    p = write(tmp_path, "m.jsonl", good + "".join(b for b, _ in cases) + good)
    wl = read_mooncake_trace(p, on_error="skip")
    assert len(wl) == 2 and wl.stats.num_rows_skipped == 5 and wl.stats.skipped_lines == [2, 3, 4, 5, 6]
    assert wl.prefix_hash_ids == [(0, 1), (0, 1)]


# -- synthetic workloads and seeded streams ------------------------------------------------
def test_synthetic_is_deterministic_and_streams_are_independent():
    base = dict(num_requests=2000, arrival=Poisson(5.0), prompt_len=Uniform(10, 100), output_len=Uniform(1, 50))
    a = synthetic_workload(**base, seed=7)
    b = synthetic_workload(**base, seed=7)
    for col in ("arrival_time_s", "num_prompt_tokens", "num_output_tokens", "priority"):
        np.testing.assert_array_equal(getattr(a, col), getattr(b, col))
    c = synthetic_workload(**base, seed=8)
    assert not np.array_equal(a.arrival_time_s, c.arrival_time_s)
    # changing the output-length distribution or adding priorities moves nothing else
    d = synthetic_workload(**{**base, "output_len": Fixed(9)}, seed=7,
                           priorities=PriorityClasses((0, 1, 2), (0.2, 0.3, 0.5)))
    np.testing.assert_array_equal(a.arrival_time_s, d.arrival_time_s)
    np.testing.assert_array_equal(a.num_prompt_tokens, d.num_prompt_tokens)
    assert (d.num_output_tokens == 9).all()
    # changing the arrival process leaves the lengths alone
    e = synthetic_workload(**{**base, "arrival": Gamma(5.0, cv=3.0)}, seed=7)
    np.testing.assert_array_equal(a.num_prompt_tokens, e.num_prompt_tokens)
    np.testing.assert_array_equal(a.num_output_tokens, e.num_output_tokens)
    assert a.num_prompt_tokens.min() >= 10 and a.num_prompt_tokens.max() <= 100


def test_arrival_processes_have_requested_rate_and_burstiness():
    n = 20_000
    rng = np.random.default_rng(0)
    for proc, cv in ((Poisson(8.0), 1.0), (Gamma(8.0, cv=0.5), 0.5), (Gamma(8.0, cv=4.0), 4.0)):
        t = proc.sample(n, rng)
        gaps = np.diff(t)
        assert t[0] == 0.0 and (gaps >= 0).all()
        assert 1 / gaps.mean() == pytest.approx(8.0, rel=0.05)
        assert gaps.std() / gaps.mean() == pytest.approx(cv, rel=0.1)
    np.testing.assert_array_equal(Constant(4.0).sample(3, rng), [0, 0.25, 0.5])
    np.testing.assert_array_equal(AllAtOnce().sample(3, rng), [0, 0, 0])
    with pytest.raises(ValueError, match="cv"):
        Gamma(1.0, cv=0)
    with pytest.raises(ValueError, match="lo <= hi"):
        Uniform(5, 4)


def test_lengths_from_file_and_priorities():
    wl = synthetic_workload(1000, AllAtOnce(), FromFile(str(need(SHAREGPT)), "num_prefill_tokens"),
                            FromFile(str(SHAREGPT), "num_decode_tokens"), seed=1,
                            priorities={"values": [0, 1], "probs": [0.25, 0.75]})
    prompt, output, _ = read_length_file(SHAREGPT)
    assert np.isin(wl.num_prompt_tokens, prompt).all() and np.isin(wl.num_output_tokens, output).all()
    assert set(wl.priority.tolist()) == {0, 1}
    assert (wl.priority == 1).mean() == pytest.approx(0.75, abs=0.05)
    with pytest.raises(ValueError, match="sum to 1"):
        PriorityClasses((0, 1), (0.5, 0.6))


def test_iteration_yields_request_specs():
    wl = synthetic_workload(3, Constant(1.0), Fixed(4), Fixed(2), start_offset_s=1.0)
    specs = wl.specs()
    assert specs[2] == RequestSpec(2, 3.0, 4, 2, 0, None, 512) == wl[2]
    assert list(wl.to_frame()["request_id"]) == [0, 1, 2]


# -- prompt token ids --------------------------------------------------------------------
def test_prompt_tokens_private_streams():
    s0, s1 = RequestSpec(0, 0.0, 300, 5), RequestSpec(1, 0.0, 300, 5)
    ids = prompt_token_ids(s0, vocab_size=1000, rng_seed=3)
    assert isinstance(ids, list) and len(ids) == 300 and all(type(i) is int and 0 <= i < 1000 for i in ids)
    assert ids == prompt_token_ids(s0, 1000, 3)                    # deterministic
    assert ids != prompt_token_ids(s0, 1000, 4)                    # seed matters
    other = prompt_token_ids(s1, 1000, 3)
    assert ids[:16] != other[:16]                                  # no shared prefix between requests
    assert len(set(ids)) > 200                                     # spread over the vocabulary
    with pytest.raises(ValueError, match="vocab_size"):
        prompt_token_ids(s0, 1, 0)


def test_shared_hash_ids_give_identical_blocks():
    a = RequestSpec(0, 0.0, 1100, 5, prefix_hash_ids=(7, 8, 9))
    b = RequestSpec(1, 0.0, 1300, 5, prefix_hash_ids=(7, 8, 42))
    c = RequestSpec(2, 0.0, 600, 5, prefix_hash_ids=(5, 8))
    ta, tb, tc = (prompt_token_ids(s, 50_000, 0) for s in (a, b, c))
    assert len(ta) == 1100 and len(tb) == 1300 and len(tc) == 600
    assert ta[:1024] == tb[:1024]                                  # blocks 7, 8 shared
    assert ta[1024:1100] != tb[1024:1100]                          # block 9 vs 42 differ
    assert tc[:512] != ta[:512]                                    # 8 at position 1 == same ids as 8 anywhere
    assert tc[512:600] == ta[512:600]                              # block 8, truncated to 88 tokens
    assert prompt_token_ids(a, 50_000, 1)[:512] != ta[:512]        # seed changes block contents
    # a prompt longer than its listed blocks continues with private tokens
    d = RequestSpec(3, 0.0, 700, 5, prefix_hash_ids=(7,))
    assert prompt_token_ids(d, 50_000, 0)[:512] == ta[:512] and len(prompt_token_ids(d, 50_000, 0)) == 700


def test_mooncake_shared_prefix_is_shared_in_tokens():
    wl = read_mooncake_trace(need(MOONCAKE), max_requests=134)
    # trace lines 67 and 134: hash ids (0, 1541, ..., 1545) and (0, 1541, ..., 1544, 3753)
    a, b = wl[66], wl[133]
    assert a.prefix_hash_ids[:5] == b.prefix_hash_ids[:5] and a.prefix_hash_ids[5] != b.prefix_hash_ids[5]
    ta, tb = prompt_token_ids(a, 151_936, 0), prompt_token_ids(b, 151_936, 0)
    assert (len(ta), len(tb)) == (2651, 3024)
    assert ta[:2560] == tb[:2560] and ta[2560:] != tb[2560:2651]
    t0 = prompt_token_ids(wl[0], 151_936, 0)                        # every conversation opens with block id 0
    assert t0[:512] == ta[:512] and t0[512:1024] != ta[512:1024]


def test_hydra_instantiates_workloads_from_config():
    hydra_utils = pytest.importorskip("hydra.utils")
    from omegaconf import OmegaConf
    cfg = OmegaConf.create({
        "_target_": "experiments.workloads.synthetic_workload", "num_requests": 50, "seed": 4,
        "arrival": {"_target_": "experiments.workloads.Gamma", "rate_rps": 2.0, "cv": 2.0},
        "prompt_len": {"_target_": "experiments.workloads.Uniform", "lo": 4, "hi": 8},
        "output_len": {"_target_": "experiments.workloads.Fixed", "tokens": 3},
        "priorities": {"values": [0, 1], "probs": [0.5, 0.5]}})
    wl = hydra_utils.instantiate(cfg)
    direct = synthetic_workload(50, Gamma(2.0, 2.0), Uniform(4, 8), Fixed(3), seed=4,
                                priorities=PriorityClasses((0, 1), (0.5, 0.5)))
    np.testing.assert_array_equal(wl.arrival_time_s, direct.arrival_time_s)
    np.testing.assert_array_equal(wl.priority, direct.priority)
