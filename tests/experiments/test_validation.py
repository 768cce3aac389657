"""Sim vs real on CPU: the real-time replay loop on a fake clock, then the whole loop with the tiny
model (profile -> calibrate -> engine replay + calibrated simulation -> report), with loose bounds."""
import json

import numpy as np
import pytest

from engine.core.recorder import Recorder
from engine.core.scheduler import Scheduler, SchedulerConfig
from experiments.runner_engine import make_sequences, run_loop, run_loop_overlapped
from experiments.workloads import Constant, Fixed, synthetic_workload


class FakeClock:
    """Wall clock that advances only when the loop sleeps or a step executes."""

    def __init__(self):
        self.t = 100.0
        self.sleeps = []

    def __call__(self):
        return self.t

    def sleep(self, s):
        self.sleeps.append(s)
        self.t += s


def test_replay_loop_respects_arrivals_and_never_sleeps_with_work():
    wl = synthetic_workload(6, Constant(2.0), Fixed(20), Fixed(3))          # arrivals 0, 0.5, ..., 2.5 s
    seqs = make_sequences(wl, vocab_size=100)
    clock = FakeClock()
    step_s = 0.1
    sched = Scheduler(SchedulerConfig(num_kvcache_blocks=64, max_model_len=256))
    busy = {"steps": 0}

    def execute(batch):
        busy["steps"] += 1
        assert all(s.arrival_time_s <= clock.t - 100.0 for s in batch.seqs)   # nothing runs before it arrives
        clock.t += step_s
        return [7] * len(batch.seqs)

    rec = Recorder()
    info = run_loop(sched, execute, lambda: None, seqs, rec, clock=clock, sleep=clock.sleep)
    req = rec.requests_frame().sort_values("request_id")
    assert list(req["request_id"]) == list(range(6)) and (req["status"] == "finished").all()
    # each request: one prefill step then 2 decode steps, alone (the next arrives 0.5 s later)
    assert list(req["first_token_time_s"] - req["arrival_time_s"]) == pytest.approx([step_s] * 6)
    assert list(req["e2e_s"]) == pytest.approx([3 * step_s] * 6)
    # idle between requests: 0.5 - 0.3 s each time, and only then
    assert clock.sleeps == pytest.approx([0.2] * 5)
    assert info["num_steps"] == busy["steps"] == 18
    assert info["busy_s"] == pytest.approx(18 * step_s) and info["idle_s"] == pytest.approx(1.0)


@pytest.mark.parametrize("overlapped", [False, True])
def test_replay_loop_records_each_steps_device_time(overlapped):
    """device_time() after each step lands in that step's row (device_time_s); a step it has no time for
    (None) stays NaN, in both loops."""
    wl = synthetic_workload(3, Constant(2.0), Fixed(20), Fixed(3))
    clock = FakeClock()
    times = iter([0.01 * (i + 1) if i != 4 else None for i in range(100)])
    last = {"t": None}

    def execute(batch):
        clock.t += 0.1
        last["t"] = next(times)
        return [7] * len(batch.seqs)

    rec = Recorder()
    seqs = make_sequences(wl, vocab_size=100)
    sched = Scheduler(SchedulerConfig(num_kvcache_blocks=64, max_model_len=256))
    if overlapped:      # as ModelRunner: launch() times the step, collect() makes it the last one
        def launch(batch):
            tokens = execute(batch)
            return tokens, last["t"]

        def collect(handle):
            last["t"] = handle[1]
            return handle[0]

        run_loop_overlapped(sched, launch, collect, seqs, rec, clock=clock, sleep=clock.sleep,
                            device_time=lambda: last["t"], copy_time=lambda: last["t"] and 2 * last["t"])
    else:
        run_loop(sched, execute, lambda: None, seqs, rec, clock=clock, sleep=clock.sleep,
                 device_time=lambda: last["t"], copy_time=lambda: last["t"] and 2 * last["t"])
    steps = rec.steps_frame()
    dev = steps["device_time_s"].to_numpy()
    assert len(dev) == 9 and np.isnan(dev[4])
    assert list(np.delete(dev, 4)) == pytest.approx([0.01 * (i + 1) for i in range(9) if i != 4])
    # copy_time() (the host's seconds in the step's block copies) lands in copy_host_s the same way
    np.testing.assert_allclose(steps["copy_host_s"].to_numpy(), 2 * dev)
    # launch_host_s: the host's seconds from schedule() to the end of launch(), overlapped only (launch() here
    # advances the clock by the step's 0.1 s)
    host = steps["launch_host_s"].to_numpy()
    if overlapped:
        np.testing.assert_allclose(host, 0.1)
    else:
        assert np.isnan(host).all()


