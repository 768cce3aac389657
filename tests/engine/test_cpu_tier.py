"""The prefix cache's CPU tier on the engine (CPU): blocks round-trip the host tier bit-exactly, and a prompt
whose prefix was offloaded, evicted and loaded back gets the same KV bytes and the same greedy tokens."""
import random

import pytest
import torch

from engine.core.block_keys import hash_block
from engine.core.sequence import SamplingParams
from engine.cpu_tier_space import CpuTierSpace, block_runs
from engine.llm import LLM
from tests.engine.tiny_model import make_tiny_qwen3

SHAPE = (3, 4, 2, 8)            # layers, block_size, kv heads, head_dim
GREEDY = dict(temperature=0.0, ignore_eos=True)


def test_runs_of_consecutive_ids():
    assert block_runs([3, 4, 5, 9, 2, 3]) == [(0, 3, 3), (3, 9, 1), (4, 2, 2)]
    assert block_runs([]) == []


def test_offload_then_load_is_bit_exact():
    kv = torch.randn(2, SHAPE[0], 7, *SHAPE[1:], generator=torch.Generator().manual_seed(0))
    tier = CpuTierSpace(6, SHAPE, torch.float32, torch.device("cpu"))
    original = kv.clone()
    tier.offload(kv, [(4, 1), (1, 2), (6, 5)])         # tier blocks 1-2 one run, 5 another
    tier.finish()
    assert torch.equal(tier.host[2], original[:, :, 1]) and torch.equal(tier.host[5], original[:, :, 6])
    kv[:, :, [1, 4, 6]] = float("nan")                  # the GPU blocks get reused meanwhile
    tier.load(kv, [(5, 0), (1, 3), (2, 4)])
    assert torch.equal(kv[:, :, 0], original[:, :, 6]) and torch.equal(kv[:, :, 3], original[:, :, 4])
    assert torch.equal(kv[:, :, 4], original[:, :, 1])
    assert torch.equal(kv[:, :, 2], original[:, :, 2]) and torch.equal(kv[:, :, 5], original[:, :, 5])


def test_tier_larger_than_host_memory_is_refused(monkeypatch):
    import engine.cpu_tier_space as cts
    monkeypatch.setattr(cts, "host_memory_available_bytes", lambda: 10_000)
    with pytest.raises(ValueError, match=r"cpu_cache_num_blocks=100 needs .* use cpu_cache_num_blocks <= "):
        CpuTierSpace(100, SHAPE, torch.float32, torch.device("cpu"))


def test_tier_in_gib_beyond_host_memory_is_refused_naming_cpu_cache_gib(monkeypatch):
    import engine.cpu_tier_space as cts
    monkeypatch.setattr(cts, "host_memory_available_bytes", lambda: 3 * 2**30)
    blocks = 4 * 2**30 // (2 * 3 * 4 * 2 * 8 * 4)       # 4 GiB of SHAPE's float32 blocks (refused before allocating)
    with pytest.raises(ValueError, match=r"^cpu_cache_gib=4 \(2796202 blocks\) needs 4.0 GiB .* 3.0 GiB are "
                                         r"available; use cpu_cache_gib <= 3$"):
        CpuTierSpace(blocks, SHAPE, torch.float32, torch.device("cpu"), cpu_cache_gib=4)


def test_tier_in_gib_and_in_blocks_together_are_refused():
    from engine.config import EngineConfig
    with pytest.raises(ValueError, match=r"^cpu_cache_num_blocks=12 and cpu_cache_gib=1 both size the CPU tier; "
                                         r"give one of them"):
        EngineConfig("ckpt", cpu_cache_num_blocks=12, cpu_cache_gib=1.0)
    with pytest.raises(ValueError, match=r"^cpu_cache_gib must be a finite number of GiB >= 0"):
        EngineConfig("ckpt", cpu_cache_gib=float("inf"))


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    path = tmp_path_factory.mktemp("tiny_qwen3_tier")
    make_tiny_qwen3(path)
    return path


def _prefix_blocks(llm, tokens, n):
    """GPU block ids holding the KV of tokens' first n full blocks (through the prefix cache's table)."""
    bm = llm.scheduler.block_manager
    h, out = -1, []
    for i in range(n):
        h = hash_block(tokens[i * 16:(i + 1) * 16], h)
        out.append(bm.hash_to_block[h])
    return out


def test_offloaded_prefix_reloads_with_same_kv_and_tokens(tiny):
    rng = random.Random(0)
    base = [rng.randrange(500) for _ in range(48)]                  # 3 full blocks
    others = [[rng.randrange(500) for _ in range(40)] for _ in range(3)]
    tail = [rng.randrange(500) for _ in range(5)]
    params = SamplingParams(max_tokens=8, **GREEDY)

    def run(cpu_blocks):
        llm = LLM(tiny, num_kvcache_blocks=8, max_model_len=64, cpu_cache_num_blocks=cpu_blocks)
        first = llm.generate([base], params, use_tqdm=False)[0]
        kv_base = llm.runner.kv_cache[:, :, _prefix_blocks(llm, base, 3)].clone()
        for p in others:                                             # each evicts cached blocks of base
            llm.generate([p], params, use_tqdm=False)
        again = llm.generate([base + tail], params, use_tqdm=False)[0]
        kv_again = llm.runner.kv_cache[:, :, _prefix_blocks(llm, base, 3)].clone()
        return llm, first, kv_base, again, kv_again

    llm, first, kv_base, again, kv_again = run(cpu_blocks=32)
    bm = llm.scheduler.block_manager
    assert len(bm.cpu_cache) > 0
    assert again.num_cached_tokens == 48 and again.num_cpu_cached_tokens > 0     # loaded back from the tier
    assert torch.equal(kv_again, kv_base)                                         # the same KV bytes
    _, first0, _, again0, _ = run(cpu_blocks=0)
    assert again0.num_cpu_cached_tokens == 0 and again0.num_cached_tokens < 48  # without the tier: recomputed
    assert first.token_ids == first0.token_ids and again.token_ids == again0.token_ids



