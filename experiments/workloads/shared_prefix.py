"""Synthetic shared-prefix workload: requests in groups, each group's prompts opening with one shared prefix.

The shape of SGLang's `generated-shared-prefix` benchmark and vLLM's prefix-repetition dataset (system prompts
or documents reused across requests): `num_groups` prefixes, each of a length drawn once from `prefix_len`;
every request picks a group uniformly at random and appends its own suffix of `suffix_len` tokens. Prompt
tokens come from prefix hash ids (engine.core.requests.prompt_token_ids), so the engine's and the simulator's
prefix caches see the same hits.

    wl = shared_prefix_workload(200, Poisson(8.0), num_groups=8, prefix_len=Uniform(512, 6144),
                                suffix_len=Uniform(16, 512), output_len=Uniform(16, 128), seed=0)

The prefix cache reuses whole KV blocks only, so a group shares the whole blocks of `prefix_block_tokens`
(default 16, the engine's KV block) of its prefix; the tokens past the last whole block are the request's own.
A prompt is always prefix_len + suffix_len tokens, as drawn.
"""
from __future__ import annotations

from experiments.workloads.options import TraceOptions, finalize, make_options
from experiments.workloads.synthetic import draw_requests

GROUP_ID_STRIDE = 1 << 20        # group g's prefix blocks have hash ids g * stride + j (j < stride blocks)


def shared_prefix_workload(num_requests: int, arrival, num_groups: int, prefix_len, suffix_len, output_len, *,
                           prefix_block_tokens: int = 16, options: TraceOptions | None = None, **kwargs):
    """num_requests requests from an arrival process, each a group's shared prefix plus its own suffix.

    arrival: a synthetic arrival process (Poisson, Gamma, ...); prefix_len, suffix_len, output_len: length
    distributions (Fixed, Uniform, FromFile). Options (TraceOptions keywords) include the root `seed`.
    """
    if num_groups < 1:
        raise ValueError(f"num_groups must be >= 1, got {num_groups}")
    if prefix_block_tokens < 1:
        raise ValueError(f"prefix_block_tokens must be >= 1, got {prefix_block_tokens}")
    opts = make_options(options, kwargs)
    # the suffixes from the prompt-length stream: arrivals, suffixes and outputs pair with synthetic_workload's
    arrival_s, suffix, output, stats, change, rng = draw_requests(
        num_requests, arrival, suffix_len, output_len, opts,
        f"shared_prefix({type(arrival).__name__}, {num_groups} groups)")
    group_prefix = prefix_len.sample(num_groups, rng["prefix_groups"])          # [num_groups] tokens
    group = rng["prefix_groups"].integers(0, num_groups, size=num_requests)    # [n] each request's group
    if int(group_prefix.max()) // prefix_block_tokens >= GROUP_ID_STRIDE:
        raise ValueError(f"prefix_len draws up to {int(group_prefix.max())} tokens: at most "
                         f"{GROUP_ID_STRIDE * prefix_block_tokens - 1} with prefix_block_tokens={prefix_block_tokens}")
    blocks = [tuple(g * GROUP_ID_STRIDE + j for j in range(int(p) // prefix_block_tokens))
              for g, p in enumerate(group_prefix.tolist())]
    hashes = [blocks[g] for g in group.tolist()]
    return finalize(arrival_s, group_prefix[group] + suffix, output, opts, stats, hashes=hashes,
                    block_tokens=prefix_block_tokens, change=change)
