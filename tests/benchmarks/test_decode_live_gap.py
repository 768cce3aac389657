"""benchmarks/decode_live_gap.py on the tiny CPU model: every mode runs each shape (the placeholder modes through
the runner's placeholder path, resolved from the launch before), one row per (runner, shape, mode)."""


def test_every_mode_times_every_shape_on_both_runners(tmp_path, tiny_ckpt, run_benchmark):
    import pandas as pd
    out = tmp_path / "gap.csv"
    run_benchmark("decode_live_gap.py", "--model", tiny_ckpt, "--device", "cpu", "--max-model-len", "512",
                  "--num-kvcache-blocks", "256", "--repeats", "2", "--chain", "8", "--smoke", "--sync-runner",
                  "--profile-max-model-len", "512", "--out", out)
    df = pd.read_csv(out)
    live = df[df["runner"] == "live"]
    assert set(live["mode"]) == {"profile", "back_to_back", "scattered", "placeholder", "chain", "chain_contiguous"}
    assert live.groupby("shape")["mode"].nunique().eq(6).all() and live["shape"].nunique() == 3
    sync = df[df["runner"] == "profile_runner"]
    assert list(sync["mode"].unique()) == ["profile_sync"] and len(sync) == 3
    assert (live[live["mode"].str.startswith("chain")]["n"] == 8 - 5).all()      # the chain's first 5 steps dropped