def test_replay_takes_the_runners_tier_unless_told_fewer(tiny):
    """EngineRunConfig.cpu_cache_num_blocks sizes the runner's tier; a replay uses all of it by default, fewer
    (0: none) when asked, never more; cpu_cache_eviction names the tier's policy."""
    from experiments.runner_engine import EngineReplayer, EngineRunConfig
    from experiments.workloads import RequestSpec
    rep = EngineReplayer(EngineRunConfig(model_path=str(tiny), device="cpu", num_kvcache_blocks=8, max_model_len=64,
                                         cpu_cache_num_blocks=12, cpu_cache_max_offload_blocks=5))
    cfg = rep.scheduler_config()
    assert (cfg.cpu_cache_num_blocks, cfg.cpu_cache_max_offload_blocks) == (12, 5)
    assert rep.scheduler_config(cpu_cache_num_blocks=4).cpu_cache_num_blocks == 4
    with pytest.raises(ValueError, match=r"cpu_cache_num_blocks=13 must be in \[0, 12\]"):
        rep.scheduler_config(cpu_cache_num_blocks=13)
    specs = [RequestSpec(i, 0.0, 40, 4) for i in range(3)]
    run = rep.replay(specs, "fcfs", cpu_cache_eviction="lfu")
    assert run.info["scheduler"]["cpu_cache_num_blocks"] == 12 and run.info["cpu_cache_eviction"] == "lfu"
    assert len(run.requests) == 3
    info = rep.replay(specs, "fcfs", cpu_cache_num_blocks=0).info
    assert info["scheduler"]["cpu_cache_num_blocks"] == 0 and info["cpu_cache_eviction"] is None

def test_tier_sized_in_gib_is_converted_with_the_checkpoints_block_bytes(tiny):
    """cpu_cache_gib: the whole KV blocks of the checkpoint (kv_layout.kv_block_bytes) that fit, on the runner and
    in the replay's SchedulerConfig."""
    from engine.core.kv_layout import kv_block_bytes
    from experiments.runner_engine import EngineReplayer, EngineRunConfig
    rep = EngineReplayer(EngineRunConfig(model_path=str(tiny), device="cpu", num_kvcache_blocks=8, max_model_len=64,
                                         cpu_cache_gib=0.001))
    mc = rep.runner.model.config
    block = kv_block_bytes(16, mc.num_hidden_layers, rep.runner.model.num_kv_heads_per_rank, mc.head_dim, 4)
    assert rep.runner.block_bytes == block
    assert rep.cpu_cache_num_blocks == int(0.001 * 2**30 // block) > 0
    assert rep.scheduler_config().cpu_cache_num_blocks == rep.cpu_cache_num_blocks


needs_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")


@pytest.mark.gpu
@needs_cuda
def test_cuda_offload_in_chunks_through_the_side_stream_is_bit_exact():
    """More blocks than the two staging buffers hold (chunks wait for their buffer), then a load back."""
    dev = torch.device("cuda")
    kv = torch.randn(2, SHAPE[0], 40, *SHAPE[1:], device=dev, dtype=torch.bfloat16)
    original = kv.clone()
    tier = CpuTierSpace(30, SHAPE, torch.bfloat16, dev, staging_blocks=4)
    assert tier.host.is_pinned()
    pairs = [(g, c) for g, c in zip(range(3, 40, 2), [7, 8, 9, 0, 1, 2, 3, 4, 5, 6, 29, 28, 10, 11, 12, 13, 14, 15,
                                                      16])]
    tier.offload(kv, pairs)
    kv[:, :, 3::2] = 0                                  # the forward pass overwrites them meanwhile
    tier.finish()
    for g, c in pairs:
        assert torch.equal(tier.host[c], original[:, :, g].cpu())
    tier.load(kv, [(c, g - 1) for g, c in pairs])
    torch.cuda.synchronize()
    for g, _ in pairs:
        assert torch.equal(kv[:, :, g - 1], original[:, :, g])


@pytest.mark.gpu
@needs_cuda
def test_cuda_offloaded_prefix_reloads_with_same_tokens(tiny):
    rng = random.Random(1)
    base = [rng.randrange(500) for _ in range(48)]
    others = [[rng.randrange(500) for _ in range(40)] for _ in range(3)]
    params = SamplingParams(max_tokens=8, **GREEDY)
    outs = {}
    for cpu_blocks in (0, 32):
        llm = LLM(tiny, device="cuda", dtype="float32", num_kvcache_blocks=8, max_model_len=64,
                  cpu_cache_num_blocks=cpu_blocks)
        first = llm.generate([base], params, use_tqdm=False)[0]
        for p in others:
            llm.generate([p], params, use_tqdm=False)
        outs[cpu_blocks] = (first, llm.generate([base + others[0][:5]], params, use_tqdm=False)[0])
    assert outs[32][1].num_cpu_cached_tokens > 0
    assert [o.token_ids for o in outs[32]] == [o.token_ids for o in outs[0]]
