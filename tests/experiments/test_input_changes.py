"""Traces run as recorded by default, and every change to the input is reported: per request in
requests.parquet, as counts and lines in summary.json, in the printed summary, and as a WARNING."""
import json
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from hydra import compose, initialize_config_dir

from engine.config import EngineConfig
from engine.core.scheduler import Scheduler, SchedulerConfig
from experiments.config import ServelabConfig
from experiments.run import execute, format_summary
from experiments.runner_engine import EngineRunConfig
from experiments.workloads import read_vidur_trace
from experiments.workloads.changes import LOSS_WARN_FRACTION, describe_input, input_meta, loss_warning
from policies.scheduling.sarathi import SarathiPolicy

ROOT = Path(__file__).resolve().parents[2]
MOONCAKE = ROOT.parent / "shared" / "traces" / "conversation_trace.jsonl"
QUIET = ["progress=false", "print_summary=false", "plots=false"]
FAST = ["backend/cost_model=constant", "backend.cost_model.step_s=0.01", "model=qwen3_0p6b"]


@pytest.fixture(autouse=True, scope="module")
def hydra_conf():
    with initialize_config_dir(str(ROOT / "conf"), version_base="1.3"):
        yield


def cfg_of(*overrides):
    return compose("config", overrides=list(overrides))


def write(tmp_path, text, name="t.csv"):
    p = tmp_path / name
    p.write_text(text)
    return p


def test_default_sim_run_clips_only_what_the_model_cannot_hold(tmp_path, capsys):
    if not MOONCAKE.is_file():
        pytest.skip(f"{MOONCAKE} not found (the shared traces)")
    s = execute(cfg_of("workload=mooncake", f"workload.path={MOONCAKE}", "workload.max_requests=200",
                       "backend/cost_model=constant", "backend.cost_model.step_s=0.01", *QUIET), tmp_path)
    rows = [json.loads(line) for line in MOONCAKE.read_text().splitlines()[:200]]   # the file is in arrival order
    longer = [i for i, r in enumerate(rows) if r["input_length"] + r["output_length"] > 40960]
    meta = s["meta"]
    assert meta["max_model_len"] == 40960 and meta["max_model_len_source"] == "Qwen3-8B's context window"
    assert meta["num_clipped"] == len(longer) > 0 and meta["num_dropped_too_long"] == 0
    req = pd.read_parquet(tmp_path / "requests.parquet").sort_values("request_id")
    # (the default spread_within_bucket=true also marks moved arrivals: arrival_spread, beside the clipping)
    changed = req[req["input_change"].str.contains("clipped")]
    assert sorted(changed["source_line"] - 1) == longer
    # every row joins back to its line of the file, with the trace's own lengths and time
    for r in req.itertuples():
        line = rows[r.source_line - 1]
        assert (r.trace_num_prompt_tokens, r.trace_num_output_tokens) == (line["input_length"], line["output_length"])
        assert r.trace_arrival_time_s == line["timestamp"] / 1000
        if "clipped" not in r.input_change:
            assert (r.num_prompt_tokens, r.num_output_tokens) == (line["input_length"], line["output_length"])
        else:
            assert "clipped_prompt" in r.input_change and r.num_prompt_tokens + r.num_output_tokens <= 40960
    err = capsys.readouterr().err
    assert "WARNING" in err and f"{len(longer)} clipped to max_model_len=40960" in err
    num_lines = len(MOONCAKE.read_text().splitlines())
    assert f"200 of {num_lines} rows used (skip_requests / max_requests)" in format_summary(s)


def test_clipped_and_reordered_rows_carry_their_change_and_line(tmp_path):
    # line 3 is listed after line 2, which arrives later (re-sorted); line 4 has a too-long prompt,
    # line 5 a too-long output.
    p = write(tmp_path, "arrived_at,num_prefill_tokens,num_decode_tokens\n"
                        "2,5,2\n1,6,3\n3,200,4\n4,50,100\n5,7,1\n")
    s = execute(cfg_of("workload=azure_conv", f"workload.path={p}", "max_model_len=100", *FAST, *QUIET), tmp_path)
    req = pd.read_parquet(tmp_path / "requests.parquet").set_index("source_line").sort_index()
    assert req["input_change"].to_dict() == {2: "", 3: "reordered", 4: "clipped_prompt", 5: "clipped_output", 6: ""}
    assert req.loc[4, "num_prompt_tokens"] == 99 and req.loc[4, "trace_num_prompt_tokens"] == 200
    assert (req.loc[5, "num_prompt_tokens"], req.loc[5, "num_output_tokens"]) == (50, 50)
    assert req.loc[5, "trace_num_output_tokens"] == 100
    m = s["meta"]
    assert (m["num_clipped"], m["num_clipped_prompt"], m["num_clipped_output"], m["num_reordered"]) == (2, 1, 1, 1)
    assert m["num_clipped_tokens"] == (200 + 4 - 100) + (150 - 100)


