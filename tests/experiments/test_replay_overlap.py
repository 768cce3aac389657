"""The engine replay with overlap scheduling (experiments.runner_engine.run_loop_overlapped): on a fake
clock, rows that tile the busy time and arrivals respected; on the tiny CPU model, the steps the
simulator with overlap takes for the same requests."""
import pytest

from engine.core.recorder import Recorder
from engine.core.scheduler import Scheduler, SchedulerConfig
from experiments.runner_engine import make_sequences, run_loop_overlapped
from experiments.workloads import Constant, Fixed, RequestSpec, synthetic_workload
from tests.experiments.test_validation import FakeClock


def test_overlapped_loop_on_a_fake_clock():
    """Each launch costs 0.02 s of host time and each step 0.1 s of device time after the one before:
    the rows tile the device's time, 0.1 s each."""
    wl = synthetic_workload(4, Constant(2.0), Fixed(20), Fixed(3))          # arrivals 0, 0.5, 1.0, 1.5 s
    seqs = make_sequences(wl, vocab_size=100)
    clock = FakeClock()
    sched = Scheduler(SchedulerConfig(num_kvcache_blocks=64, max_model_len=256))
    device_free = [clock.t]             # when the device finishes the steps launched so far

    def launch(batch):
        assert all(s.arrival_time_s <= clock.t - 100.0 for s in batch.seqs)   # nothing runs before it arrives
        clock.t += 0.02
        device_free[0] = max(device_free[0], clock.t) + 0.1
        return device_free[0], len(batch.seqs)

    def collect(handle):
        done_at, n = handle
        clock.t = max(clock.t, done_at)
        return [7] * n

    rec = Recorder()
    info = run_loop_overlapped(sched, launch, collect, seqs, rec, clock=clock, sleep=clock.sleep)
    req = rec.requests_frame().sort_values("request_id")
    assert (req["status"] == "finished").all() and (req["num_output_tokens"] == 3).all()
    steps = rec.steps_frame()
    assert info["num_steps"] == len(steps) == 12     # alone each time: a prefill, two decodes
    # a request alone: the prefill's row from its schedule, the decodes' rows from the step before's end
    assert steps["duration_s"].tolist() == pytest.approx([0.12, 0.1, 0.1] * 4)
    start, dur = steps["start_time_s"].to_numpy(), steps["duration_s"].to_numpy()
    for i in range(0, 12, 3):
        assert start[i + 1] == pytest.approx(start[i] + dur[i]) and start[i + 2] == pytest.approx(start[i + 1]
                                                                                                    + dur[i + 1])
    assert info["busy_s"] == pytest.approx(dur.sum()) and info["host_gap_s"] == 0.0
    assert sched.num_in_flight == 0 and sched.block_manager.num_used_blocks == 0


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    pytest.importorskip("torch")
    from tests.engine.tiny_model import make_tiny_qwen3
    path = tmp_path_factory.mktemp("tiny_replay_overlap")
    make_tiny_qwen3(path)
    return path


def test_cpu_replay_takes_the_simulators_steps(tiny):
    from experiments.runner_engine import EngineReplayer, EngineRunConfig
    from sim.cost_model import ConstantCostModel
    from sim.simulator import Replica, Simulator

    rep = EngineReplayer(EngineRunConfig(model_path=str(tiny), device="cpu", num_kvcache_blocks=9, max_model_len=64,
                                         enable_prefix_caching=False, overlap_scheduling=True))
    specs = [RequestSpec(i, 0.0, p, o) for i, (p, o) in enumerate([(20, 20), (30, 6), (25, 14), (12, 20), (28, 9)])]
    run = rep.replay(specs, "vllm")
    assert (run.requests["status"] == "finished").all()
    assert run.info["triton_compiles"] == 0         # recorded (the CPU runs no Triton kernel)
    sim = Simulator(Replica(Scheduler(rep.scheduler_config()), ConstantCostModel(step_s=0.01), overlap_scheduling=True),
                    fast_path=False)
    res = sim.run(rep.sequences(specs))
    cols = ["num_prefill_tokens", "num_decode_seqs", "num_preempted"]
    assert run.steps[cols].values.tolist() == res.steps[cols].values.tolist()
    assert run.steps["num_preempted"].sum() > 0
    start, dur = run.steps["start_time_s"].to_numpy(), run.steps["duration_s"].to_numpy()
    assert (dur > 0).all() and start[1:] == pytest.approx(start[:-1] + dur[:-1])


def test_warmup_runs_the_loop_the_replays_run(tiny):
    """warmup() goes through the timed replays' own loop: launch/collect with overlap scheduling, execute without
    (an overlapped run's first replay otherwise paid the overlap path's first use)."""
    from experiments.runner_engine import EngineReplayer, EngineRunConfig
    for overlap in (True, False):
        rep = EngineReplayer(EngineRunConfig(model_path=str(tiny), device="cpu", num_kvcache_blocks=64,
                                             max_model_len=64, overlap_scheduling=overlap))
        calls = {"launch": 0, "execute": 0}
        for name in calls:
            orig = getattr(rep.runner, name)

            def spy(*a, _orig=orig, _name=name, **k):
                calls[_name] += 1
                return _orig(*a, **k)
            setattr(rep.runner, name, spy)
        assert rep.warmup(num_requests=3, prompt_len=32, output_len=4) > 0
        # execute() launches and collects itself: only the synchronous loop calls it
        assert calls["launch"] > 0 and (calls["execute"] > 0) == (not overlap), calls


def test_servelab_setting_reaches_the_simulated_replicas():
    from experiments.runner_sim import run_sim
    from tests.experiments.test_config_path import compose_cfg

    runs = {}
    for on in (False, True):
        cfg = compose_cfg(f"overlap_scheduling={str(on).lower()}", "workload.num_requests=30", "progress=false")
        runs[on] = run_sim(cfg)
    # both take the decode fast path (with overlap: sim/fast_path.py's _overlap_fast)
    assert runs[False].meta["num_fast_steps"] > 0 and runs[True].meta["num_fast_steps"] > 0
    assert runs[True].requests["num_output_tokens"].tolist() == runs[False].requests["num_output_tokens"].tolist()


def test_a_run_that_compiled_says_so_and_a_steady_one_stays_quiet(capsys):
    from experiments.runner_engine import note_compiles
    assert note_compiles(dict(triton_compiles=0, torch_compiles=None)) is None
    assert note_compiles({}) is None
    text = note_compiles(dict(triton_compiles=3, triton_compile_s=0.412, torch_compiles=0,
                              triton_compiled_kernels=["_resolve_kernel", "_resolve_kernel", "_prefill_kernel"]))
    assert text.startswith("NOTE the engine compiled during the run: 3 Triton kernel(s) (0.41 s: _prefill_kernel, "
                           "_resolve_kernel) and 0 torch.compile frame(s)")
    assert capsys.readouterr().err.strip() == text
    assert "1 torch.compile frame(s)" in note_compiles(dict(triton_compiles=None, torch_compiles=1))
