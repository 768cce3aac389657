"""The batch shapes the engine captures CUDA graphs for, torch-free: the model runner captures them and the
calibrated cost model prices a step at the graph it pads to (sim/cost_model/calibrated_fit.py)."""
from __future__ import annotations


def decode_graph_sizes(max_num_seqs: int) -> list[int]:
    """Decode batch sizes that get a captured graph: 1, 2, 4, 8, then steps of 16 (nano-vllm's ladder)."""
    top = min(max_num_seqs, 512)
    sizes = [b for b in (1, 2, 4, 8) if b <= top] + list(range(16, top + 1, 16))
    return sizes if sizes[-1] == top else sizes + [top]


def prefill_graph_sizes(max_tokens: int) -> list[int]:
    """Padded token counts that get a graph: steps of 16 up to 256, of 64 up to 2048, of 256 beyond.

    Matmul time is a step function of the token count with steps of one 64-128-row tile, so padding
    to the next multiple of 64 above 256 tokens costs little GPU time (and lets a cost model that
    prices T tokens stay close to the padded step)."""
    sizes = list(range(16, min(max_tokens, 256) + 1, 16))
    sizes += list(range(320, min(max_tokens, 2048) + 1, 64))
    sizes += list(range(2304, max_tokens + 1, 256))
    return sizes
