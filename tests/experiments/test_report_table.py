"""The sweep table of servelab-report from hand-written run folders: nested meta values and the cost model's
coverage as cells parquet can hold, labels that tell runs apart, a sweep root's stray summary left out."""
import json

import pandas as pd
import pytest
import yaml

from experiments.report import collect, make_report, overview
from experiments.report_labels import fill_overrides, policy_labels
from experiments.report_table import cell, parquet_safe
from experiments.results import write_parquet

METRICS = {f"{m}_p{p}": 0.01 * p for m in ("ttft_s", "tpot_s", "normalized_latency_s") for p in (50, 99)}
INSIDE = {"num_steps": 10, "num_steps_outside": 0, "share_steps_outside": 0.0, "time_s": 1.0, "time_outside_s": 0.0,
          "share_time_outside": 0.0, "outside_by": {}, "envelope": {"max_prefill_tokens": 16384}}


def fake_run(folder, overrides, rate, meta=None, config=None):
    """A job folder as servelab writes it: summary.json (and config.yaml when given)."""
    folder.mkdir(parents=True, exist_ok=True)
    summary = {"complete": True, "run_id": folder.name, "overrides": overrides, "choices": {"scheduler": "vllm"},
               "meta": {"request_rate_rps": rate, "dropped_lines": [], **(meta or {})},
               "metrics": {"num_finished": 10, **METRICS}}
    (folder / "summary.json").write_text(json.dumps(summary))
    if config is not None:
        (folder / "config.yaml").write_text(yaml.safe_dump(config))
    return folder


def test_runs_all_inside_the_envelope_make_a_parquet_table_with_coverage_columns(tmp_path):
    # every run's outside_by is {}: a struct without fields, which parquet cannot write
    for sched in ("vllm", "srpt"):
        fake_run(tmp_path / f"scheduler={sched}", [f"scheduler={sched}"], 5.0, {"cost_model_coverage": INSIDE})
    df, files = make_report(tmp_path)
    back = pd.read_parquet(tmp_path / "report" / "results.parquet")
    assert len(back) == 2 and back["cost_model_share_steps_outside"].tolist() == [0.0, 0.0]
    assert back["cost_model_share_time_outside"].tolist() == [0.0, 0.0]
    assert back["cost_model_outside_by"].tolist() == ["", ""]
    assert json.loads(back["cost_model_coverage"][0])["envelope"] == {"max_prefill_tokens": 16384}
    assert back["dropped_lines"].tolist() == ["[]", "[]"]


def test_coverage_columns_of_runs_outside_the_envelope(tmp_path):
    outside = {**INSIDE, "num_steps_outside": 4, "share_steps_outside": 0.4, "share_time_outside": 0.6,
               "time_outside_s": 0.6, "outside_by": {"max_batch_size": 1, "max_prefill_tokens": 4}}
    fake_run(tmp_path / "a", ["scheduler=vllm"], 5.0, {"cost_model_coverage": outside})
    fake_run(tmp_path / "b", ["scheduler=srpt"], 5.0)           # another cost model: no coverage
    df = collect(tmp_path)
    write_parquet(df, tmp_path / "t.parquet")
    a = df.set_index("run_dir").loc["a"]
    assert a["cost_model_share_steps_outside"] == 0.4 and a["cost_model_share_time_outside"] == 0.6
    assert a["cost_model_outside_by"] == "max_prefill_tokens=4, max_batch_size=1"
    assert pd.isna(df.set_index("run_dir").loc["b", "cost_model_share_steps_outside"])


def test_a_column_mixing_text_and_numbers_is_written_as_text(tmp_path):
    df = parquet_safe(pd.DataFrame({"x": [5, "high", None]}))
    write_parquet(df, tmp_path / "t.parquet")
    assert pd.read_parquet(tmp_path / "t.parquet")["x"].tolist()[:2] == ["5", "high"]
    assert cell({"b": 1, "a": {}}) == '{"a": {}, "b": 1}' and cell(3) == 3


def test_a_relaunch_with_another_seed_gets_labels_of_its_own(tmp_path):
    # the README's kv_pressure sweep, then the same command with seed=7: the first runs gave no seed
    for sched in ("fcfs", "vllm"):
        for rate in (10, 20):
            base = [f"scheduler={sched}", f"workload.arrival.rate_rps={rate}"]
            fake_run(tmp_path / f"{sched},{rate}", base, float(rate), config={"seed": 0})
            fake_run(tmp_path / f"{sched},seed=7,{rate}", [*base, "seed=7"], float(rate), config={"seed": 7})
    df = collect(tmp_path)
    assert sorted(df["policy"].unique()) == ["scheduler=fcfs,seed=0", "scheduler=fcfs,seed=7",
                                             "scheduler=vllm,seed=0", "scheduler=vllm,seed=7"]
    assert not df.duplicated(["policy", "request_rate_rps"]).any()       # no plot line joins two runs
    assert sorted(df["seed"].tolist()) == [0, 0, 0, 0, 7, 7, 7, 7]


