"""Tenants and SLO targets end to end: synthetic tenant mixes, trace columns, the request table's met columns,
the per-tenant / per-class / fairness numbers (worked out by hand), their plots, and one-line errors for bad input."""
import json
import math

import numpy as np
import pandas as pd
import pytest

from engine.core.recorder import Recorder
from engine.core.requests import Workload
from engine.core.sequence import SamplingParams, Sequence, SequenceStatus
from experiments.tenant_metrics import (
    fairness_summary,
    jain_index,
    per_class,
    per_tenant,
    service_difference,
    service_timeline,
)
from experiments.workloads import Fixed, TenantStream, read_mooncake_trace, read_vidur_trace, tenant_mix_workload
from tests.experiments.cli import QUIET, error_line, in_tmp  # noqa: F401  (in_tmp: a fixture)

F = Fixed(8)


def test_tenant_mix_streams_are_independent_and_keep_their_classes():
    a = {"tenant": "a", "rate_rps": 5.0, "ttft_slo_s": 0.5, "tpot_slo_s": 0.05}
    b = {"tenant": "b", "rate_rps": 2.0}
    one = tenant_mix_workload([a], 10.0, F, F, seed=3)
    two = tenant_mix_workload([a, b], 10.0, F, F, seed=3)
    assert set(two.tenant) == {"a", "b"} and np.all(np.diff(two.arrival_time_s) >= 0)
    # a's arrivals do not move when b is added (times shift only by the common start at the first arrival)
    first = min(one.arrival_time_s[0], two.arrival_time_s[0])
    ta = two.arrival_time_s[two.tenant == "a"]
    np.testing.assert_allclose(ta - ta[0], one.arrival_time_s - one.arrival_time_s[0])
    assert first == 0.0
    is_a = two.tenant == "a"
    assert np.all(two.ttft_slo_s[is_a] == 0.5) and np.all(np.isnan(two.ttft_slo_s[~is_a]))
    spec = next(s for s in two if s.tenant == "b")
    assert spec.ttft_slo_s is None and spec.tpot_slo_s is None
    assert next(s for s in two if s.tenant == "a").tpot_slo_s == 0.05
    assert two.to_frame()["tenant"].tolist() == two.tenant.tolist()


def test_bursts_send_only_in_their_on_periods_and_rate_scale_scales():
    st = TenantStream("x", rate_rps=20.0, start_s=2.0, end_s=32.0, burst_on_s=2.0, burst_off_s=8.0)
    t = st.arrivals(100.0, np.random.default_rng(0), 1.0)
    assert t.min() >= 2.0 and t.max() < 32.0
    assert np.all((t - 2.0) % 10.0 < 2.0)                    # inside [2 + 10k, 4 + 10k)
    assert 80 < len(t) < 160                                 # 3 bursts x 2 s x 20 req/s = 120 expected
    double = st.arrivals(100.0, np.random.default_rng(0), 2.0)
    assert 1.6 < len(double) / len(t) < 2.4


def test_trace_columns_name_tenants_and_targets(tmp_path):
    csv = tmp_path / "t.csv"
    csv.write_text("arrived_at,num_prefill_tokens,num_decode_tokens,user,ttft,tpot\n"
                   "0.0,10,5,alice,0.5,0.1\n1.0,12,6,bob,,\n0.5,8,3,alice,2,\n")
    wl = read_vidur_trace(csv, tenant_column="user", ttft_slo_column="ttft", tpot_slo_column="tpot", max_requests=2)
    # sorted by arrival (line 4 moves up), the columns travel with their rows; max_requests keeps the first two
    assert wl.tenant.tolist() == ["alice", "alice"] and wl.ttft_slo_s.tolist() == [0.5, 2.0]
    assert wl.tpot_slo_s[0] == 0.1 and math.isnan(wl.tpot_slo_s[1])
    jl = tmp_path / "t.jsonl"
    jl.write_text('{"timestamp": 0, "input_length": 5, "output_length": 2, "hash_ids": [1], "u": 7, "t": null}\n'
                  '{"timestamp": 1, "input_length": 5, "output_length": 2, "hash_ids": [2], "u": "x", "t": 3}\n')
    wl = read_mooncake_trace(jl, tenant_column="u", ttft_slo_column="t")
    assert wl.tenant.tolist() == ["7", "x"] and math.isnan(wl.ttft_slo_s[0]) and wl.ttft_slo_s[1] == 3.0
    for bad in ("nan", "-1", "0", "soon"):
        csv.write_text(f"arrived_at,num_prefill_tokens,num_decode_tokens,ttft\n0.0,10,5,{bad}\n")
        with pytest.raises(ValueError, match=r"line 2, column 'ttft': invalid value .*seconds > 0"):
            read_vidur_trace(csv, ttft_slo_column="ttft")


