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


def test_long_series_are_drawn_as_their_envelope():
    t = np.arange(100_000) * 0.5
    y = np.sin(t) * (t % 7)
    y[12_345] = 99.0                               # a one-step spike survives
    tt, yy = plots._envelope(t, y, buckets=500)
    assert len(yy) == 1000 and yy.max() == 99.0 and yy.min() == y.min()
    assert np.all(np.diff(tt) >= 0) and tt[0] == t[0]
    short_t, short_y = plots._envelope(t[:800], y[:800], buckets=500)
    assert np.array_equal(short_y, y[:800]) and short_t is not None


def test_sim_band_shades_only_runs_with_a_band():
    import matplotlib.pyplot as plt

    from experiments.plots import sim_band
    grp = pd.DataFrame({"rate": [1.0, 2.0], "ttft_s_p50": [1.0, 2.0], "ttft_s_p50_sim_band": [0.1, 3.0]})
    fig, ax = plt.subplots()
    sim_band(ax, grp, "rate", "ttft_s_p50", "C0")
    sim_band(ax, grp.drop(columns="ttft_s_p50_sim_band"), "rate", "ttft_s_p50", "C1")
    assert len(ax.collections) == 1                     # one shaded band, for the frame that has one
    verts = ax.collections[0].get_paths()[0].vertices
    # upper edges 1.1 and 8.0; lower 0.9 and, for a 300% move (upwards), 2 / 4 = 0.5, never below 0
    assert {round(v, 6) for v in verts[:, 1]} >= {1.1, 8.0, 0.9, 0.5}
    plt.close(fig)
