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


def _figures(monkeypatch) -> list:
    """The figures plots closes (after saving), to look into what they drew."""
    figures = []
    close = plots.plt.close
    monkeypatch.setattr(plots.plt, "close", lambda fig: figures.append(fig) or close(fig))
    return figures


def test_batch_size_is_drawn_per_window_not_per_step(tmp_path, monkeypatch):
    """Batch size swings every step between a prefill of one sequence and the decode batch: drawn per step it is a
    solid block; per window the decode line is the decode batch and the prefill line the prefill size."""
    n = 2000
    prefill = (np.arange(n) % 4 == 0).astype(int)                   # every 4th step a one-sequence prefill
    steps = pd.DataFrame({"start_time_s": np.arange(n) * 0.01, "batch_size": np.where(prefill, 1, 100),
                          "num_prefill_seqs": prefill, "kv_blocks_used": np.full(n, 10),
                          "kv_blocks_free": np.full(n, 90), "kv_blocks_cached": np.zeros(n),
                          "num_preempted": np.zeros(n, int), "num_swapped_out": np.zeros(n, int)})
    figures = _figures(monkeypatch)
    plots.step_timeline(steps, tmp_path / "t.png")
    lines = {ln.get_label(): ln.get_ydata() for ln in figures[0].axes[0].get_lines()}
    decode = next(v for k, v in lines.items() if k.startswith("decode seqs"))
    prefill_line = next(v for k, v in lines.items() if k.startswith("prefill seqs"))
    assert len(decode) <= plots.STEP_WINDOWS and set(decode) == {100} and set(prefill_line) == {1}
    assert "per window of" in figures[0].axes[0].get_legend().get_title().get_text()
    counts = figures[0].axes[2]           # no preemptions: an axis from 0 with whole ticks, not -0.05..0.05
    assert counts.get_ylim()[0] == 0 and all(float(v).is_integer() for v in counts.get_yticks())


def test_log_scale_only_when_the_values_span_more_than_one_and_a_half_decades():
    import matplotlib.pyplot as plt
    fig, ax = plt.subplots()
    assert plots.log_if_wide(ax, [0.01, 0.5, np.nan, 0.0]) and ax.get_yscale() == "log"      # 1.7 decades
    assert not plots.log_if_wide(ax, [0.0228, 0.0242]) and ax.get_yscale() == "linear"
    assert not plots.log_if_wide(ax, [np.nan]) and ax.get_yscale() == "linear"
    plt.close(fig)


def _rows(rates, policies=("fcfs", "srpt"), **per_policy):
    return pd.DataFrame([{"policy": pol, "request_rate_rps": r, "ttft_s_p50": 0.01 * (i + 1) * r,
                          "ttft_s_p99": 10.0 * (i + 1) * r, **per_policy.get(pol, {})}
                         for i, pol in enumerate(policies) for r in rates])


def test_throughput_latency_names_the_rate_and_goes_log_for_wide_latencies(tmp_path, monkeypatch):
    figures = _figures(monkeypatch)
    plots.throughput_latency(_rows([10.0, 20.0, 30.0]), tmp_path / "tl.png")
    ax = figures[0].axes[0]
    assert ax.get_xlabel() == "request rate (req/s)" and ax.get_yscale() == "log"
    assert ax.get_legend()._loc != 0                                  # not "best": outside the axes


def test_a_single_rate_sweep_draws_p50_filled_and_p99_hollow_and_says_so(tmp_path, monkeypatch):
    """With one rate a line is one point: no line style tells p50 from p99. Each policy gets an x position and
    each percentile a marker the legend names."""
    from experiments.report import overview
    df = _rows([25.0])
    for p in (50, 99):
        for m in ("tpot_s", "normalized_latency_s"):
            df[f"{m}_p{p}"] = df[f"ttft_s_p{p}"]
    df["ttft_s_p50_sim_band"] = 0.1
    figures = _figures(monkeypatch)
    plots.throughput_latency(df, tmp_path / "tl.png")
    ax = figures[0].axes[0]
    assert [t.get_text() for t in ax.get_xticklabels()] == ["fcfs", "srpt"]
    assert ax.get_xlabel() == "policy, at 25 req/s"
    p50 = [ln for ln in ax.get_lines() if ln.get_marker() == "o" and ln.get_markerfacecolor() != "none"]
    p99 = [ln for ln in ax.get_lines() if ln.get_marker() == "o" and ln.get_markerfacecolor() == "none"]
    assert [ln.get_ydata()[0] for ln in p50] == [0.25, 0.5] and [ln.get_ydata()[0] for ln in p99] == [250, 500]
    assert len(ax.containers) == 2                                    # the band as an error bar on both p50s
    legend = [t.get_text() for t in ax.get_legend().get_texts()]
    assert legend == ["fcfs", "srpt", "p50", "p99", "bar: the sim's band"]
    monkeypatch.undo()
    import matplotlib.pyplot as plt
    shown = []
    monkeypatch.setattr(plt, "close", lambda fig: shown.append(fig))
    overview(df, tmp_path / "o.png")
    assert [t.get_text() for t in shown[0].legends[0].get_texts()] == legend


