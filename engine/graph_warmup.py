"""Each captured CUDA graph replayed once at start-up, before any timed or served step."""
from __future__ import annotations

import torch


def replay_once(graphs, device) -> None:
    """Replays each captured graph once (its static inputs still the capture's all-padding step: nothing is
    stored). A graph's first replay sets it up on the device, 5-7 ms of host time on an H200 for a decode graph
    (benchmarks/host_breakdown.py: the first decode step at 9, 17, 34 and 41 sequences, graphs 16 to 64, in a
    replay after the warm-up's), which would otherwise fall on the first step of each new size a run reaches."""
    for graph in graphs:
        graph.replay()
    torch.cuda.synchronize(device)
