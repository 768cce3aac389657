"""SimPy loop: hand-computed timelines with the constant model, idle waiting, bound consistency."""
import numpy as np
import pytest

from engine.core.recorder import Recorder
from engine.core.scheduler import Scheduler, SchedulerConfig
from engine.core.sequence import SamplingParams, Sequence
from sim.cost_model import ConstantCostModel, RooflineCostModel
from sim.lower_bound import workload_lower_bound
from sim.simulator import Replica, Simulator


def req(rid, prompt_len, max_tokens, arrival=0.0, first_token=1):
    # distinct first token per request: no accidental prefix-cache sharing
    return Sequence(rid, [first_token + rid] + [5] * (prompt_len - 1),
                    SamplingParams(max_tokens=max_tokens, ignore_eos=True), arrival_time_s=arrival)


def replica(cost_model, blocks=256, recorder=None, **cfg):
    sched = Scheduler(SchedulerConfig(num_kvcache_blocks=blocks, block_size=16, max_model_len=4096,
                                      max_num_batched_tokens=4096, **cfg))
    return Replica(sched, cost_model, recorder)


class CountingScheduler(Scheduler):
    calls = 0

    def schedule(self, now_s):
        self.calls += 1
        return super().schedule(now_s)


def test_single_request_timeline():
    cm = ConstantCostModel(step_s=1.0)
    sched = CountingScheduler(SchedulerConfig(num_kvcache_blocks=64, max_model_len=4096,
                                              max_num_batched_tokens=4096))
    rec = Recorder()
    sim = Simulator(Replica(sched, cm, rec), fast_path=False)
    seq = req(0, 10, 5, arrival=100.0)
    end = sim.run([seq]).end_time_s
    # Idle until t=100 (no polling), prefill [100,101] -> token 1; 4 decodes -> finish at 105.
    assert end == 105.0
    assert (seq.first_token_time_s, seq.finish_time_s, seq.num_output_tokens) == (101.0, 105.0, 5)
    assert sched.calls == 5                        # one schedule() per step, none while idle
    steps = rec.steps_frame()
    assert steps["start_time_s"].tolist() == [100.0, 101.0, 102.0, 103.0, 104.0]
    assert steps["num_prefill_tokens"].tolist() == [10, 0, 0, 0, 0]
    assert rec.requests_frame()["ttft_s"].tolist() == [1.0]


def test_two_requests_hand_timeline():
    # Constant 1 s steps, chunked prefill off (prefill-only or decode-only steps).
    # A (5 tokens) arrives at 0, B (2 tokens) at 2.5:
    #   [0,1] prefill A (A tok1)  [1,2] decode A (tok2)  [2,3] decode A (tok3; B arrived mid-step)
    #   [3,4] prefill B (B tok1)  [4,5] decode A,B (A tok4, B tok2: B done)  [5,6] decode A (tok5: A done)
    a, b = req(0, 10, 5, 0.0), req(1, 10, 2, 2.5)
    sim = Simulator(replica(ConstantCostModel(step_s=1.0)))
    assert sim.run([b, a]).end_time_s == 6.0
    assert (a.first_token_time_s, a.finish_time_s) == (1.0, 6.0)
    assert (b.first_token_time_s, b.finish_time_s) == (4.0, 5.0)
    assert [s.request_id for s in sim.finished] == [1, 0]


def test_step_durations_come_from_the_cost_model():
    # prefill 0.5 + 10 tokens/1024 s, decode 0.5 + 1/64 s per sequence
    cm = ConstantCostModel(step_s=0.5, per_prefill_token_s=2**-10, per_decode_seq_s=2**-6)
    a = req(0, 10, 3)
    Simulator(replica(cm)).run([a])
    assert a.first_token_time_s == 0.5 + 10 / 1024
    assert a.finish_time_s == 0.5 + 10 / 1024 + 2 * (0.5 + 1 / 64)