def test_the_model_runner_times_its_block_copies_on_the_host(tiny):
    """ModelRunner.collect leaves the host's seconds in the collected step's block copies in last_copy_host_s,
    None for a step without copies (the steps' copy_host_s)."""
    from engine.config import EngineConfig
    from engine.core.batch import Batch
    from engine.model_runner import ModelRunner
    runner = ModelRunner(EngineConfig(str(tiny), device="cpu", num_kvcache_blocks=16, num_cpu_blocks=16,
                                      max_model_len=256, enforce_eager=True))
    runner.collect(runner.launch(Batch(swap_out=[(1, 2), (3, 4)])))
    assert runner.last_copy_host_s is not None and runner.last_copy_host_s > 0
    runner.collect(runner.launch(Batch()))
    assert runner.last_copy_host_s is None


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    torch = pytest.importorskip("torch")
    from tests.engine.tiny_model import make_tiny_qwen3
    path = tmp_path_factory.mktemp("tiny_validate")
    make_tiny_qwen3(path)
    threads = torch.get_num_threads()
    yield path
    torch.set_num_threads(threads)        # the commands below set 1 thread on cpu


def test_an_idle_wait_sleeps_then_spins_to_the_arrival():
    """An idle replay sleeps until spin_s before the next arrival, then spins on the clock, so the request is
    admitted within a clock read of its arrival (a sleep alone wakes 50-200 us late); an injected sleep (a fake
    clock, which moves only when it sleeps) gets one sleep and no spin, time.sleep IDLE_SPIN_S."""
    import time

    from engine.core.sequence import Sequence
    from experiments.runner_engine import IDLE_SPIN_S, _Intake
    t, sleeps = [0.0], []

    def clock():                     # every read 10 us after the last
        t[0] += 1e-5
        return t[0]

    def sleep(s):
        sleeps.append(s)
        t[0] += s
    seq = Sequence("a", [1, 2, 3], arrival_time_s=0.01)
    intake = _Intake([seq], None, None, clock, sleep, None, spin_s=1e-3)
    assert intake.wait() == pytest.approx(0.01 - 1e-5)
    assert sleeps == [pytest.approx(0.01 - 1e-5 - 1e-3)]
    assert 0.01 <= intake.now() <= 0.01 + 2e-5
    assert _Intake([seq], None, None, clock, sleep, None).spin_s == 0.0
    assert _Intake([seq], None, None, clock, time.sleep, None).spin_s == IDLE_SPIN_S