def test_dropped_and_skipped_rows_are_listed_by_line(tmp_path):
    p = write(tmp_path, "arrived_at,num_prefill_tokens,num_decode_tokens\n"
                        "0,5,2\n1,oops,3\n2,300,4\n3,6,1\n")
    s = execute(cfg_of("workload=azure_conv", f"workload.path={p}", "max_model_len=100", "workload.too_long=drop",
                       "workload.on_error=skip", *FAST, *QUIET), tmp_path)
    m = s["meta"]
    assert (m["num_dropped_too_long"], m["dropped_lines"], m["num_dropped_tokens"]) == (1, [4], 304)
    assert (m["num_rows_skipped"], m["skipped_lines"]) == (1, [3])
    assert sorted(pd.read_parquet(tmp_path / "requests.parquet")["source_line"]) == [2, 5]
    text = format_summary(s)
    assert "1 dropped as longer than max_model_len=100 (too_long=drop)" in text
    assert "1 malformed rows skipped (on_error=skip)" in text


def test_warning_only_above_the_threshold(tmp_path):
    rows = "".join(f"{i},10,10\n" for i in range(200))
    few = read_vidur_trace(write(tmp_path, "arrived_at,num_prefill_tokens,num_decode_tokens\n" + rows
                                 + "200,10,11\n"), max_model_len=20)        # 1 of 201, 1 token of 4021
    meta = {"max_model_len": 20, **input_meta(few)}
    assert meta["lost_request_fraction"] <= LOSS_WARN_FRACTION and loss_warning(meta, 40960) is None
    many = read_vidur_trace(write(tmp_path, "arrived_at,num_prefill_tokens,num_decode_tokens\n" + rows
                                  + "".join(f"{200 + i},10,11\n" for i in range(5))), max_model_len=20)
    meta = {"max_model_len": 20, **input_meta(many)}
    text = loss_warning(meta, 40960)
    assert text.startswith("WARNING") and "5 clipped to max_model_len=20" in text
    assert "2.44% of the requests do not run as recorded" in text              # clipped: they run, shorter
    assert "raise max_model_len (up to 40960" in text and "workload.too_long=drop" in text


def test_an_unchanged_workload_says_so():
    assert describe_input({"num_clipped": 0}).startswith("run as recorded")


def test_rescaled_arrivals_are_named_not_called_as_recorded(tmp_path):
    rows = "".join(f"{t},10,11\n" for t in (0, 1, 2, 3, 4))            # 1 req/s
    wl = read_vidur_trace(write(tmp_path, "arrived_at,num_prefill_tokens,num_decode_tokens\n" + rows),
                          target_rate_rps=4.0)
    assert wl.stats.arrival_scale == pytest.approx(0.25)
    text = describe_input(input_meta(wl))
    assert text.startswith("arrival gaps scaled x0.25 as asked") and "as recorded" not in text
    as_read = read_vidur_trace(write(tmp_path, "arrived_at,num_prefill_tokens,num_decode_tokens\n" + rows))
    assert describe_input(input_meta(as_read)).startswith("run as recorded")


def test_raising_max_model_len_alone_runs(tmp_path):
    s = execute(cfg_of("max_model_len=16384", "workload=all_at_once", "workload.num_requests=4", *FAST, *QUIET),
                tmp_path / "a")
    assert s["meta"]["max_num_batched_tokens"] == 16384 and s["meta"]["max_model_len_source"] == "given"
    assert "chunked prefill off" in s["meta"]["max_num_batched_tokens_source"]
    chunked = execute(cfg_of("max_model_len=16384", "enable_chunked_prefill=true", "workload=all_at_once",
                             "workload.num_requests=4", *FAST, *QUIET), tmp_path / "b")
    assert chunked["meta"]["max_num_batched_tokens"] == 8192


