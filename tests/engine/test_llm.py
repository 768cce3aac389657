"""LLM.generate end to end on CPU: greedy tokens equal transformers' generate on the same weights,
through prefix-cache hits, chunked prefill, and preemption by recompute and by swap."""
import random

import pytest
import torch

from engine.core.sequence import SamplingParams
from engine.llm import LLM
from policies.scheduling.vllm import VLLMPolicy
from tests.engine.tiny_model import make_tiny_qwen3, make_tiny_tokenizer

GREEDY = dict(temperature=0.0, ignore_eos=True)


class SwapVLLM(VLLMPolicy):
    preemption_mode = "swap"


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory):
    path = tmp_path_factory.mktemp("tiny_qwen3")
    hf = make_tiny_qwen3(path)
    cache = {}

    def reference(prompt, max_tokens):
        key = (tuple(prompt), max_tokens)
        if key not in cache:
            with torch.no_grad():
                ids = torch.tensor([prompt])
                # explicit mask: generate would otherwise mask prompt tokens equal to pad_token_id
                out = hf.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=max_tokens,
                                  do_sample=False, eos_token_id=None, pad_token_id=0)
            cache[key] = out[0, len(prompt):].tolist()
        return cache[key]

    return path, reference


def _prompts(seed, lengths):
    rng = random.Random(seed)
    return [[rng.randrange(500) for _ in range(n)] for n in lengths]


def _check(llm, ref, prompts, max_tokens):
    params = [SamplingParams(max_tokens=m, **GREEDY) for m in max_tokens]
    outs = llm.generate(prompts, params, use_tqdm=False)
    for p, m, o in zip(prompts, max_tokens, outs):
        assert o.prompt_token_ids == p
        assert o.token_ids == ref(p, m), f"prompt of {len(p)} tokens"
        assert o.finish_reason == "length"
    return outs


def test_greedy_generate_matches_transformers_mixed_lengths(ckpt):
    path, ref = ckpt
    llm = LLM(path, num_kvcache_blocks=64, max_model_len=128)
    prompts = _prompts(0, [5, 40, 17, 1, 33, 64, 16])
    outs = _check(llm, ref, prompts, [12, 7, 20, 9, 16, 5, 11])
    assert [o.request_id for o in outs] == sorted(o.request_id for o in outs)    # submission order
    assert not llm.has_unfinished()


def test_prefix_cache_hits(ckpt):
    path, ref = ckpt
    llm = LLM(path, num_kvcache_blocks=64, max_model_len=128)
    base = _prompts(1, [40])[0]
    _check(llm, ref, [base], [4])
    tails = _prompts(2, [3, 9])
    outs = _check(llm, ref, [base + tails[0], base + tails[1]], [10, 6])
    assert [o.num_cached_tokens for o in outs] == [32, 32]      # two full 16-token blocks of the prefix


def test_chunked_prefill(ckpt):
    path, ref = ckpt
    llm = LLM(path, num_kvcache_blocks=64, max_model_len=128, enable_chunked_prefill=True,
              max_num_batched_tokens=16)
    _check(llm, ref, _prompts(3, [50, 7, 23, 2]), [8, 12, 6, 10])


def test_preemption_by_recompute(ckpt):
    path, ref = ckpt
    llm = LLM(path, num_kvcache_blocks=10, block_size=16, max_model_len=64)
    outs = _check(llm, ref, _prompts(4, [20, 30, 25, 12, 28, 17]), [20] * 6)
    assert sum(o.num_preemptions for o in outs) > 0


def test_preemption_by_swap(ckpt):
    path, ref = ckpt
    llm = LLM(path, policy=SwapVLLM(), num_kvcache_blocks=10, num_cpu_blocks=40, max_model_len=64)
    outs = _check(llm, ref, _prompts(5, [20, 30, 25, 12, 28, 17]), [20] * 6)
    assert sum(o.num_swaps for o in outs) > 0