def test_cpu_validation_loop(tiny, tmp_path):
    from experiments import calibrate, profile, validate

    table = tmp_path / "table.csv"
    assert profile.main(["--model", str(tiny), "--out", str(table), "--device", "cpu", "--grid", "small",
                         "--max-model-len", "512", "--repeats", "3", "--warmup", "1"]) == 0
    meta = json.loads((tmp_path / "table.csv.meta.json").read_text())
    assert meta["grid"] == "small" and meta["num_rows"] > 30 and "experiments.profile" in meta["command"]
    prof = tmp_path / "profile.json"
    assert calibrate.main([str(table), "--out", str(prof), "--hardware", "cpu"]) == 0
    fit = json.loads(prof.read_text())
    assert fit["metadata"]["heldout"]["num_rows"] >= 5 and fit["metadata"]["hardware"] == "cpu"
    # the profiled engine's largest prefill graph reaches the fit (its prefill steps priced at padded counts)
    assert "prefill_graph_max_tokens" in meta and fit["prefill_graph_max_tokens"] == (meta["prefill_graph_max_tokens"]
                                                                                   or None)

    out = tmp_path / "out"
    workload = ["--num-requests", "24", "--arrival", "poisson", "--rate-rps", "12", "--prompt-len", "8:64",
                "--output-len", "4:24", "--max-model-len", "512", "--policies", "vllm",
                "--num-kvcache-blocks", "12", "--profile", str(prof)]
    assert validate.main(["--model", str(tiny), "--device", "cpu", "--out-dir", str(out), "--name", "ci",
                          *workload, "--max-wall-s", "60", "--steps-out", str(tmp_path / "steps.parquet"),
                          "--real-dir", str(tmp_path / "real")]) == 0
    report = json.loads((out / "validation_ci.json").read_text())
    assert (out / "validation_ci.png").stat().st_size > 0
    entry = report["policies"]["vllm"]
    assert entry["real"]["summary"]["num_finished"] == 24
    for name in ("roofline", "calibrated"):
        e = entry["sims"][name]
        assert e["join"] == {"num_real": 24, "num_sim": 24, "num_joined": 24, "num_finished_both": 24,
                             "one_to_one": True}
        for key in ("ttft_s", "tpot_s", "e2e_s"):
            assert set(e[key]) == {"median_rel_err", "p90_rel_err", "mean_signed_rel_err", "num_requests",
                                   "quantile_rel_err", "quantile_rank_pts"}
            assert set(e[key]["quantile_rel_err"]) == {"p50", "p90", "p99"}
        assert set(e["preemptions"]) >= {"real", "sim", "real_swaps", "sim_swaps"}
        assert e["throughput"]["rel_err"] is not None
    cal = entry["sims"]["calibrated"]
    assert cal["e2e_s"]["median_rel_err"] < 1.0          # loose: a shared 2-core CPU is noisy
    assert cal["step_time"]["num_steps"] == entry["real"]["summary"]["num_steps"]

    # the side-by-side table reads the report's numbers back, one row per cost model
    from experiments.validation_table import to_markdown, validation_table
    df = validation_table([out / "validation_ci.json"])
    assert list(df["cost_model"]) == ["roofline", "calibrated"] and set(df["policy"]) == {"vllm"}
    row = df[df["cost_model"] == "calibrated"].iloc[0]
    assert row["e2e_median_err"] == cal["e2e_s"]["median_rel_err"]
    assert row["ttft_p99_err"] == cal["ttft_s"]["quantile_rel_err"]["p99"]
    assert to_markdown(df).count("\n") == 3                  # header, rule, two rows

    # the kept real run re-validates without the engine: same real side, same (deterministic) simulated side
    again = tmp_path / "again"
    assert validate.main(["--from-real", str(tmp_path / "real"), "--out-dir", str(again), "--name", "ci",
                          *workload]) == 0
    redo = json.loads((again / "validation_ci.json").read_text())
    assert redo["policies"]["vllm"]["real"]["summary"] == entry["real"]["summary"]
    assert redo["policies"]["vllm"]["sims"]["calibrated"]["e2e_s"] == cal["e2e_s"]
    assert redo["device"] == report["device"] and "loaded from" in redo["real_side"]
    # without the workload flags: the kept command's are the defaults (the fit is the caller's, not the kept run's)
    bare = tmp_path / "bare"
    assert validate.main(["--from-real", str(tmp_path / "real"), "--out-dir", str(bare), "--name", "ci",
                          "--profile", str(prof)]) == 0
    kept = json.loads((bare / "validation_ci.json").read_text())
    assert kept["workload"] == report["workload"] and kept["policies"]["vllm"]["sims"]["calibrated"]["e2e_s"] == \
        cal["e2e_s"]
    with pytest.raises(ValueError, match=r"the flags give \(12 requests\) is not the kept vllm run's \(24"):
        validate.main(["--from-real", str(tmp_path / "real"), "--out-dir", str(bare), "--name", "ci",
                       "--num-requests", "12"])
    with pytest.raises(FileNotFoundError, match="--real-dir"):
        validate.main(["--from-real", str(tmp_path / "real"), "--out-dir", str(again), "--name", "other", *workload])

    # the engine against itself: a copy of the kept run scores zero on every error, and one run alone is refused
    import shutil

    from experiments.real_vs_real import SPREAD_METRICS, real_vs_real
    shutil.copytree(tmp_path / "real", tmp_path / "real_copy")
    rr = real_vs_real([tmp_path / "real", tmp_path / "real_copy"], "ci")
    assert [p["policy"] for p in rr["pairs"]] == ["vllm"]
    pair = rr["pairs"][0]
    assert pair["e2e_s"]["median_rel_err"] == 0.0 and pair["throughput"]["rel_err"] == 0.0
    assert pair["join"]["one_to_one"] and pair["preemptions"]["real"] == pair["preemptions"]["sim"]
    spread = rr["spread"]["vllm"]
    assert spread["e2e_s_p50"]["rel_range"] == 0.0 and spread["e2e_s_p50"]["min"] == spread["e2e_s_p50"]["max"] > 0
    assert set(spread) <= set(SPREAD_METRICS)
    with pytest.raises(ValueError, match="at least two"):
        real_vs_real([tmp_path / "real"], "ci")

    # the real run's own steps table calibrates too (fitted together with the profile grid)
    both = tmp_path / "both.json"
    assert calibrate.main([str(table), str(tmp_path / "steps.parquet"), "--out", str(both)]) == 0
    fit = json.loads(both.read_text())["metadata"]
    assert set(fit["heldout_by_source"]) == {"table.csv", "steps.parquet"}
    assert [s["serving_loop"] for s in fit["sources"]] == [False, True]