def test_workload_refuses_bad_targets_and_tenants():
    cols = dict(arrival_time_s=np.zeros(2), num_prompt_tokens=np.ones(2, np.int64),
                num_output_tokens=np.ones(2, np.int64), priority=np.zeros(2, np.int64))
    with pytest.raises(ValueError, match=r"Workload.ttft_slo_s\[1\] is -0.5; an SLO target must be"):
        Workload(**cols, ttft_slo_s=np.array([np.nan, -0.5]))
    with pytest.raises(ValueError, match=r"Workload.tpot_slo_s\[0\] is inf"):
        Workload(**cols, tpot_slo_s=np.array([np.inf, 1.0]))
    with pytest.raises(ValueError, match=r"Workload.tenant\[1\] is ''"):
        Workload(**cols, tenant=np.array(["a", ""], dtype=object))


def _finished(rid, tenant, arrival, ttft, e2e, n_out, ttft_slo=None, tpot_slo=None, prompt=10, rec=None):
    seq = Sequence(rid, list(range(prompt)), SamplingParams(max_tokens=n_out), arrival_time_s=arrival, tenant=tenant,
                   ttft_slo_s=ttft_slo, tpot_slo_s=tpot_slo)
    seq.token_ids += [0] * n_out
    seq.first_scheduled_time_s = arrival + ttft / 2
    seq.first_token_time_s, seq.finish_time_s = arrival + ttft, arrival + e2e
    seq.status = SequenceStatus.FINISHED
    rec.on_finish(seq)


def hand_table() -> pd.DataFrame:
    rec = Recorder()
    # tenant a: r0 meets both targets (TTFT 1 <= 2, TPOT (3 - 1) / 4 = 0.5 <= 0.5); r1 misses TTFT (3 > 2).
    _finished(0, "a", 0.0, 1.0, 3.0, 5, ttft_slo=2.0, tpot_slo=0.5, rec=rec)
    _finished(1, "a", 1.0, 3.0, 4.0, 3, ttft_slo=2.0, tpot_slo=0.5, rec=rec)
    # tenant b: r2 has no target; r3 a 1-token output (TPOT counts 0) within its TPOT target; r4 rejected.
    _finished(2, "b", 0.0, 0.5, 2.5, 3, rec=rec)
    _finished(3, "b", 2.0, 1.0, 1.0, 1, tpot_slo=0.1, rec=rec)
    rej = Sequence(4, [1, 2], SamplingParams(max_tokens=2), arrival_time_s=3.0, tenant="b", ttft_slo_s=9.0)
    rej.status, rej.reject_reason = SequenceStatus.REJECTED, "policy edf: TTFT target 9 s can no longer be met"
    rec.on_finish(rej)
    return rec.requests_frame()