def test_string_prompts_with_tokenizer(tmp_path, ckpt):
    path, ref = ckpt
    for f in path.iterdir():
        (tmp_path / f.name).write_bytes(f.read_bytes())
    tok = make_tiny_tokenizer(tmp_path)
    llm = LLM(tmp_path, num_kvcache_blocks=32, max_model_len=128)
    assert llm.eos_token_id == 511
    out = llm.generate("w5 w17 w300 w2", SamplingParams(max_tokens=6, **GREEDY), use_tqdm=False)[0]
    assert out.prompt_token_ids == [5, 17, 300, 2]
    assert out.token_ids == ref([5, 17, 300, 2], 6)
    assert out.text == tok.decode(out.token_ids, skip_special_tokens=True)


def test_step_api_with_injected_clock(ckpt):
    path, ref = ckpt
    ticks = iter(range(1000))
    llm = LLM(path, num_kvcache_blocks=32, max_model_len=128, clock=lambda: float(next(ticks)))
    prompts = _prompts(6, [9, 4])
    assert llm.add_request(prompts[0], SamplingParams(max_tokens=3, **GREEDY), request_id="a",
                           arrival_time_s=0.5) == "a"
    rid = llm.add_request(prompts[1], SamplingParams(max_tokens=2, **GREEDY))
    done = {}
    while llm.has_unfinished():
        for out in llm.step():
            done[out.request_id] = out
    assert done["a"].token_ids == ref(prompts[0], 3) and done[rid].token_ids == ref(prompts[1], 2)
    assert done["a"].arrival_time_s == 0.5
    # one clock read for the default arrival, then (start, end) per step; tokens are stamped at step end
    assert done[rid].arrival_time_s == 0.0
    assert done["a"].first_token_time_s == 2.0 and done["a"].finish_time_s == 6.0
    with pytest.raises(ValueError, match="already in flight"):
        llm.add_request([1], request_id="b")
        llm.add_request([1], request_id="b")


def test_seeded_sampling_reproducible_across_batches(ckpt):
    path, _ = ckpt
    llm = LLM(path, num_kvcache_blocks=64, max_model_len=128, seed=3)
    p = _prompts(7, [10])[0]
    seeded = SamplingParams(temperature=1.0, max_tokens=12, ignore_eos=True, seed=42)
    alone = llm.generate([p], seeded, use_tqdm=False)[0].token_ids
    others = _prompts(8, [5, 30])
    mixed = llm.generate([others[0], p, others[1]],
                         [SamplingParams(temperature=1.0, max_tokens=8, ignore_eos=True), seeded,
                          SamplingParams(temperature=0.7, top_k=5, top_p=0.9, max_tokens=12, ignore_eos=True)],
                         use_tqdm=False)
    assert mixed[1].token_ids == alone
    other_seed = SamplingParams(temperature=1.0, max_tokens=12, ignore_eos=True, seed=43)
    assert llm.generate([p], other_seed, use_tqdm=False)[0].token_ids != alone


def test_a_vanishing_temperature_samples_greedily(ckpt):
    """Temperatures below GREEDY_BELOW are greedy: 1e-38 overflowed logits / T to inf and gave token 0 every step."""
    path, _ = ckpt
    llm = LLM(path, num_kvcache_blocks=64, max_model_len=128, seed=3)
    p = _prompts(9, [12])[0]
    greedy = llm.generate([p], SamplingParams(temperature=0.0, max_tokens=8, ignore_eos=True), use_tqdm=False)
    for t in (1e-38, 1e-45, 1e-6):
        for top_k in (0, 5):         # the race path and the top-k path
            out = llm.generate([p], SamplingParams(temperature=t, top_k=top_k, max_tokens=8, ignore_eos=True, seed=1),
                               use_tqdm=False)
            assert out[0].token_ids == greedy[0].token_ids, (t, top_k)