def test_per_request_and_distribution_errors_by_hand():
    """Per-request errors and percentile errors differ: two requests swapping latencies leave the distribution
    exact while each request is off."""
    from experiments.validate import _rel_stats
    s = _rel_stats(np.array([1.1, 2.0, 3.3]), np.array([1.0, 2.0, 3.0]))
    assert s["median_rel_err"] == pytest.approx(0.1) and s["p90_rel_err"] == pytest.approx(0.1)
    assert s["mean_signed_rel_err"] == pytest.approx(0.2 / 3) and s["num_requests"] == 3
    assert s["quantile_rel_err"]["p50"] == 0.0
    assert s["quantile_rel_err"]["p99"] == pytest.approx((2 + 0.98 * 1.3 - (2 + 0.98)) / (2 + 0.98))
    swapped = _rel_stats(np.array([2.0, 1.0]), np.array([1.0, 2.0]))
    assert swapped["median_rel_err"] == pytest.approx(0.75)
    assert all(v == 0.0 for v in swapped["quantile_rel_err"].values())
    assert all(v == 0.0 for v in swapped["quantile_rank_pts"].values())
    with pytest.raises(FileNotFoundError, match="validate writes"):
        from experiments.validation_table import validation_table
        validation_table(["no/such/validation_x.json"])


def test_a_quantile_on_a_steep_stretch_is_far_in_value_and_near_in_rank():
    """quantile_rank_pts: how far the simulated percentile sits from the real one in the real distribution. Real
    TTFTs: 89 of 100 at 10 ms, then 100, 101, ..., 110 ms (p90 100.1 ms: 90% of them below). A simulation with 91
    at 10 ms has p90 10 ms, 90% off in value, but 10 ms spans the real ranks 0-89%: 1 point below. One with 88 at
    10 ms and 101, 102, ... has p90 102.1 ms: 92 real ones below, 2 points above. Equal runs: 0."""
    from experiments.validate import _rel_stats
    real = np.array([0.01] * 89 + [0.100 + 0.001 * i for i in range(11)])
    early = _rel_stats(np.array([0.01] * 91 + [0.101 + 0.001 * i for i in range(9)]), real)
    assert early["quantile_rel_err"]["p90"] == pytest.approx(0.01 / 0.1001 - 1)
    assert early["quantile_rank_pts"]["p90"] == pytest.approx(-1.0)
    late = _rel_stats(np.array([0.01] * 88 + [0.101 + 0.001 * i for i in range(12)]), real)
    assert late["quantile_rel_err"]["p90"] == pytest.approx(0.1021 / 0.1001 - 1)
    assert late["quantile_rank_pts"]["p90"] == pytest.approx(2.0)
    assert _rel_stats(real.copy(), real)["quantile_rank_pts"] == {"p50": 0.0, "p90": 0.0, "p99": 0.0}


