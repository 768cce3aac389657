"""benchmarks/decode_gap.py: the variants of a captured batch, and a run on the tiny CPU model (two policies replayed,
their batches kept in step order and re-timed in every variant of their kind)."""
import sys

import pytest

from tests.benchmarks.conftest import ROOT

sys.path.insert(0, str(ROOT / "benchmarks"))


def test_variants_keep_the_entries_and_change_only_what_they_name():
    from decode_gap import variants
    decode = dict(num_prefill_seqs=0, new=[1, 1, 1], ctx=[40, 100, 17], ntok=[40, 100, 17],
                  tables=[[7, 3, 9], [12, 13, 14, 15, 2, 1, 0], [30, 31]])
    v = variants(decode, 16)
    assert set(v) == {"own", "contiguous", "sorted"}
    own, P = v["own"]
    assert P == 0 and [e[3] for e in own] == decode["tables"]
    contig, _ = v["contiguous"]
    assert [e[3] for e in contig] == [[0, 1, 2], [3, 4, 5, 6, 7, 8, 9], [10, 11]]      # consecutive, batch order
    assert [e[:3] for e in contig] == [e[:3] for e in own]
    assert [e[1] for e in v["sorted"][0]] == [100, 40, 17] and v["sorted"][0][0][3] == decode["tables"][1]
    mixed = dict(num_prefill_seqs=1, new=[500, 1, 1], ctx=[1200, 300, 80], ntok=[1500, 300, 80],
                 tables=[list(range(75)), [80, 81], [90]])
    v = variants(mixed, 16)
    assert set(v) == {"own", "chunk_only", "decodes_only"}
    assert v["chunk_only"] == ([(500, 1200, 1500, list(range(75)))], 1)
    assert v["decodes_only"] == ([(1, 300, 300, [80, 81]), (1, 80, 80, [90])], 0)


@pytest.mark.parametrize("engines", [[], ["--one-engine", "--chain"]], ids=["engine_a_policy", "one_engine"])
def test_replays_two_policies_and_retimes_their_batches(tmp_path, tiny_ckpt, run_benchmark, engines):
    import pandas as pd
    out = tmp_path / "gap"
    run_benchmark("decode_gap.py", "--model", tiny_ckpt, "--device", "cpu", "--out", out, "--smoke",
                  "--min-batch", "1", "--sample", "4", "--repeats", "1", "--policies", "vllm,sarathi", *engines)
    df = pd.read_parquet(out / "decode_gap.parquet")
    for policy in ("vllm", "sarathi"):
        steps = pd.read_parquet(out / "real" / f"gap_{policy}_steps.parquet")
        own = df[(df.policy == policy) & (df.variant == "own")]
        assert len(own) >= 4
        # each re-timed batch is the recorded step's: the kept batches line up with the step table's rows
        row = steps.loc[own.step]
        assert own.batch_size.tolist() == row.batch_size.tolist()
        assert own.num_prefill_tokens.tolist() == row.num_prefill_tokens.tolist()
        assert own.decode_context_sum.tolist() == row.decode_context_sum.tolist()
        kinds = df[df.policy == policy].groupby("step").variant.apply(frozenset)
        decode_steps = set(own[own.num_prefill_seqs == 0].step)
        for step, names in kinds.items():
            want = {"own", "contiguous", "sorted"} if step in decode_steps else {"own", "chunk_only", "decodes_only"}
            assert names == want, (policy, step)
    assert (df[df.variant == "contiguous"].runs == df[df.variant == "contiguous"].batch_size).all()
    if engines:         # a chained row for every step of each replay (no device seconds on CPU)
        chained = pd.read_parquet(out / "decode_gap_chain.parquet")
        for policy in ("vllm", "sarathi"):
            n = len(pd.read_parquet(out / "real" / f"gap_{policy}_steps.parquet"))
            for name in ("full", "decodes", "spin"):
                rows = chained[(chained.policy == policy) & (chained["chain"] == name)]
                assert rows.step.tolist() == list(range(n)), name


def test_summarize_needs_a_profile(tmp_path, run_benchmark):
    import subprocess
    with pytest.raises(subprocess.CalledProcessError) as e:
        run_benchmark("decode_gap.py", "--summarize", tmp_path)
    assert "--summarize needs --profile" in e.value.stderr