def test_request_table_says_which_targets_were_met():
    df = hand_table()
    assert df["tenant"].tolist() == ["a", "a", "b", "b", "b"]
    assert df["ttft_slo_met"].tolist() == [True, False, pd.NA, pd.NA, False]
    assert df["tpot_slo_met"].tolist() == [True, True, pd.NA, True, pd.NA]
    assert df["slo_met"].tolist() == [True, False, pd.NA, True, False]
    assert np.isnan(df["ttft_slo_s"][2]) and df["tpot_slo_s"][3] == 0.1


def test_per_tenant_and_per_class_by_hand():
    df = hand_table()
    t = per_tenant(df).set_index("tenant")
    # makespan: first arrival 0 to last finish 5 s (r1 finishes at 1 + 4).
    assert t.loc["a", "num_finished"] == 2 and t.loc["b", "num_rejected"] == 1
    assert t.loc["a", "output_throughput_tps"] == pytest.approx(8 / 5)
    # service = prompt + 2 x outputs: a (10 + 10) + (10 + 6) = 36; b (10 + 6) + (10 + 2) = 28, r4 rejected: 0
    assert t.loc["a", "service_tokens"] == 36 and t.loc["b", "service_tokens"] == 28
    assert t.loc["a", "slo_attainment"] == 0.5 and t.loc["b", "slo_attainment"] == 0.5   # b: r3 yes, r4 no
    assert t.loc["a", "goodput_rps"] == pytest.approx(1 / 5) and t.loc["b", "goodput_rps"] == pytest.approx(2 / 5)
    c = per_class(df).set_index("slo_class")
    assert list(c.index) == ["no target", "TPOT <= 0.1 s", "TTFT <= 2 s, TPOT <= 0.5 s", "TTFT <= 9 s"]
    assert c.loc["TTFT <= 2 s, TPOT <= 0.5 s", "ttft_attainment"] == 0.5
    assert c.loc["TTFT <= 2 s, TPOT <= 0.5 s", "tpot_attainment"] == 1.0
    assert c.loc["TTFT <= 9 s", "num_rejected_by_policy"] == 1 and c.loc["TTFT <= 9 s", "slo_attainment"] == 0.0
    assert math.isnan(c.loc["no target", "slo_attainment"])
    s = fairness_summary(df)
    assert s["num_tenants"] == 2 and s["num_rejected_by_policy"] == 1 and s["num_with_slo"] == 4
    assert s["slo_attainment_targets"] == 0.5 and s["goodput_targets_rps"] == pytest.approx(2 / 5)
    assert s["jain_index_overall"] == pytest.approx((36 + 28) ** 2 / (2 * (36 ** 2 + 28 ** 2)))


def test_jain_index_and_service_over_time():
    assert jain_index([1, 1, 1]) == 1.0 and jain_index([1, 0, 0, 0]) == 0.25 and math.isnan(jain_index([0, 0]))
    rec = Recorder()
    # Two tenants queued from t0 to t2 (first scheduled at 2), then served: x prompt 10 with 5 outputs
    # (first token at 4, finish at 8), y prompt 10 with 1 output at 4.
    for rid, tenant, n_out, e2e in ((0, "x", 5, 8.0), (1, "y", 1, 4.0)):
        _finished(rid, tenant, 0.0, 4.0, e2e, n_out, rec=rec)
    df = rec.requests_frame()
    tl = service_timeline(df, window_s=2.0)
    x = tl[tl["tenant"] == "x"]
    # x: prompt 10 + first output 2 at t4 (window [4, 6)), then 4 outputs linearly over (4, 8]: 2 per window
    assert x["service_tokens"].tolist() == pytest.approx([0, 0, 10 + 2 + 4, 4])
    assert tl["backlogged"].tolist() == [True, False, False, False] * 2       # queued through [0, 2) only
    diff = service_difference(tl)
    assert diff["num_backlogged"].tolist() == [2, 0, 0, 0] and diff["service_diff_rate"][0] == 0.0
    assert math.isnan(diff["jain_index"][0])                 # neither got service yet: undefined
    with pytest.raises(ValueError, match="window_s must be > 0"):
        service_timeline(df, window_s=0)