def test_roofline_floors_only_where_the_card_has_measured_floors(tiny):
    """validate adds `roofline_floors` next to `roofline` for hardware with measured latency floors (the H200),
    not for the nominal CPU of smoke runs; the floored model is never faster than the pure one."""
    from experiments.validate import roofline_model
    h200 = roofline_model(tiny, None, "cuda:0", 256)
    floored = roofline_model(tiny, None, "cuda:0", 256, latency_floors=True)
    assert h200.hardware.latency_floors_s and floored.latency_floors and not h200.latency_floors
    assert roofline_model(tiny, None, "cpu", 256).hardware.latency_floors_s is None
    for shape in (([], [], 1, 10), ([100], [100], 3, 300), ([], [], 64, 64 * 200)):
        assert floored.step_time_from_shape(*shape) > h200.step_time_from_shape(*shape)


def test_validate_sizes_the_tier_in_gib_or_blocks_never_both():
    from experiments.validate import engine_run_config, parse_args
    args = parse_args(["--model", "ckpt", "--out-dir", "out", "--cpu-cache-gib", "2.5"])
    cfg = engine_run_config(args, 0)
    assert (cfg.cpu_cache_gib, cfg.cpu_cache_num_blocks) == (2.5, 0)
    both = parse_args(["--model", "ckpt", "--out-dir", "out", "--cpu-cache-gib", "2.5", "--cpu-cache-num-blocks", "9"])
    with pytest.raises(ValueError, match="cpu_cache_num_blocks=9 and cpu_cache_gib=2.5 both size the CPU tier"):
        engine_run_config(both, 0)


def test_overlapped_rows_end_where_the_next_launch_found_the_device_drained():
    """A launch that first waits for the device (block copies) reports when it had drained: the step before ends
    there, and the copies' time (the rest of that launch) starts the next step's row; rows still tile the busy
    time."""
    wl = synthetic_workload(2, Constant(1000.0), Fixed(20), Fixed(4))      # both at ~0 s
    clock = FakeClock()
    state = {"drained": None, "n": 0}

    def launch(batch):
        state["n"] += 1
        state["drained"] = None
        if state["n"] == 3:                 # this launch waits for the device, then copies for 0.5 s
            clock.t += 0.1
            state["drained"] = clock.t
            clock.t += 0.5
        return [7] * len(batch.seqs)

    def collect(tokens):
        clock.t += 0.01
        return tokens

    rec = Recorder()
    sched = Scheduler(SchedulerConfig(num_kvcache_blocks=64, max_model_len=256))
    info = run_loop_overlapped(sched, launch, collect, make_sequences(wl, vocab_size=100), rec, clock=clock,
                               sleep=clock.sleep, drained=lambda: state["drained"])
    st = rec.steps_frame()
    start, dur = st["start_time_s"].to_numpy(), st["duration_s"].to_numpy()
    np.testing.assert_allclose(start[1:], start[:-1] + dur[:-1])          # back to back
    # step 0 [0, 0.01]; step 1 from there to the drain 0.11 (not to its collect at 0.62, after the copies);
    # step 2 from the drain to its collect at 0.63: the copies' 0.5 s are its own
    np.testing.assert_allclose(dur[:3], [0.01, 0.10, 0.52], atol=1e-9)
    assert info["busy_s"] == pytest.approx(dur.sum())


def test_from_real_refuses_a_policy_without_a_saved_run_before_any_work(tmp_path):
    # the saved Azure runs hold fcfs, vllm and vllm_swap: srpt used to give exit 0 and a report holding an error
    from pathlib import Path

    from experiments import validate
    real = Path(__file__).resolve().parents[2] / "benchmarks" / "results" / "real"
    out = tmp_path / "val"
    with pytest.raises(ValueError, match=r"--policies srpt: no saved real run .* it holds fcfs, vllm, vllm_swap"):
        validate.main(["--from-real", str(real), "--name", "azure_conv", "--policies", "srpt,vllm",
                       "--out-dir", str(out)])
    assert not out.exists()


def test_from_real_without_a_kept_command_asks_for_the_workload_flags(tmp_path):
    # the committed Azure runs were kept before validate recorded its command: nothing to default the flags to
    from pathlib import Path

    from experiments import validate
    real = Path(__file__).resolve().parents[2] / "benchmarks" / "results" / "real"
    with pytest.raises(ValueError, match=r"azure_conv_real.json keeps no command.*give the workload flags"):
        validate.main(["--from-real", str(real), "--name", "azure_conv", "--policies", "vllm",
                       "--out-dir", str(tmp_path / "val")])