def test_bad_requests_fail_before_any_work(ckpt, tmp_path):
    path, _ = ckpt
    llm = LLM(path, num_kvcache_blocks=3, max_model_len=64)
    good, long = [1, 2, 3], list(range(65))
    with pytest.raises(ValueError, match="prompt has 65 tokens, more than max_model_len=64"):
        llm.generate([good, long], SamplingParams(max_tokens=2), use_tqdm=False)
    assert not llm.has_unfinished()
    with pytest.raises(ValueError, match="lower max_tokens to <= 61"):
        llm.add_request(good, SamplingParams(max_tokens=62))
    with pytest.raises(ValueError, match="needs 4 KV blocks.*has only 3"):
        llm.add_request(list(range(45)), SamplingParams(max_tokens=4))
    with pytest.raises(ValueError, match="has no tokenizer"):
        llm.add_request("hello")
    with pytest.raises(ValueError, match=r"token ids must be in \[0, 512\)"):
        llm.add_request([3, 512])
    assert not llm.has_unfinished()
    with pytest.raises(TypeError, match="unknown engine option.*'max_num_seq'"):
        LLM(path, max_num_seq=4)
    with pytest.raises(ValueError, match="max_model_len .* exceeds the model's max_position_embeddings"):
        LLM(path, num_kvcache_blocks=4, max_model_len=4096)


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the no-CUDA error")
def test_cuda_requested_without_cuda(ckpt):
    with pytest.raises(RuntimeError, match="CUDA is not available.*device='cpu'"):
        LLM(ckpt[0], device="cuda", num_kvcache_blocks=4)


needs_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")


@pytest.mark.gpu
@needs_cuda
@pytest.mark.parametrize("backend,eager", [("torch", True), ("triton", True), ("triton", False)])
def test_cuda_greedy_matches_transformers_with_swap(ckpt, backend, eager):
    """float32 on the GPU, decode through CUDA graphs (padded to the graph sizes 1, 2, 4, 8) or eagerly,
    with preemption by swap through the pinned host swap space."""
    path, ref = ckpt
    llm = LLM(path, device="cuda", dtype="float32", attention_backend=backend, enforce_eager=eager,
              policy=SwapVLLM(), num_kvcache_blocks=10, num_cpu_blocks=40, max_model_len=64, max_num_seqs=8)
    assert bool(llm.runner.graphs) == (not eager)
    assert (llm.runner.prefill_graphs is not None) == (backend == "triton" and not eager)   # torch: not graph-safe
    outs = _check(llm, ref, _prompts(5, [20, 30, 25, 12, 28, 17]), [20] * 6)
    assert sum(o.num_swaps for o in outs) > 0
    outs = _check(llm, ref, _prompts(0, [5, 40, 17]), [12, 7, 20])      # 3 decodes run in the graph of 4


@pytest.mark.gpu
@needs_cuda
def test_cuda_kv_cache_sized_from_memory_utilization(ckpt):
    path, ref = ckpt
    llm = LLM(path, device="cuda", dtype="float32", gpu_memory_utilization=0.05, max_model_len=128,
              max_num_seqs=16)
    free, total = torch.cuda.mem_get_info()
    assert llm.runner.num_kvcache_blocks * llm.runner.block_bytes <= 0.05 * total
    assert llm.runner.num_kvcache_blocks > 1000
    _check(llm, ref, _prompts(3, [50, 7, 23, 2]), [8, 12, 6, 10])


@pytest.mark.parametrize("arch", ["llama", "qwen2"])
def test_other_architectures_greedy_match_transformers(tmp_path, arch):
    """The same token-for-token check for the other registered architectures (Llama with Llama 3 RoPE
    scaling, Qwen2 with q/k/v biases), through chunked prefill and preemption by recompute."""
    from tests.engine.tiny_model import make_tiny_checkpoint
    hf = make_tiny_checkpoint(tmp_path, arch)

    def ref(prompt, max_tokens):
        with torch.no_grad():
            ids = torch.tensor([prompt])
            out = hf.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=max_tokens,
                              do_sample=False, eos_token_id=None, pad_token_id=0)
        return out[0, len(prompt):].tolist()

    prompts = _prompts(7, [70, 9, 33, 1, 48])
    llm = LLM(tmp_path, num_kvcache_blocks=12, max_model_len=128, enable_chunked_prefill=True,
              max_num_batched_tokens=32)
    outs = _check(llm, ref, prompts, [24, 30, 12, 20, 16])
    assert sum(o.num_preemptions for o in outs) > 0


