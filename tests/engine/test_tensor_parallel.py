"""Tensor parallelism on CPU: weight shards re-assemble exactly into the checkpoint, and gloo runs with
2 (and 4) processes produce the same greedy tokens and logits as tensor_parallel_size=1, through
prefix-cache hits and preemption by recompute and by swap."""
import random

import pytest
import torch
import torch.distributed as dist
import torch.nn.functional as F

from engine import collectives, workers
from engine.config import EngineConfig
from engine.core.sequence import SamplingParams
from engine.layers.embed_head import ParallelLMHead, VocabParallelEmbedding
from engine.layers.linear import (
    ColumnParallelLinear,
    MergedColumnParallelLinear,
    QKVParallelLinear,
    RowParallelLinear,
    kv_heads_of_rank,
)
from engine.llm import LLM
from engine.loader import build_model
from policies.scheduling.vllm import VLLMPolicy
from tests.engine.tiny_model import make_tiny_qwen3

GREEDY = dict(temperature=0.0, ignore_eos=True)


def _load(layer, param, tensor, shard=None):
    assert layer.checkpoint_shape(param, shard) == tuple(tensor.shape)
    layer.load(param, tensor, shard)
    return layer


# -- sharding and re-assembly, layer by layer (no process group needed) ----------------------------
@pytest.mark.parametrize("tp", [1, 2, 4])
def test_column_and_row_parallel_round_trip(tp):
    g = torch.Generator().manual_seed(tp)
    w, b = torch.randn(8, 12, generator=g), torch.randn(8, generator=g)
    x = torch.randn(5, 12, generator=g)
    cols = [_load(_load(ColumnParallelLinear(12, 8, True, r, tp), "weight", w), "bias", b) for r in range(tp)]
    assert all(c.weight.shape == (8 // tp, 12) for c in cols)
    assert torch.equal(torch.cat([c.weight for c in cols]), w) and torch.equal(torch.cat([c.bias for c in cols]), b)
    torch.testing.assert_close(torch.cat([c(x) for c in cols], dim=-1), F.linear(x, w, b), rtol=0, atol=1e-6)

    wr = torch.randn(8, 12, generator=g)
    rows = [_load(_load(RowParallelLinear(12, 8, True, r, tp), "weight", wr), "bias", b) for r in range(tp)]
    assert torch.equal(torch.cat([m.weight for m in rows], dim=1), wr)
    assert all(torch.equal(m.bias, b) for m in rows)
    # what the all-reduce sums: rank 0 adds the bias once
    partials = [F.linear(x[:, r * 12 // tp:(r + 1) * 12 // tp], m.weight, m.bias if r == 0 else None)
                for r, m in enumerate(rows)]
    torch.testing.assert_close(sum(partials), F.linear(x, wr, b), rtol=0, atol=1e-5)
    if tp == 1:                                  # tp=1 is a plain linear, no communication
        assert torch.equal(rows[0](x), F.linear(x, wr, b))


@pytest.mark.parametrize("tp", [1, 2, 4])
def test_merged_gate_up_round_trip(tp):
    g = torch.Generator().manual_seed(10 + tp)
    gate, up = torch.randn(16, 6, generator=g), torch.randn(16, 6, generator=g)
    layers = [_load(_load(MergedColumnParallelLinear(6, [16, 16], False, r, tp), "weight", gate, 0), "weight", up, 1)
              for r in range(tp)]
    for shard, full in enumerate((gate, up)):
        parts = [m.weight[slice(*m.shard_rows(shard))] for m in layers]
        assert torch.equal(torch.cat(parts), full)
    # rank r's packed weight is [gate_r; up_r]
    assert torch.equal(layers[-1].weight, torch.cat([gate[-16 // tp:], up[-16 // tp:]]))


# rank -> the KV heads it holds, worked out by hand: tp <= Hkv splits them, tp > Hkv replicates one each
KV_LAYOUT = {(2, 1): [[0, 1]], (2, 2): [[0], [1]], (2, 4): [[0], [0], [1], [1]], (4, 2): [[0, 1], [2, 3]],
             (1, 2): [[0], [0]], (1, 4): [[0], [0], [0], [0]]}


@pytest.mark.parametrize("num_kv_heads,tp", sorted(KV_LAYOUT))
def test_qkv_with_gqa_round_trip(num_kv_heads, tp):
    Hq, D, H = 8, 4, 10
    g = torch.Generator().manual_seed(num_kv_heads * 10 + tp)
    q, k, v = (torch.randn(n * D, H, generator=g) for n in (Hq, num_kv_heads, num_kv_heads))
    qb, kb, vb = (torch.randn(n * D, generator=g) for n in (Hq, num_kv_heads, num_kv_heads))
    layers = []
    for r in range(tp):
        m = QKVParallelLinear(H, D, Hq, num_kv_heads, True, r, tp)
        for shard, (w, b) in enumerate(((q, qb), (k, kb), (v, vb))):
            _load(_load(m, "weight", w, shard), "bias", b, shard)
        layers.append(m)
    assert torch.equal(torch.cat([m.weight[slice(*m.shard_rows(0))] for m in layers]), q)
    assert torch.equal(torch.cat([m.bias[slice(*m.shard_rows(0))] for m in layers]), qb)
    for r, m in enumerate(layers):
        heads = KV_LAYOUT[(num_kv_heads, tp)][r]
        assert (m.num_heads, m.num_kv_heads) == (Hq // tp, len(heads))
        want = torch.cat([torch.arange(h * D, (h + 1) * D) for h in heads])
        for shard, full in ((1, k), (2, v)):
            assert torch.equal(m.weight[slice(*m.shard_rows(shard))], full[want])
        # the query heads of rank r attend to the KV head(s) it holds (GQA groups of Hq / Hkv)
        group = Hq // num_kv_heads
        assert sorted({h // group for h in range(r * Hq // tp, (r + 1) * Hq // tp)}) == heads


@pytest.mark.parametrize("vocab,tp", [(12, 1), (12, 4), (10, 4), (10, 3), (11, 2)])
def test_vocab_parallel_embedding_and_head_round_trip(vocab, tp, monkeypatch):
    g = torch.Generator().manual_seed(vocab * tp)
    table = torch.randn(vocab, 6, generator=g)
    embs = [_load(VocabParallelEmbedding(vocab, 6, r, tp), "weight", table) for r in range(tp)]
    padded = -(-vocab // tp) * tp
    stacked = torch.cat([e.weight for e in embs])
    assert stacked.shape == (padded, 6)
    assert torch.equal(stacked[:vocab], table) and not stacked[vocab:].any()    # padding rows are zero
    ids = torch.tensor([0, vocab - 1, 3, 7 % vocab, 3])
    monkeypatch.setattr(collectives, "all_reduce", lambda x: x)               # summed below instead
    torch.testing.assert_close(sum(e(ids) for e in embs), F.embedding(ids, table), rtol=0, atol=0)

    heads = [_load(ParallelLMHead(vocab, 6, r, tp), "weight", table) for r in range(tp)]
    hidden = torch.randn(3, 6, generator=g)
    parts = {}

    def fake_gather(x, rank, size):                 # ranks > 0 run first; rank 0 receives all slices
        parts[rank] = x
        return [parts[i] for i in range(size)] if rank == 0 else None

    monkeypatch.setattr(collectives, "gather_to_first", fake_gather)
    for h in reversed(heads):
        logits = h(hidden)
        assert (logits is None) == (h.tp_rank > 0)
    assert logits.shape == (3, vocab)
    torch.testing.assert_close(logits, F.linear(hidden, table), rtol=0, atol=1e-6)


@pytest.mark.parametrize("tp,vocab", [(2, 512), (4, 510)])
def test_checkpoint_shards_reassemble_exactly(tmp_path, tp, vocab):
    """Every rank's model, loaded through the loader, re-assembles into the tp=1 model's parameters."""
    make_tiny_qwen3(tmp_path, vocab_size=vocab)
    full = dict(build_model(tmp_path, "cpu", torch.float32, None).named_parameters())
    ranks = [dict(build_model(tmp_path, "cpu", torch.float32, None, tp_rank=r, tp_size=tp).named_parameters())
             for r in range(tp)]
    D, Hq, Hkv = 16, 4, 2
    for name, want in full.items():
        got = [p[name] for p in ranks]
        if "qkv_proj" in name:
            q = torch.cat([w[:Hq // tp * D] for w in got])
            kv_rows = [w[Hq // tp * D:] for w in got]
            heads = KV_LAYOUT[(Hkv, tp)]
            k = torch.cat([kv_rows[r][:D * len(heads[r])] for r in range(tp) if r == 0 or heads[r] != heads[r - 1]])
            v = torch.cat([kv_rows[r][D * len(heads[r]):] for r in range(tp) if r == 0 or heads[r] != heads[r - 1]])
            assembled = torch.cat([q, k, v])
        elif "gate_up_proj" in name:
            half = [w.chunk(2) for w in got]
            assembled = torch.cat([torch.cat([h[0] for h in half]), torch.cat([h[1] for h in half])])
        elif "o_proj" in name or "down_proj" in name:
            assembled = torch.cat(got, dim=1)
        elif "embed_tokens" in name or "lm_head" in name:
            assembled = torch.cat(got)
            assert not assembled[vocab:].any()
            assembled = assembled[:vocab]
        else:                                       # norms: replicated
            assert all(torch.equal(g, got[0]) for g in got)
            assembled = got[0]
        assert torch.equal(assembled, want), name


# -- bad sizes ------------------------------------------------------------------------------------
@pytest.mark.parametrize("tp", [0, 9, -1, 2.0, True])
def test_tensor_parallel_size_range(tp):
    with pytest.raises(ValueError, match=r"tensor_parallel_size must be an int in 1\.\.8"):
        EngineConfig(model_path="x", tensor_parallel_size=tp)


def test_tensor_parallel_size_must_fit_the_model(tiny):
    for tp, why in ((3, "must divide num_attention_heads=4"), (8, "must divide num_attention_heads=4")):
        with pytest.raises(ValueError, match=rf"{why}; set tensor_parallel_size to one of \[1, 2, 4\]"):
            LLM(tiny, num_kvcache_blocks=8, tensor_parallel_size=tp)
    hf = dict(num_attention_heads=12, num_key_value_heads=3, intermediate_size=96)
    with pytest.raises(ValueError, match=r"tensor_parallel_size=2 must divide num_key_value_heads=3.*\[1, 3, 6\]"):
        EngineConfig(model_path="x", tensor_parallel_size=2).check_tensor_parallel(hf)
    hf = dict(num_attention_heads=12, num_key_value_heads=2, intermediate_size=96)
    with pytest.raises(ValueError, match=r"exceeds num_key_value_heads=2 and is not a multiple.*\[1, 2, 4, 6\]"):
        EngineConfig(model_path="x", tensor_parallel_size=3).check_tensor_parallel(hf)
    with pytest.raises(ValueError, match="not a multiple of it"):
        kv_heads_of_rank(2, 0, 3)
    hf = dict(num_attention_heads=4, num_key_value_heads=2, intermediate_size=10)
    with pytest.raises(ValueError, match=r"must divide intermediate_size=10; .*one of \[1, 2\]"):
        EngineConfig(model_path="x", tensor_parallel_size=4).check_tensor_parallel(hf)
    with pytest.raises(ValueError, match=r"output_sizes\[0\]=10 is not divisible by tensor_parallel_size=4"):
        MergedColumnParallelLinear(4, [10, 10], tp_size=4)
    with pytest.raises(ValueError, match="in_features=10 is not divisible by tensor_parallel_size=4"):
        RowParallelLinear(10, 4, tp_size=4)


# -- gloo runs with several processes ---------------------------------------------------------------
@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    path = tmp_path_factory.mktemp("tiny_tp")
    make_tiny_qwen3(path)
    return path


class SwapVLLM(VLLMPolicy):
    preemption_mode = "swap"


class LogitsRecorder:
    """Wraps rank 0's sampler and keeps a copy of every step's logits [num_sampled, V]."""

    def __init__(self, sampler):
        self.sampler, self.logits = sampler, []

    def __call__(self, logits, tensors):
        self.logits.append(logits.clone())
        return self.sampler(logits, tensors)


def _prompts(seed, lengths):
    rng = random.Random(seed)
    return [[rng.randrange(500) for _ in range(n)] for n in lengths]


def _run(path, tp, workload, during=None, **options):
    """Greedy outputs and per-step logits of the workload: a list of (prompts, max_tokens) rounds."""
    with LLM(path, tensor_parallel_size=tp, **options) as llm:
        rec = llm.runner.sampler = LogitsRecorder(llm.runner.sampler)
        outs = [llm.generate(p, [SamplingParams(max_tokens=m, **GREEDY) for m in ms], use_tqdm=False)
                for p, ms in workload]
        info = dict(kv_heads=llm.runner.kv_cache.shape[4], workers=llm.runner.workers)
        if during is not None:
            during(llm)
    return [o for round_ in outs for o in round_], rec.logits, info


def _assert_same(path, tp, workload, during=None, **options):
    ref, ref_logits, _ = _run(path, 1, workload, **options)
    outs, logits, info = _run(path, tp, workload, during, **options)
    assert [o.token_ids for o in outs] == [o.token_ids for o in ref]
    assert [o.num_cached_tokens for o in outs] == [o.num_cached_tokens for o in ref]
    assert len(logits) == len(ref_logits)
    for a, b in zip(logits, ref_logits):
        torch.testing.assert_close(a, b, rtol=0, atol=1e-5)
    # clean shutdown: workers joined, process group gone
    assert info["workers"] is not None and not any(p.is_alive() for p in info["workers"].procs)
    assert not dist.is_initialized()
    return outs, info


def _refuse_second_group(llm):
    with pytest.raises(RuntimeError, match="already has a torch.distributed process group.*close"):
        LLM(llm.config.model_path, num_kvcache_blocks=8, max_model_len=64, tensor_parallel_size=2)
    llm.close()
    llm.close()                                         # idempotent; the with-block closes a third time
    assert not any(p.is_alive() for p in llm.runner.workers.procs) and not dist.is_initialized()


def test_tp2_matches_tp1_through_swap_and_prefix_cache(tiny):
    """Preemption by swap (the workers swap their KV shards too) and prefix-cache hits, 2 gloo ranks."""
    base = _prompts(1, [40])[0]
    tails = _prompts(2, [3, 9])
    workload = [(_prompts(5, [20, 30, 25, 28]), [12] * 4),                  # 8 blocks: preemption by swap
                ([base], [2]), ([base + tails[0], base + tails[1]], [4, 3])]   # prefix-cache hits
    outs, info = _assert_same(tiny, 2, workload, _refuse_second_group, policy=SwapVLLM(), num_kvcache_blocks=8,
                              num_cpu_blocks=32, max_model_len=64)
    assert info["kv_heads"] == 1                                         # 2 KV heads over 2 ranks
    assert sum(o.num_swaps for o in outs[:4]) > 0
    assert [o.num_cached_tokens for o in outs[5:]] == [32, 32]


def test_tp4_replicated_kv_heads_match_tp1(tiny):
    """4 ranks over 2 KV heads: each rank holds a replica of one head."""
    _, info = _assert_same(tiny, 4, [(_prompts(0, [5, 23]), [4, 3])], num_kvcache_blocks=16, max_model_len=64)
    assert info["kv_heads"] == 1


def test_main_guard_detection(tmp_path):
    script = tmp_path / "s.py"
    script.write_text("import x\nllm = 1\nif __name__ == '__main__':\n    llm = 2\n    print(llm)\n"
                      "if '__main__' == __name__:\n    llm = 3\n")
    assert [workers.unguarded_main_line(str(script), n) for n in (2, 4, 5, 7)] == [True, False, False, False]


def test_unguarded_script_is_refused_instead_of_hanging(tmp_path):
    # Spawned workers import the main script again; without the guard each would build another LLM and
    # rank 0 would wait for them until distributed_timeout_s (10 minutes by default).
    import os
    import subprocess
    import sys
    from pathlib import Path
    make_tiny_qwen3(tmp_path / "m")
    script = tmp_path / "unguarded.py"
    script.write_text(f"from engine.llm import LLM\nllm = LLM({str(tmp_path / 'm')!r}, tensor_parallel_size=2, "
                      "device='cpu')\n")
    root = Path(__file__).resolve().parents[2]
    proc = subprocess.run([sys.executable, str(script)], cwd=tmp_path, capture_output=True, text=True, timeout=90,
                          env=dict(os.environ, PYTHONPATH=str(root)))
    assert proc.returncode != 0
    assert "line 2 builds the LLM outside an `if __name__ == \"__main__\":` block" in proc.stderr