def test_runs_alike_in_every_override_are_told_apart_by_their_folder():
    rows = [{"run_dir": "a", "request_rate_rps": 5.0}, {"run_dir": "b", "request_rate_rps": 5.0},
            {"run_dir": "c", "request_rate_rps": 9.0}]
    assert policy_labels(rows, set(), "request_rate_rps") == ["run (a)", "run (b)", "run"]
    rows = [{"run_dir": "a", "x": 1}, {"run_dir": "b"}]                 # a key the other run's config lacks
    assert policy_labels(rows, {"x"}, "request_rate_rps") == ["1", "default"]


def test_a_stray_summary_in_the_sweep_root_is_not_read_as_a_run(tmp_path):
    fake_run(tmp_path / "scheduler=vllm", ["scheduler=vllm"], 5.0)
    fake_run(tmp_path / "scheduler=srpt", ["scheduler=srpt"], 5.0)
    fake_run(tmp_path, [], 5.0)                                     # a single run written into the sweep's root
    df = collect(tmp_path)
    assert sorted(df["run_dir"]) == ["scheduler=srpt", "scheduler=vllm"] and df.attrs["stray"] == ["summary.json"]
    # a folder holding one run is that run
    assert collect(tmp_path / "scheduler=vllm")["run_dir"].tolist() == ["."]


def test_a_summary_beside_multirun_yaml_is_stray(tmp_path):
    fake_run(tmp_path, [], 5.0)
    (tmp_path / "multirun.yaml").write_text("hydra: {}\n")
    with pytest.raises(ValueError, match=r"no complete runs .*left out summary.json: in a folder that holds a sweep"):
        collect(tmp_path)


def test_filled_override_columns_come_in_sorted_order(tmp_path):
    """A report's columns follow the order its rows gain keys: filled from a set, whose order changes from one
    process to the next, an identical report would differ and be kept as an earlier one."""
    run = tmp_path / "job"
    run.mkdir()
    (run / "config.yaml").write_text(yaml.safe_dump({"seed": 3, "progress": False, "alpha": 1}))
    rows = [{"run_dir": "job"}]
    fill_overrides(rows, ["seed", "progress", "alpha"], tmp_path)
    assert list(rows[0]) == ["run_dir", "alpha", "progress", "seed"]


def test_a_predictor_given_by_name_and_its_resolved_settings_share_a_label(tmp_path):
    """`scheduler.predictor=noisy` is saved as the predictor's settings (its defaults and the run's seed): a run
    whose config holds those settings is labelled `noisy` too, and one with another sigma keeps its settings."""
    for name, sigma in (("same", 0.5), ("other", 0.3)):
        (tmp_path / name).mkdir()
        pred = {"_target_": "policies.predictors.noisy.NoisyPredictor", "sigma": sigma, "seed": 4}
        (tmp_path / name / "config.yaml").write_text(yaml.safe_dump({"scheduler": {"predictor": pred}}))
    rows = [{"run_dir": "same"}, {"run_dir": "other"}]
    fill_overrides(rows, ["scheduler.predictor"], tmp_path)
    assert rows[0]["scheduler.predictor"] == "noisy"
    assert json.loads(rows[1]["scheduler.predictor"])["sigma"] == 0.3


def test_settings_that_change_no_result_name_no_line(tmp_path):
    """`progress` (like plots, print_summary, resume) changes what a run prints, not what it measures: two runs that
    differ in it and in their policy are labelled by the policy alone."""
    fake_run(tmp_path / "a", ["scheduler=vllm", "progress=true"], 5.0)
    fake_run(tmp_path / "b", ["scheduler=srpt", "progress=false"], 5.0)
    df = collect(tmp_path)
    assert "progress" not in df and sorted(df["policy"]) == ["srpt", "vllm"]


def test_labels_wider_than_an_axes_go_in_a_legend_under_the_overview(tmp_path):
    """Unrelated runs get labels of hundreds of characters: inside an axes their legend left no room to lay the
    figure out (a matplotlib warning, a squeezed plot); under the figure it fits, one label to a row, where short
    labels sit side by side."""
    import warnings
    rows = [{"policy": p, "request_rate_rps": r, **METRICS} for p in ("a" * 200, "b" * 200) for r in (1.0, 2.0)]
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        long_png = overview(pd.DataFrame(rows), tmp_path / "long.png")
        short = pd.DataFrame(rows).assign(policy=lambda d: d["policy"].str[:3])
        short_png = overview(short, tmp_path / "short.png")
    from PIL import Image
    assert Image.open(long_png).size[1] > Image.open(short_png).size[1]    # that legend sits under the axes