def test_replicas_round_robin_and_rejection():
    reps = [replica(ConstantCostModel(step_s=1.0)) for _ in range(2)]
    sim = Simulator(reps)
    seqs = [req(i, 10, 3) for i in range(2)] + [req(9, 5000, 3)]    # the last exceeds max_model_len
    assert sim.run(seqs).end_time_s == 3.0                  # each replica serves one request alone
    assert all(s.finish_time_s == 3.0 for s in seqs[:2])
    assert [s.request_id for s in sim.rejected] == [9] and "max_model_len" in seqs[2].reject_reason
    assert [r.num_steps for r in reps] == [3, 3]


def test_requests_must_ignore_eos_of_dummy_token():
    s = Sequence(0, [1, 2, 3], SamplingParams(max_tokens=2), eos_token_id=0)
    with pytest.raises(ValueError, match="ignore_eos"):
        Simulator(replica(ConstantCostModel())).run([s])


def test_roofline_sim_respects_the_lower_bound():
    rng = np.random.default_rng(1)
    lens = list(zip(rng.integers(20, 200, 48).tolist(), rng.integers(20, 200, 48).tolist()))
    seqs = [req(i, p, o) for i, (p, o) in enumerate(lens)]
    cm = RooflineCostModel("Qwen3-0.6B", "H200")
    rep = replica(cm, blocks=4096)
    end = Simulator(rep).run(seqs).end_time_s
    bound = workload_lower_bound(lens, "Qwen3-0.6B", "H200")
    assert all(s.num_output_tokens == o for s, (_, o) in zip(seqs, lens))
    # The simulated schedule is one feasible schedule priced by the same model: never below the bound,
    # and with all requests fitting at once it stays close to it.
    assert bound.time_s <= end < 1.5 * bound.time_s
    assert rep.busy_s == pytest.approx(end)


@pytest.mark.parametrize("swap", [False, True], ids=["recompute", "swap"])
def test_memory_pressure_preempts_and_still_completes(swap):
    from policies.scheduling.vllm_swap import VLLMSwapPolicy
    # 12 requests of 64 + 64 tokens (8 blocks each at the end) in a 40-block cache: preemption is forced.
    seqs = [req(i, 64, 64) for i in range(12)]
    cfg = SchedulerConfig(num_kvcache_blocks=40, block_size=16, max_model_len=4096, max_num_batched_tokens=4096,
                          num_cpu_blocks=200 if swap else 0)
    sched = Scheduler(cfg, policy=VLLMSwapPolicy() if swap else None)
    rec = Recorder()
    cm = RooflineCostModel("Qwen3-0.6B", "H200", overhead_s=1e-3)
    sim = Simulator(Replica(sched, cm, rec))
    sim.run(seqs)
    assert sorted(s.request_id for s in sim.finished) == list(range(12))
    assert all(s.num_output_tokens == 64 for s in seqs)
    steps = rec.steps_frame()
    assert sum(s.num_preemptions for s in seqs) > 0
    if swap:
        assert steps["num_swap_blocks"].sum() > 0
    # recorded durations are the cost model's, and the steps tile the busy time without overlap
    start, dur = steps["start_time_s"].to_numpy(), steps["duration_s"].to_numpy()
    assert np.all(start[1:] >= start[:-1] + dur[:-1] - 1e-12)
    assert sim.replicas[0].busy_s == pytest.approx(dur.sum())


# -- event logs worked out by hand (constant 1 s steps, chunked prefill off) -----------------------
def event_log(res):
    """(time, event, detail) from the two tables, sorted: a SimPy-style trace of the run."""
    log = []
    for s in res.steps.itertuples():
        log.append((s.start_time_s, "step", (int(s.num_prefill_tokens), int(s.num_decode_seqs))))
    for q in res.requests.itertuples():
        if q.status == "rejected":
            log.append((q.arrival_time_s, "reject", q.request_id))
            continue
        log.append((q.first_token_time_s, "first_token", q.request_id))
        log.append((q.finish_time_s, "finish", q.request_id))
    return sorted(log, key=lambda e: (e[0], e[1], str(e[2])))