def test_a_series_equal_to_an_earlier_one_is_drawn_inside_it_and_named(tmp_path, monkeypatch):
    """fcfs and vllm give the same numbers below saturation: the later one's marker is smaller and its line
    thinner, so both show, and its label says it repeats the other."""
    df = _rows([10.0, 20.0], policies=("fcfs", "srpt", "vllm"))
    df.loc[df["policy"] == "vllm", ["ttft_s_p50", "ttft_s_p99"]] = df.loc[df["policy"] == "fcfs",
                                                                            ["ttft_s_p50", "ttft_s_p99"]].to_numpy()
    figures = _figures(monkeypatch)
    plots.throughput_latency(df, tmp_path / "tl.png")
    ax = figures[0].axes[0]
    labelled = {ln.get_label(): ln for ln in ax.get_lines() if not ln.get_label().startswith("_")}
    assert list(labelled) == ["fcfs", "srpt", "vllm (= fcfs)"]
    first, last = labelled["fcfs"], labelled["vllm (= fcfs)"]
    assert first.get_marker() != last.get_marker()
    assert first.get_markersize() > last.get_markersize() and first.get_linewidth() > last.get_linewidth()
    runs = pd.DataFrame({"request_rate_rps": [1, 2] * 3, "policy": list("ppqqrr"),
                         "slo_attainment_targets": [1, 0.5, 1, 0.8, 1, 0.5], "goodput_targets_rps": [1, 1, 1, 2, 1, 1]})
    plots.attainment_vs_load(runs, tmp_path / "a.png")
    assert [t.get_text() for t in figures[1].axes[1].get_legend().get_texts()] == ["p", "q", "r (= p)"]
    req = pd.DataFrame({"ttft_s": [0.1, 0.2, 0.4], "status": ["finished"] * 3})
    plots.latency_cdf({"a": req, "b": req, "c": req * 1}, tmp_path / "c.png", title="at 3 req/s")
    texts = [t.get_text() for t in figures[2].axes[0].get_legend().get_texts()]
    assert texts == ["a (n=3)", "b (n=3, = a)", "c (n=3, = a)"] and figures[2].axes[0].get_title() == "at 3 req/s"


def test_tenant_latency_says_when_the_workload_has_no_slo_targets(tmp_path, monkeypatch):
    tenants = pd.DataFrame({"tenant": ["a", "b"], "output_throughput_tps": [1.0, 2.0], "ttft_s_p50": [0.1, 0.2],
                            "ttft_s_p99": [0.3, 0.4], "slo_attainment": [np.nan, np.nan]})
    figures = _figures(monkeypatch)
    plots.tenant_latency(tenants, tmp_path / "none.png")
    plots.tenant_latency(tenants.assign(slo_attainment=[1.0, 0.5]), tmp_path / "some.png")
    notes = [[t.get_text() for t in fig.axes[2].texts] for fig in figures]
    assert notes == [[plots.NO_SLO_NOTE], []]
    # TTFTs of 0.05 s beside 30 s: a log axis, where the light tenant's bars stay visible
    plots.tenant_latency(tenants.assign(ttft_s_p50=[0.05, 27.0], ttft_s_p99=[0.3, 30.0]), tmp_path / "wide.png")
    assert [fig.axes[1].get_yscale() for fig in figures] == ["linear", "linear", "log"]


def test_replica_load_legends_sit_beside_the_bars(tmp_path, monkeypatch):
    table = pd.DataFrame({"replica": [0, 1], "num_requests": [10, 12], "busy_fraction": [0.5, 0.6],
                          "kv_usage_mean": [0.1, 0.2], "kv_usage_max": [0.3, 0.4], "prefix_cache_hit_rate": [0.2, 0.1]})
    figures = _figures(monkeypatch)
    plots.replica_load(table, tmp_path / "r.png")
    legends = [ax.get_legend() for ax in figures[0].axes if ax.get_legend() is not None]
    # anchored at the axes' right edge (x = 1 in axes coordinates): outside, on no bar
    assert len(legends) == 2 and all(lg.get_bbox_to_anchor().transformed(lg.axes.transAxes.inverted()).x0 == 1.0
                                     for lg in legends)