def test_the_setup_line_says_when_overlap_scheduling_is_on(tmp_path):
    runs = {flag: execute(cfg_of(f"overlap_scheduling={flag}", "workload=all_at_once", "workload.num_requests=4",
                                 *FAST, *QUIET), tmp_path / flag) for flag in ("true", "false")}
    setup = {flag: next(x for x in format_summary(s).splitlines() if x.startswith("setup")) for flag, s in runs.items()}
    assert setup["true"].endswith(", overlap scheduling on") and "overlap" not in setup["false"]
    assert runs["true"]["meta"]["overlap_scheduling"] is True and runs["false"]["meta"]["overlap_scheduling"] is False


def test_printed_summary_names_the_chosen_budget_and_limit(tmp_path, capsys):
    execute(cfg_of("workload=all_at_once", "workload.num_requests=4", *FAST, "progress=false", "plots=false"),
            tmp_path)
    out = capsys.readouterr().out
    assert "max_model_len 40960 (Qwen3-0.6B's context window)" in out
    assert "max_num_batched_tokens 40960 (derived: max(max_model_len=40960, 8192)" in out
    assert "run as recorded" in out


def test_given_max_model_len_above_the_model_is_refused(tmp_path):
    with pytest.raises(ValueError, match=r"max_model_len=50000 exceeds Qwen3-0.6B's 40960 positions"):
        execute(cfg_of("max_model_len=50000", *FAST, *QUIET), tmp_path)


def test_one_default_for_the_batch_budget_everywhere():
    from experiments.validate import parse_args
    args = parse_args(["--out-dir", "x"])
    defaults = {"hydra": ServelabConfig.max_num_batched_tokens, "scheduler": SchedulerConfig.max_num_batched_tokens,
                "engine": EngineConfig.max_num_batched_tokens,
                "replay": EngineRunConfig.max_num_batched_tokens, "validate": args.max_num_batched_tokens}
    assert set(defaults.values()) == {None}, defaults
    assert ServelabConfig.max_model_len is None and args.max_model_len is None


def test_scheduler_derives_the_budget_from_its_step_shape():
    assert Scheduler(SchedulerConfig(num_kvcache_blocks=8)).token_budget == 8192
    long = Scheduler(SchedulerConfig(num_kvcache_blocks=8, max_model_len=40960))
    assert long.token_budget == long.config.max_num_batched_tokens == 40960
    chunked = Scheduler(SchedulerConfig(num_kvcache_blocks=8, max_model_len=40960, enable_chunked_prefill=True))
    assert chunked.token_budget == 8192
    sarathi = Scheduler(SchedulerConfig(num_kvcache_blocks=8, max_model_len=40960), SarathiPolicy(token_budget=512))
    assert sarathi.config.max_num_batched_tokens == 8192 and sarathi.token_budget == 512     # sarathi chunks
    assert "policy 'sarathi' caps a step at 512 tokens" in sarathi.max_num_batched_tokens_reason
    given = Scheduler(SchedulerConfig(num_kvcache_blocks=8, max_num_batched_tokens=4096))
    assert given.token_budget == 4096 and given.max_num_batched_tokens_reason == "given"


def test_synthetic_requests_have_no_source_line_and_sharegpt_rows_do(tmp_path):
    from experiments.workloads import Fixed, Poisson, sharegpt_workload, synthetic_workload
    cols = synthetic_workload(5, Poisson(1.0), Fixed(10), Fixed(5)).input_columns()
    assert (cols["source_line"] == 0).all() and (cols["input_change"] == "").all()
    p = write(tmp_path, "num_prefill_tokens,num_decode_tokens\n10,5\n20,6\n30,7\n")
    wl = sharegpt_workload(p, Poisson(1.0), num_requests=6, sample=True)
    lines = wl.input_columns()["source_line"]
    np.testing.assert_array_equal(wl.num_prompt_tokens, (lines - 1) * 10)     # line k holds prompt 10 * (k - 1)


