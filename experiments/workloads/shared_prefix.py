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

from engine.core.requests import WorkloadStats
from experiments.workloads.options import TraceOptions, finalize, make_options, spawn_streams

GROUP_ID_STRIDE = 1 << 20        # group g's prefix blocks have hash ids g * stride + j (j < stride blocks)


def shared_prefix_workload(num_requests: int, arrival, num_groups: int, prefix_len, suffix_len, output_len, *,
                           prefix_block_tokens: int = 16, options: TraceOptions | None = None, **kwargs):
    """num_requests requests from an arrival process, each a group's shared prefix plus its own suffix.

    arrival: a synthetic arrival process (Poisson, Gamma, ...); prefix_len, suffix_len, output_len: length
    distributions (Fixed, Uniform, FromFile). Options (TraceOptions keywords) include the root `seed`.
    """
    if num_requests < 1:
        raise ValueError(f"num_requests must be >= 1, got {num_requests}")
    if num_groups < 1:
        raise ValueError(f"num_groups must be >= 1, got {num_groups}")
    if prefix_block_tokens < 1:
        raise ValueError(f"prefix_block_tokens must be >= 1, got {prefix_block_tokens}")
    opts = make_options(options, kwargs)
    rng = spawn_streams(opts.seed)
    arrival_s = arrival.sample(num_requests, rng["arrivals"])
    suffix = suffix_len.sample(num_requests, rng["prompt_lengths"])
    output = output_len.sample(num_requests, rng["output_lengths"])
    group_prefix = prefix_len.sample(num_groups, rng["prefix_groups"])          # [num_groups] tokens
    group = rng["prefix_groups"].integers(0, num_groups, size=num_requests)    # [n] each request's group
    if int(group_prefix.max()) // prefix_block_tokens >= GROUP_ID_STRIDE:
        raise ValueError(f"prefix_len draws up to {int(group_prefix.max())} tokens: at most "
                         f"{GROUP_ID_STRIDE * prefix_block_tokens - 1} with prefix_block_tokens={prefix_block_tokens}")
    blocks = [tuple(g * GROUP_ID_STRIDE + j for j in range(int(p) // prefix_block_tokens))
              for g, p in enumerate(group_prefix.tolist())]
    prompt = group_prefix[group] + suffix
    hashes = [blocks[g] for g in group.tolist()]
    stats = WorkloadStats(source=f"shared_prefix({type(arrival).__name__}, {num_groups} groups)",
                          num_rows_read=num_requests)
    return finalize(arrival_s, prompt, output, opts, stats, hashes=hashes, block_tokens=prefix_block_tokens)
