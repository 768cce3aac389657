"""The padded layout of prefill-step CUDA graphs (engine/prefill_graphs.py), run eagerly on CPU.

The graphs themselves need CUDA (tests/engine/test_llm.py -k cuda); what can go wrong in the
layout (padding entries, padding tokens, decodes as one-token prefill entries, stale block-table
rows from earlier steps) shows up here as tokens that differ from transformers' greedy decoding.
"""

from engine.llm import LLM
from engine.prefill_graphs import prefill_graph_sizes
from tests.engine.test_llm import SwapVLLM, _check, _prompts, ckpt  # noqa: F401  (ckpt is a fixture)


def test_sizes_cover_every_token_count_with_bounded_padding():
    sizes = prefill_graph_sizes(8192)
    assert sizes[0] == 16 and sizes[-1] == 8192 and sizes == sorted(set(sizes))
    assert all(s % 16 == 0 for s in sizes)
    for t in range(1, 8193):
        pad = next(s for s in sizes if s >= t) - t
        assert pad < (16 if t <= 256 else 64 if t <= 2048 else 256)
    assert prefill_graph_sizes(100)[-1] == 96 and prefill_graph_sizes(15) == []


def _padded_llm(path, counter, **kw):
    llm = LLM(path, **kw)
    runner = llm.runner
    graphs = runner.make_prefill_graphs(capture=False)
    forward = graphs.forward

    def counted(step, size):
        counter.append((len(step.input_ids), len(step.context_lens), size))
        return forward(step, size)

    graphs.forward = counted
    runner.prefill_graphs = graphs
    return llm


def test_padded_steps_match_transformers(ckpt):  # noqa: F811
    """Mixed prefill + decode steps, prefix hits, preemption by swap: all through the padded layout."""
    path, ref = ckpt
    calls = []
    llm = _padded_llm(path, calls, attention_backend="torch", policy=SwapVLLM(), num_kvcache_blocks=12,
                      num_cpu_blocks=40, max_model_len=64, max_num_seqs=8)
    outs = _check(llm, ref, _prompts(5, [20, 30, 25, 12, 28, 17]), [20] * 6)
    assert sum(o.num_swaps for o in outs) > 0
    base = _prompts(1, [33])[0]
    _check(llm, ref, [base], [3])
    outs = _check(llm, ref, [base + [7, 9], base[:20] + [3]], [4, 6])
    assert sum(o.num_cached_tokens for o in outs) > 0
    assert any(S > 1 and T > S for T, S, _ in calls)           # several entries in one padded step
    assert all(T <= size and size % 16 == 0 for T, _, size in calls)


def test_padded_steps_triton_kernels(ckpt):  # noqa: F811
    """The graphs' own kernels (Triton interpreter): a batch prefill, then decodes padded to 16 tokens."""
    path, ref = ckpt
    calls = []
    llm = _padded_llm(path, calls, attention_backend="triton", num_kvcache_blocks=16, max_model_len=64,
                      max_num_seqs=4)
    _check(llm, ref, _prompts(9, [20, 9, 14]), [4, 4, 4])
    assert calls[0] == (43, 3, 48) and calls[1] == (3, 3, 16)


def test_padded_chunked_prefill_mixes_decodes(ckpt):  # noqa: F811
    path, ref = ckpt
    calls = []
    llm = _padded_llm(path, calls, num_kvcache_blocks=64, max_model_len=128, enable_chunked_prefill=True,
                      max_num_batched_tokens=16)
    _check(llm, ref, _prompts(3, [50, 7, 23, 2]), [8, 12, 6, 10])
    assert max(size for _, _, size in calls) == 16                # bounded by max_num_batched_tokens