def test_plots_of_tenants_and_classes(tmp_path):
    from experiments import plots
    df = hand_table()
    tl = service_timeline(df)
    assert plots.tenant_service(tl, service_difference(tl), tmp_path / "s.png").stat().st_size > 0
    assert plots.tenant_latency(per_tenant(df), tmp_path / "t.png").stat().st_size > 0
    assert plots.slo_classes(per_class(df), tmp_path / "c.png").stat().st_size > 0
    assert plots.service_difference_runs({"a": service_difference(tl)}, tmp_path / "d.png").stat().st_size > 0
    runs = pd.DataFrame({"request_rate_rps": [1, 2, 1, 2], "policy": ["p", "p", "q", "q"],
                         "slo_attainment_targets": [1, 0.5, 1, 0.8], "goodput_targets_rps": [1, 1, 1, 1.6]})
    assert plots.attainment_vs_load(runs, tmp_path / "a.png").stat().st_size > 0


def test_a_multi_tenant_run_writes_tables_rows_and_plots(in_tmp, monkeypatch, capsys):
    from tests.experiments.cli import servelab
    code, out, _ = servelab(monkeypatch, capsys, "workload=slo_classes", "workload.duration_s=2", "model=qwen3_0p6b",
                            "scheduler=edf_reject", "progress=false", "hydra.run.dir=run")
    assert code in (0, None)
    s = json.loads((in_tmp / "run" / "summary.json").read_text())
    assert {r["tenant"] for r in s["tenants"]} == {"chat", "batch"}
    assert {r["slo_class"] for r in s["slo_classes"]} == {"TTFT <= 0.5 s, TPOT <= 0.05 s",
                                                          "TTFT <= 10 s, TPOT <= 0.2 s"}
    assert "slo_attainment_targets" in s["metrics"] and "tenant chat" in out and "class TTFT <= 0.5 s" in out
    for name in ("tenant_service.png", "tenant_latency.png", "slo_classes.png"):
        assert (in_tmp / "run" / name).stat().st_size > 0
    req = pd.read_parquet(in_tmp / "run" / "requests.parquet")
    assert req["slo_met"].notna().all() and set(req["tenant"]) == {"chat", "batch"}


@pytest.mark.parametrize("args, expected", [
    (["workload=tenants", "workload.streams=[{tenant: a, rate_rps: 0}]"],
     "error: workload.streams[0].rate_rps must be a finite number > 0, got 0"),
    (["workload=tenants", "workload.streams=[{tenant: a, rate_rps: 1, ttft_slo_s: -1}]"],
     "error: workload.streams[0].ttft_slo_s must be a finite number > 0 (or null for none), got -1"),
    (["workload=tenants", "workload.streams=[{tenant: a, rate_rps: 1, tpot_slo_s: nan}]"],
     "error: workload.streams[0].tpot_slo_s must be a finite number > 0 (or null for none), got nan"),
    (["workload=tenants", "workload.streams=[{tenant: a, rate: 1}]"],
     "error: workload.streams[0] has unknown key(s) ['rate']"),
    (["workload=tenants", "scheduler=vtc", "scheduler.tenant_weights={heavy: 0}"],
     "error: scheduler: vtc.tenant_weights['heavy'] must be a finite number > 0, got 0"),
    (["workload=tenants", "scheduler=vtc", "scheduler.tenant_weights={heavy: -1.5}"],
     "error: scheduler: vtc.tenant_weights['heavy'] must be a finite number > 0, got -1.5"),
    (["scheduler=edf", "scheduler.on_late=drop"], "error: scheduler: edf.on_late must be one of"),
    (["workload=tenants", "scheduler=vtc", "scheduler.tenant_weights={lite: 2}"],
     "error: scheduler.tenant_weights names ['lite'], a tenant no request of the workload has (its tenants: "
     "['bursty', 'heavy', 'light'])"),
])
def test_bad_tenant_and_slo_input_is_one_line(in_tmp, monkeypatch, capsys, args, expected):
    assert error_line(monkeypatch, capsys, *QUIET, "model=qwen3_0p6b", *args).startswith(expected)