@pytest.mark.parametrize("fast", [False, True], ids=["step_by_step", "fast_path"])
def test_arrival_on_a_step_boundary_is_seen_by_that_step(fast):
    # A (10 tokens, 5 out) at 0; B (10 tokens, 2 out) at exactly 2.0, when A's second step ends.
    #   [0,1] prefill A -> A tok1   [1,2] decode A -> tok2   [2,3] prefill B (B seen at 2.0) -> B tok1
    #   [3,4] decode A,B -> A tok3, B tok2: B done   [4,5] decode A -> tok4   [5,6] decode A -> tok5: A done
    a, b = req(0, 10, 5, 0.0), req(1, 10, 2, 2.0)
    res = Simulator(replica(ConstantCostModel(step_s=1.0)), fast_path=fast).run([a, b])
    assert event_log(res) == [
        (0.0, "step", (10, 0)),
        (1.0, "first_token", 0), (1.0, "step", (0, 1)),
        (2.0, "step", (10, 0)),
        (3.0, "first_token", 1), (3.0, "step", (0, 2)),
        (4.0, "finish", 1), (4.0, "step", (0, 1)),
        (5.0, "step", (0, 1)),
        (6.0, "finish", 0),
    ]
    assert res.end_time_s == 6.0


@pytest.mark.parametrize("fast", [False, True], ids=["step_by_step", "fast_path"])
def test_long_decode_run_and_late_arrival_timeline(fast):
    # Step cost 0.5 s + 0.25 s per decode sequence. A (16 tokens, 8 out) at 0; B (4 tokens, 3 out) at 3.2.
    #   [0,0.5] prefill A (tok1). Decodes of A alone take 0.75 s: tok2..tok5 end at 1.25, 2.0, 2.75, 3.5.
    #   B arrives at 3.2 during [2.75,3.5]; [3.5,4.0] prefill B (B tok1)
    #   [4.0,5.0] decode A,B (A tok6, B tok2)  [5.0,6.0] decode A,B (A tok7, B tok3: B done)
    #   [6.0,6.75] decode A (tok8: A done)
    cm = ConstantCostModel(step_s=0.5, per_decode_seq_s=0.25)
    a, b = req(0, 16, 8, 0.0), req(1, 4, 3, 3.2)
    res = Simulator(replica(cm), fast_path=fast).run([a, b])
    assert event_log(res) == [
        (0.0, "step", (16, 0)),
        (0.5, "first_token", 0), (0.5, "step", (0, 1)), (1.25, "step", (0, 1)), (2.0, "step", (0, 1)),
        (2.75, "step", (0, 1)),
        (3.5, "step", (4, 0)),
        (4.0, "first_token", 1), (4.0, "step", (0, 2)),
        (5.0, "step", (0, 2)),
        (6.0, "finish", 1), (6.0, "step", (0, 1)),
        (6.75, "finish", 0),
    ]
    # fast: A's four decodes starting before B's arrival (the last one straddles 3.2) in one call,
    # then [4,5] and [5,6] (B finishes in the horizon's last step), then [6,6.75] (A finishes)
    assert res.num_fast_steps == (7 if fast else 0)


def test_fast_path_skips_schedule_calls():
    sched = CountingScheduler(SchedulerConfig(num_kvcache_blocks=64, max_model_len=4096,
                                              max_num_batched_tokens=4096))
    seq = req(0, 10, 5, arrival=100.0)
    res = Simulator(Replica(sched, ConstantCostModel(step_s=1.0))).run([seq])
    # prefill by schedule(); the four decodes ending at 102..105, the last one finishing it, in one fast call
    assert (seq.first_token_time_s, seq.finish_time_s) == (101.0, 105.0)
    assert sched.calls == 1 and res.num_fast_steps == 4 and res.num_steps == 5