def test_the_cdfs_title_names_the_rate_they_show():
    from experiments.report import _shown_at
    top = pd.DataFrame({"policy": ["a", "b"], "request_rate_rps": [30.0, 30.0]})
    assert _shown_at(top, "request_rate_rps", "policy", ["a", "b"]) == "at 30 req/s (the sweep's highest)"
    top["request_rate_rps"] = [30.0, 20.0]
    assert _shown_at(top, "request_rate_rps", "policy", ["a", "b"]) == \
        "each at its highest request rate: a 30 req/s, b 20 req/s"
    at_600 = _shown_at(top.assign(blocks=[600, 600]), "blocks", "policy", ["a"])
    assert at_600 == "at blocks = 600 (the sweep's highest)"
    assert _shown_at(top.assign(request_rate_rps=None), "request_rate_rps", "policy", ["a"]) is None


def test_the_report_warns_of_runs_whose_input_was_changed(tmp_path):
    """A job's WARNING about clipped requests goes to wherever the job ran (a cluster launcher's log): the report
    says it again, one line per distinct change, with how many runs made it; a run as recorded adds nothing."""
    from experiments.report import input_change_lines
    clipped = {"num_clipped": 3, "num_clipped_prompt": 3, "num_clipped_tokens": 900, "max_model_len": 4096,
               "lost_request_fraction": 0.03, "lost_token_fraction": 0.1}
    fake_run(tmp_path / "scheduler=fcfs", ["scheduler=fcfs"], 5.0, clipped)
    fake_run(tmp_path / "scheduler=vllm", ["scheduler=vllm"], 5.0, clipped)
    fake_run(tmp_path / "scheduler=srpt", ["scheduler=srpt"], 5.0)
    df = collect(tmp_path)
    lines = input_change_lines(df.attrs["input_changes"], len(df))
    assert len(lines) == 1 and lines[0].startswith("WARNING: input changed in 2 of 3 runs: 3 clipped to "
                                                   "max_model_len=4096")
    assert sorted(df.attrs["input_changes"]) == ["scheduler=fcfs", "scheduler=vllm"]


def test_runs_come_in_the_natural_order_of_their_labels(tmp_path):
    """Labels holding numbers sort by the numbers (a cache of 512 blocks before one of 1,024; text order puts "1024"
    first), then by rate."""
    for blocks in (1024, 256, 4096, 512):
        for rate in (8.0, 2.0):
            fake_run(tmp_path / f"b{blocks}_r{rate}", [f"cpu_cache_num_blocks={blocks}", f"workload.rate_rps={rate}"],
                     rate)
    df = collect(tmp_path)
    assert df["policy"].tolist() == [p for p in dict.fromkeys(df["policy"])
                                     for _ in range(2)]             # each label's runs together
    numbers = [int(p.split("=")[-1]) for p in dict.fromkeys(df["policy"])]
    assert numbers == [256, 512, 1024, 4096], df["policy"].tolist()
    assert df.groupby("policy", sort=False)["request_rate_rps"].apply(list).tolist() == [[2.0, 8.0]] * 4


def test_natural_key_compares_numbers_as_numbers():
    from experiments.report_labels import natural_key
    labels = ["vllm, blocks=1024", "vllm, blocks=256", "fcfs", "vllm, blocks=64.5", "vllm, blocks=2e3", "a10", "a9",
              "qwen3-32b", "qwen3-8b"]
    assert sorted(labels, key=natural_key) == ["a9", "a10", "fcfs", "qwen3-8b", "qwen3-32b", "vllm, blocks=64.5",
                                                "vllm, blocks=256", "vllm, blocks=1024", "vllm, blocks=2e3"]


def test_fairness_nan_is_explained(tmp_path, capsys):
    """A run at low load has no window with two tenants backlogged: its jain_index is NaN, and the report says why."""
    from experiments.report import main
    for rate, jain in ((1.0, None), (9.0, 0.97)):
        fake_run(tmp_path / f"r{rate}", [f"workload.rate_rps={rate}"], rate,
                 {"note": "tenants"})
        summary = tmp_path / f"r{rate}" / "summary.json"
        s = json.loads(summary.read_text())
        s["metrics"].update(jain_index=float("nan") if jain is None else jain, service_diff_rate_mean=12.0)
        summary.write_text(json.dumps(s))
    main([str(tmp_path)])
    out = capsys.readouterr().out
    assert "jain_index, service_diff_rate_mean: NaN in 1 of 2 runs, which had no time window with two tenants " \
           "backlogged" in out