def test_sweep_report_draws_attainment_and_service_difference(tmp_path, capsys):
    from hydra import compose, initialize_config_dir

    from experiments.report import main, make_report
    from experiments.run import CONF_DIR, execute
    with initialize_config_dir(str(CONF_DIR), version_base="1.3"):
        for policy in ("vllm", "edf_reject"):
            for scale in (0.6, 1.5):
                overrides = [f"scheduler={policy}", f"workload.rate_scale={scale}"]
                cfg = compose("config", overrides=["experiment=slo_vs_load", "workload.duration_s=10", *overrides,
                                                   *QUIET])
                execute(cfg, tmp_path / "sw" / ",".join(overrides), {"scheduler": policy}, overrides)
    df, files = make_report(tmp_path / "sw")
    names = {p.name for p in files}
    assert {"slo_attainment.png", "service_difference.png"} <= names
    assert set(df["policy"]) == {"vllm", "edf_reject"} and df["slo_attainment_targets"].notna().all()
    top = df[df["workload.rate_scale"] == 1.5].set_index("policy")
    assert top.loc["edf_reject", "slo_attainment_targets"] > top.loc["vllm", "slo_attainment_targets"]
    main([str(tmp_path / "sw")])                     # the printed table carries attainment and goodput
    header = capsys.readouterr().out.splitlines()[0].split()
    assert {"slo_attainment_targets", "goodput_targets_rps"} <= set(header)
    assert "cost_model_share_time_outside" not in header     # a column no run has is left out


def test_both_loops_record_requests_the_policy_rejects_even_when_nothing_is_left():
    # Requests 0 and 2 (TTFT target 1 us) can never make it: edf rejects them at their first step, and at
    # request 2's step nothing else is waiting or running; both loops must record them and go on to request 3.
    from engine.core.scheduler import Scheduler, SchedulerConfig
    from experiments.runner_engine import make_sequences, run_loop
    from policies.scheduling.edf import EDFPolicy
    from sim.cost_model.constant import ConstantCostModel
    from sim.replica import Replica
    from sim.simulator import Simulator
    from tests.experiments.test_validation import FakeClock

    n = 5                   # one request a second, 8 prompt tokens, 2 outputs (2 steps of 0.1 s)
    wl = Workload(arrival_time_s=np.arange(n, dtype=float), num_prompt_tokens=np.full(n, 8),
                  num_output_tokens=np.full(n, 2), priority=np.zeros(n, np.int64),
                  ttft_slo_s=np.where(np.arange(n) % 2 == 0, 1e-6, np.nan))

    def scheduler():
        return Scheduler(SchedulerConfig(num_kvcache_blocks=64, max_model_len=256),
                         EDFPolicy(on_late="reject", prefill_tokens_per_s=1000.0))

    tables = []
    rec = Recorder()
    Simulator(Replica(scheduler(), ConstantCostModel(step_s=0.1), rec), vocab_size=100).run(wl)
    tables.append(rec.requests_frame())
    clock, rec = FakeClock(), Recorder()

    def execute(batch):
        clock.t += 0.1
        return [7] * len(batch.seqs)

    info = run_loop(scheduler(), execute, lambda: None, make_sequences(wl, vocab_size=100), rec, clock=clock,
                    sleep=clock.sleep)
    tables.append(rec.requests_frame())
    assert info["num_rejected"] == (n + 1) // 2
    for df in tables:
        df = df.sort_values("request_id")
        assert df["status"].tolist() == ["rejected" if i % 2 == 0 else "finished" for i in range(n)]
        assert df["reject_reason"][df["status"] == "rejected"].str.startswith("policy edf: ").all()
        assert df["slo_met"].tolist()[:2] == [False, pd.NA]