@pytest.mark.parametrize("arch", ["qwen3", "llama"])
def test_fused_qk_norm_rope_store_on_and_off_give_the_same_greedy_tokens(tmp_path, arch):
    """The triton backend (interpreter) with the q/k norm, RoPE and KV store fused into one kernel and
    without: the same greedy tokens, transformers' tokens, through chunked prefill and a prefix-cache hit.
    Llama has no q/k norm (the kernel's norm off)."""
    from tests.engine.tiny_model import make_tiny_checkpoint
    hf = make_tiny_checkpoint(tmp_path, arch)
    shared = _prompts(11, [20])[0]
    prompts = [shared + p for p in _prompts(12, [13, 1])] + _prompts(13, [37, 4])
    params = [SamplingParams(max_tokens=m, **GREEDY) for m in (6, 9, 5, 7)]
    tokens = {}
    for fused_store in (True, False):
        llm = LLM(tmp_path, attention_backend="triton", fused_qk_norm_rope_store=fused_store, num_kvcache_blocks=32,
                  max_model_len=128, enable_chunked_prefill=True, max_num_batched_tokens=24)
        assert (llm.runner.model.model.layers[0].self_attn.fused_store is not None) == fused_store
        outs = llm.generate(prompts, params, use_tqdm=False)
        assert sum(o.num_cached_tokens for o in outs) > 0
        tokens[fused_store] = [o.token_ids for o in outs]
    assert tokens[True] == tokens[False]
    with torch.no_grad():
        ref = [hf.generate(torch.tensor([p]), attention_mask=torch.ones(1, len(p), dtype=torch.long),
                           max_new_tokens=sp.max_tokens, do_sample=False, eos_token_id=None,
                           pad_token_id=0)[0, len(p):].tolist() for p, sp in zip(prompts, params)]
    assert tokens[True] == ref


class _RejectsLongPrompts(VLLMPolicy):
    name = "rejects_long"
    may_reject = True

    def reject_reason(self, seq, view):
        return "prompt longer than 4 tokens" if seq.num_prompt_tokens > 4 else None


def test_generate_returns_the_requests_the_policy_rejects(ckpt):
    import threading

    path, reference = ckpt
    llm = LLM(path, device="cpu", num_kvcache_blocks=64, max_model_len=128, policy=_RejectsLongPrompts())
    prompts = [[1, 2, 3], list(range(1, 9)), [4, 5]]
    done = {}
    # generate used to step forever once a request was rejected: run it where the test can give up on it
    worker = threading.Thread(target=lambda: done.update(outs=llm.generate(
        prompts, SamplingParams(max_tokens=3, **GREEDY), use_tqdm=False)), daemon=True)
    worker.start()
    worker.join(60)
    assert not worker.is_alive(), "LLM.generate did not return after the policy rejected a request"
    ok1, rejected, ok2 = done["outs"]
    assert rejected.finish_reason == "rejected" and "longer than 4 tokens" in rejected.reject_reason
    assert rejected.token_ids == [] and rejected.first_token_time_s is None
    assert ok1.finish_reason == ok2.finish_reason == "length" and ok1.reject_reason is None
    assert ok1.token_ids == reference([1, 2, 3], 3) and ok2.token_ids == reference([4, 5], 3)
    assert not llm.has_unfinished() and not llm._live


def test_a_short_generate_ends_with_the_whole_runs_rates_on_its_bar(ckpt, monkeypatch):
    import tqdm.auto

    shown = []

    class Bar:                              # tqdm's surface that LLM.generate uses, recording the postfixes
        def __init__(self, *a, **k): ...
        def update(self, n=1): ...
        def close(self): ...
        def set_postfix(self, refresh=True, **kw):
            shown.append(kw)

    monkeypatch.setattr(tqdm.auto, "tqdm", Bar)
    path, _ = ckpt
    LLM(path, device="cpu", num_kvcache_blocks=64, max_model_len=128).generate(
        [[1, 2, 3], [4, 5]], SamplingParams(max_tokens=8, **GREEDY))
    # a run shorter than the bar's 0.5 s refresh used to keep its first (prefill) step's decode=0tok/s
    assert float(shown[-1]["decode"].removesuffix("tok/s")) > 0
