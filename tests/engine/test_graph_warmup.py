"""The start-up warm-up of the LM head (engine/graph_warmup.py): one product at every row count a step can sample."""
import torch

from engine import graph_warmup


def test_lm_head_warmed_at_every_row_count_once(monkeypatch):
    seen = []
    linear = graph_warmup.F.linear

    def recording(x, w, *a, **k):
        seen.append((tuple(x.shape), w.data_ptr()))
        return linear(x, w, *a, **k)

    monkeypatch.setattr(graph_warmup.F, "linear", recording)
    weight = torch.randn(40, 8)                                              # [V, H]
    before = weight.clone()
    graph_warmup.warm_lm_head(weight, 6)
    assert seen == [((m, 8), weight.data_ptr()) for m in range(1, 7)]
    assert torch.equal(weight, before)
