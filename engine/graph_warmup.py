"""Start-up work that would otherwise fall on a run's first steps: each captured CUDA graph replayed once, and the
LM head's matrix product run at every row count a step can sample."""
from __future__ import annotations

import torch
import torch.nn.functional as F


def replay_once(graphs, device) -> None:
    """Replays each captured graph once (its static inputs still the capture's all-padding step: nothing is
    stored). The warm-up's first decode step took 49-65 ms on an H200 without it, 3.5 ms on an H100 with it
    (benchmarks/host_breakdown.py, busy_chunked under vllm)."""
    for graph in graphs:
        graph.replay()
    torch.cuda.synchronize(device)


def warm_lm_head(weight: torch.Tensor, max_rows: int) -> None:
    """Runs the LM head's product hidden [m, H] x weight [V, H]^T once for every m in 1..max_rows. The head runs
    outside the decode graphs on the sampled rows only, and the GEMM library picks (and, with lazy module loading,
    loads) a kernel per row count: on an H100 the first step at 2, 9, 16, 17, 33, 41 and 49 decodes spent 4.7-8.6 ms
    in the forward against a 0.2 ms median, whatever graph it replayed (9 and 16 share graph 16, 33 and 41 graph
    48), while 32 rows, which the start-up prefill samples, never stalled (host_breakdown, busy_chunked, vllm).
    Costs max_rows small products, well under a second on a GPU."""
    hidden = torch.zeros(max_rows, weight.shape[1], dtype=weight.dtype, device=weight.device)
    for m in range(1, max_rows + 1):
        F.linear(hidden[:m], weight)                                         # [m, V]
    if weight.is_cuda:
        torch.cuda.synchronize(weight.device)