# -- request specs, determinism, rejection ------------------------------------------------------------
def spec_workload(n=40, seed=0, rate=20.0):
    from experiments.workloads import Poisson, Uniform, synthetic_workload
    return synthetic_workload(n, Poisson(rate), Uniform(8, 120), Uniform(1, 60), seed=seed)


def spec_replica(policy="vllm", blocks=200, max_model_len=256):
    from policies.registry import make_scheduling_policy
    cfg = SchedulerConfig(num_kvcache_blocks=blocks, block_size=16, max_model_len=max_model_len,
                          max_num_batched_tokens=max_model_len)
    return Replica(Scheduler(cfg, make_scheduling_policy(policy)),
                   RooflineCostModel("Qwen3-0.6B", "H200", overhead_s=1e-3, max_model_len=max_model_len))


def test_specs_are_materialized_lazily_and_not_kept():
    wl = spec_workload()
    sim = Simulator(spec_replica())
    res = sim.run(wl)
    assert res.num_finished == len(wl) and sim.finished == []          # finished Sequences are not kept
    req_ = res.requests.set_index("request_id").sort_index()
    assert np.array_equal(req_["arrival_time_s"].to_numpy(), wl.arrival_time_s)
    assert np.array_equal(req_["num_output_tokens"].to_numpy(), wl.num_output_tokens)


def test_same_seed_same_tables_and_policy_does_not_move_arrivals():
    a = Simulator(spec_replica("vllm")).run(spec_workload(seed=7))
    b = Simulator(spec_replica("vllm")).run(spec_workload(seed=7))
    import pandas as pd
    pd.testing.assert_frame_equal(a.requests, b.requests)
    pd.testing.assert_frame_equal(a.steps, b.steps)
    c = Simulator(spec_replica("fcfs")).run(spec_workload(seed=7))
    arr = lambda r: r.requests.set_index("request_id").sort_index()[["arrival_time_s", "num_prompt_tokens"]]
    pd.testing.assert_frame_equal(arr(a), arr(c))


def test_request_longer_than_context_is_rejected_and_recorded():
    from experiments.workloads import RequestSpec
    specs = [RequestSpec(0, 0.0, 100, 20), RequestSpec(1, 0.1, 250, 10), RequestSpec(2, 0.2, 30, 5)]  # 1: 260 > 256
    res = Simulator(spec_replica()).run(specs)
    r = res.requests.set_index("request_id")
    assert (res.num_finished, res.num_rejected) == (2, 1)
    assert r.loc[1, "status"] == "rejected" and "max_model_len" in r.loc[1, "reject_reason"]
    assert np.isnan(r.loc[1, "finish_time_s"])
    assert (r.loc[[0, 2], "status"] == "finished").all()


def test_dummy_tokens_differ_between_requests():
    from sim.arrivals import dummy_token_id
    seqs = [req(i, 20, 6) for i in range(3)]
    Simulator(replica(ConstantCostModel(step_s=1.0))).run(seqs)
    for s in seqs:
        assert s.output_token_ids == [dummy_token_id(s.request_id)] * 6
    assert len({dummy_token_id(i) for i in range(1000)} | {dummy_token_id("a"), dummy_token_id("b")}) == 1002


def test_result_exposes_the_roofline_bound():
    res = Simulator(spec_replica()).run(spec_workload())
    b = res.lower_bound
    assert b is not None and b.num_requests == res.num_finished
    assert 0 < res.fraction_of_physical_limit <= 1.0
    assert "roofline limit" in res.summary()
    assert Simulator(replica(ConstantCostModel())).run([req(0, 5, 2)]).lower_bound is None


def test_cost_model_context_shorter_than_scheduler_is_refused():
    sched = Scheduler(SchedulerConfig(num_kvcache_blocks=64, max_model_len=4096, max_num_batched_tokens=4096))
    with pytest.raises(ValueError, match="max_model_len"):
        Replica(sched, RooflineCostModel("Qwen3-0.6B", "H200", max_model_len=2048))