@pytest.fixture(scope="module")
def tiny64(tmp_path_factory):
    pytest.importorskip("torch")
    from tests.engine.tiny_model import make_tiny_qwen3
    ckpt = tmp_path_factory.mktemp("tiny64")
    make_tiny_qwen3(ckpt, max_position_embeddings=64)        # the engine's limit: min(4096, 64)
    return ckpt


def engine_cfg(ckpt, *extra):
    return cfg_of("backend=engine", f"backend.model_path={ckpt}", "backend.device=cpu", "backend.enforce_eager=true",
                  "workload=all_at_once", "workload.num_requests=2", "workload/prompt_len=fixed",
                  "workload.prompt_len.tokens=100", "workload/output_len=fixed", "workload.output_len.tokens=2",
                  "num_kvcache_blocks=32", "num_cpu_blocks=0", *extra, *QUIET)


def test_engine_backend_writes_the_same_input_columns(tiny64, tmp_path):
    from engine.core.recorder import REQUEST_COLUMNS
    from experiments.workloads.changes import INPUT_COLUMNS
    s = execute(engine_cfg(tiny64), tmp_path / "run")
    assert s["meta"]["max_model_len"] == 64 and "max_position_embeddings=64" in s["meta"]["max_model_len_source"]
    assert s["meta"]["num_clipped"] == 2 and s["meta"]["max_num_batched_tokens"] == 8192
    req = pd.read_parquet(tmp_path / "run" / "requests.parquet")
    assert list(req.columns) == list(REQUEST_COLUMNS) + list(INPUT_COLUMNS)
    assert (req["input_change"] == "clipped_prompt").all() and (req["trace_num_prompt_tokens"] == 100).all()
    assert (req["num_prompt_tokens"] == 63).all() and (req["status"] == "finished").all()


def test_engine_backend_runs_the_overlapped_loop_when_asked(tiny64, tmp_path):
    # servelab backend=engine ran the synchronous loop whatever overlap_scheduling said
    on = execute(engine_cfg(tiny64, "overlap_scheduling=true"), tmp_path / "on")
    off = execute(engine_cfg(tiny64), tmp_path / "off")
    assert on["meta"]["overlap_scheduling"] is True and off["meta"]["overlap_scheduling"] is False
    steps_on = pd.read_parquet(tmp_path / "on" / "steps.parquet")
    steps_off = pd.read_parquet(tmp_path / "off" / "steps.parquet")
    assert steps_on["launch_host_s"].notna().all()          # recorded by the overlapped loop only
    assert "launch_host_s" not in steps_off or steps_off["launch_host_s"].isna().all()
    assert len(pd.read_parquet(tmp_path / "on" / "requests.parquet")) == 2


def test_engine_backend_checks_a_given_max_model_len(tiny64, tmp_path):
    with pytest.raises(ValueError, match=r"max_model_len \(100\) exceeds the model's max_position_embeddings \(64\)"):
        execute(engine_cfg(tiny64, "max_model_len=100"), tmp_path / "run")


def test_spread_arrivals_are_counted_printed_and_marked_per_request(tmp_path, capsys):
    # two buckets of 3 requests, 3 s apart (the published Mooncake timestamps come in such buckets); the default
    # spread_within_bucket=true used to move them with only "run as recorded" on the input line
    p = write(tmp_path, "".join(f'{{"timestamp": {t}, "input_length": 20, "output_length": 2, "hash_ids": [{i}]}}\n'
                                for i, t in enumerate([0, 0, 0, 3000, 3000, 3000])), "m.jsonl")
    s = execute(cfg_of("workload=mooncake", f"workload.path={p}", *FAST, *QUIET), tmp_path / "a")
    req = pd.read_parquet(tmp_path / "a" / "requests.parquet").set_index("source_line").sort_index()
    assert req["arrival_time_s"].tolist() == pytest.approx([0, 1, 2, 3, 4, 5])
    assert req["trace_arrival_time_s"].tolist() == [0, 0, 0, 3, 3, 3]
    assert req["input_change"].tolist() == ["", "arrival_spread", "arrival_spread"] * 2
    m = s["meta"]
    assert m["num_spread"] == 4 and m["spread_max_shift_s"] == pytest.approx(2.0)
    line = describe_input(m)
    assert line.startswith("4 arrivals moved later within their timestamp bucket, by up to 2 s "
                           "(spread_within_bucket=true; workload.spread_within_bucket=false runs the recorded times)")
    assert "nothing lost" in line
    err = capsys.readouterr().err
    assert err.count("NOTE:") == 1 and "4 arrivals moved later" in err
    recorded = execute(cfg_of("workload=mooncake", f"workload.path={p}", "workload.spread_within_bucket=false",
                              *FAST, *QUIET), tmp_path / "b")
    assert describe_input(recorded["meta"]).startswith("run as recorded") and "NOTE" not in capsys.readouterr().err
    req = pd.read_parquet(tmp_path / "b" / "requests.parquet")
    assert (req["input_change"] == "").all() and (req["arrival_time_s"] == req["trace_arrival_time_s"]).all()
    # with the gaps rescaled (6 requests over 6 s spread: 1 req/s; asked 0.5), the shift is given on both clocks
    slow = execute(cfg_of("workload=mooncake", f"workload.path={p}", "workload.target_rate_rps=0.5", *FAST, *QUIET),
                   tmp_path / "c")
    assert "by up to 2 s of trace time (4 s as run)" in describe_input(slow["meta"])


