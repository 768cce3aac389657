"""Plots of long runs stay cheap: no legend uses matplotlib's "best" placement, which scans every
plotted point (seconds for a run of a few hundred thousand steps)."""
import numpy as np
import pandas as pd

from experiments import plots


def test_step_timeline_places_its_legends_without_searching(tmp_path, monkeypatch):
    n = 1000
    steps = pd.DataFrame({"start_time_s": np.arange(n) * 0.01, "batch_size": np.arange(n) % 7,
                          "num_prefill_seqs": np.arange(n) % 2, "kv_blocks_used": np.full(n, 10),
                          "kv_blocks_free": np.full(n, 90), "kv_blocks_cached": np.arange(n) % 50,
                          "num_preempted": np.zeros(n, int), "num_swapped_out": np.zeros(n, int)})
    figures = []
    close = plots.plt.close
    monkeypatch.setattr(plots.plt, "close", lambda fig: figures.append(fig) or close(fig))
    assert plots.step_timeline(steps, tmp_path / "t.png", title="run").is_file()
    legends = [ax.get_legend() for ax in figures[0].axes]
    assert len(legends) == 3 and all(lg is not None and lg._loc != 0 for lg in legends)   # 0: "best"