def test_sampled_rows_and_synthetic_times_are_counted_printed_and_marked(tmp_path, capsys):
    # a lengths-only file: used to print "run as recorded" although every row was drawn and every time made up
    p = write(tmp_path, "num_prefill_tokens,num_decode_tokens\n" + "".join(f"{10 + i},{1 + i}\n" for i in range(5)))
    s = execute(cfg_of("workload=sharegpt", f"workload.path={p}", "workload.num_requests=40", *FAST, *QUIET),
                tmp_path / "a")
    req = pd.read_parquet(tmp_path / "a" / "requests.parquet")
    assert (req["input_change"] == "sampled+synthetic_arrival").all() and req["trace_arrival_time_s"].isna().all()
    assert set(req["source_line"]) <= set(range(2, 7))
    m = s["meta"]
    assert (m["num_sampled"], m["num_synthetic_arrivals"]) == (40, 40)
    assert m["num_sampled_distinct"] == req["source_line"].nunique()
    assert m["arrival_source"] == "Poisson(rate_rps=10.0)"
    line = describe_input(m)
    assert line.startswith(f"40 rows drawn with replacement from the file's 5 ({m['num_sampled_distinct']} distinct; "
                           "sample=true")
    assert "40 arrival times synthetic, Poisson(rate_rps=10.0) (the file gives none)" in line
    assert capsys.readouterr().err.count("NOTE:") == 1
    in_order = execute(cfg_of("workload=sharegpt", f"workload.path={p}", "workload.num_requests=3",
                              "workload.sample=false", *FAST, *QUIET), tmp_path / "b")
    assert sorted(pd.read_parquet(tmp_path / "b" / "requests.parquet")["input_change"]) == ["synthetic_arrival"] * 3
    assert "rows drawn" not in describe_input(in_order["meta"])
    assert "3 of 5 rows used" in describe_input(in_order["meta"])
    whole = {"num_rows_read": 5, "num_workload_requests": 5}
    assert describe_input(whole) == "run as recorded (nothing clipped, dropped, skipped or re-sorted)"
    head = {**whole, "num_workload_requests": 3, "num_truncated": 2}
    assert describe_input(head) == ("run as recorded; of the rows used none clipped, dropped or re-sorted; 3 of 5 "
                                    "rows used (skip_requests / max_requests)")


def test_lengths_drawn_from_a_file_are_reported(tmp_path, capsys):
    p = write(tmp_path, "num_prefill_tokens,num_decode_tokens\n" + "".join(f"{10 + i},{1 + i}\n" for i in range(5)))
    s = execute(cfg_of("workload/prompt_len=file", f"workload.prompt_len.path={p}", "workload.num_requests=6", *FAST,
                       *QUIET), tmp_path / "a")
    assert (pd.read_parquet(tmp_path / "a" / "requests.parquet")["input_change"] == "sampled").all()
    assert describe_input(s["meta"]).startswith(f"6 requests' prompt lengths of {p} (num_prefill_tokens) drawn with "
                                                "replacement, each column on its own")
    assert capsys.readouterr().err.count("NOTE:") == 1
