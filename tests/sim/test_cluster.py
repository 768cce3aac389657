"""Multi-replica runs: each router's decisions worked out by hand, the view contract, bad input."""
import pytest

from engine.core.scheduler import Scheduler, SchedulerConfig
from engine.core.sequence import SamplingParams, Sequence
from sim.cost_model import ConstantCostModel
from sim.replica import Replica
from sim.router import (
    LeastOutstandingTokensRouter,
    PrefixAffinityRouter,
    ReplicaView,
    RoundRobinRouter,
    Router,
    get_router,
)
from sim.simulator import Simulator


def seq(rid, prompt, max_tokens, arrival):
    if isinstance(prompt, int):
        prompt = [10_000 * (rid + 1) + i for i in range(prompt)]     # private tokens: no shared prefix
    return Sequence(rid, prompt, SamplingParams(max_tokens=max_tokens, ignore_eos=True), arrival_time_s=arrival)


def cluster(n, block_size=16):
    return [Replica(Scheduler(SchedulerConfig(num_kvcache_blocks=256, block_size=block_size, max_model_len=1024,
                                              max_num_batched_tokens=1024)), ConstantCostModel(step_s=1.0))
            for _ in range(n)]


class Spy(Router):
    """Wraps a router; logs (time, request, outstanding tokens per replica, choice)."""

    def __init__(self, inner, env_of):
        self.inner, self.env_of, self.log = inner, env_of, []
        self.name, self.reads_replica_state = inner.name, True

    def reset(self, replicas):
        self.inner.reset(replicas)

    def route(self, s, replicas):
        i = self.inner.route(s, replicas)
        self.log.append((self.env_of().now, s.request_id, [v.outstanding_tokens for v in replicas], i))
        return i


def replica_of(res):
    return dict(zip(res.requests["request_id"], res.requests["replica"]))


def test_round_robin_in_arrival_order():
    seqs = [seq(i, 8, 3, 0.5 * i) for i in range(7)]
    res = Simulator(cluster(3), "round_robin").run(seqs)
    assert replica_of(res) == {i: i % 3 for i in range(7)}
    assert not RoundRobinRouter.reads_replica_state


@pytest.mark.parametrize("fast", [False, True], ids=["step_by_step", "fast_path"])
def test_least_outstanding_tokens_by_hand(fast):
    # Outstanding = prompt tokens until the first token + outputs not yet emitted. 1 s steps.
    # t=0:   A(10+100) -> r0 (all 0, lowest index); B(10+5) -> r1 (r0 110); C(10+5) -> r2
    # t=0.5: mid-step, nothing retired yet: [110, 15, 15] -> D(10+5) -> r1 (tie with r2, lowest index)
    # t=3.5: r0: A prefill at 1 retires 10+1, decodes at 2, 3 -> 97
    #        r1: step [0,1] B prefill -> 15+15-11 = 19; [1,2] D prefill -> 8; [2,3] decode B, D -> 6
    #        r2: C prefill -> 4, decodes at 2, 3 -> 2          => E -> r2
    seqs = [seq(0, 10, 100, 0.0), seq(1, 10, 5, 0.0), seq(2, 10, 5, 0.0), seq(3, 10, 5, 0.5), seq(4, 10, 5, 3.5)]
    spy = Spy(LeastOutstandingTokensRouter(), lambda: sim.env)
    sim = Simulator(cluster(3), spy, fast_path=fast)
    res = sim.run(seqs)
    assert [(t, rid, load, i) for t, rid, load, i in spy.log] == [
        (0.0, 0, [0, 0, 0], 0), (0.0, 1, [110, 0, 0], 1), (0.0, 2, [110, 15, 0], 2),
        (0.5, 3, [110, 15, 15], 1), (3.5, 4, [97, 6, 2], 2)]
    assert res.num_finished == 5
    assert all(r.outstanding_tokens == 0 for r in sim.replicas)     # every token retired at the end


def test_least_outstanding_tokens_through_the_public_api():
    seqs = [seq(0, 10, 100, 0.0), seq(1, 10, 5, 0.0), seq(2, 10, 5, 0.0), seq(3, 10, 5, 0.5), seq(4, 10, 5, 3.5)]
    res = Simulator(cluster(3), get_router("least_outstanding_tokens")).run(seqs)
    assert replica_of(res) == {0: 0, 1: 1, 2: 2, 3: 1, 4: 2}


@pytest.mark.parametrize("fast", [False, True], ids=["step_by_step", "fast_path"])
def test_prefix_affinity_follows_the_cache(fast):
    # Load ignored and the balance guard off: pure affinity, the most cached blocks wins.
    shared = list(range(1, 65))                           # 4 full blocks of 16
    a = seq(0, shared + [900, 901], 40, 0.0)              # -> r0 (no hits anywhere; both idle)
    b = seq(1, 20, 3, 0.0)                                # -> r1 (r0 has more outstanding)
    c = seq(2, shared + [700, 701, 702], 3, 5.0)          # r0 holds the 4 blocks -> r0 despite its load
    d = seq(3, 20, 3, 5.0)                                # no hits: least outstanding -> r1
    e = seq(4, shared[:40], 3, 5.0)                       # 2 blocks cached on r0 only -> r0
    pure = PrefixAffinityRouter(load_weight=0, cache_threshold_fraction=0, balance_abs_threshold_tokens=10**9)
    res = Simulator(cluster(2), pure, fast_path=fast).run([a, b, c, d, e])
    assert replica_of(res) == {0: 0, 1: 1, 2: 0, 3: 1, 4: 0}
    assert (c.num_cached_tokens, e.num_cached_tokens, d.num_cached_tokens) == (64, 32, 0)


def weighing_workload():
    shared = list(range(1, 65))                           # 4 full blocks of 16
    return [seq(0, shared + [900, 901], 40, 0.0),         # A -> r0 (no hits; both idle)
            seq(1, 20, 3, 0.0),                           # B -> r1 (r0 has more outstanding)
            seq(2, shared + [700, 701, 702], 3, 5.0),     # C: r0 caches 64 of its 67 prompt tokens
            seq(3, 20, 3, 5.0),                           # D: no hits
            seq(4, shared[:40], 3, 5.0)]                  # E: r0 caches 32 of its 40 prompt tokens


@pytest.mark.parametrize("fast", [False, True], ids=["step_by_step", "fast_path"])
def test_prefix_affinity_weighs_cached_tokens_against_load(fast):
    # 1 s steps. At t=5, mid-step: r0 holds A with 36 outputs to go (prefill at 1, tokens at 2, 3, 4);
    # r1 is empty (B done at 3).
    # C: loads [36, 0]; cost r0 = 3 uncached + 36 = 39 < r1 = 67 + 0       -> r0
    # D: no hits: least loaded, [106, 0]                                    -> r1
    # E: 32/40 cached on r0 (>= 0.3): cost r0 = 8 + 106 = 114 > r1 = 40 + 23 -> r1 (pure affinity sent it to r0)
    spy = Spy(PrefixAffinityRouter(), lambda: sim.env)
    sim = Simulator(cluster(2), spy, fast_path=fast)
    res = sim.run(weighing_workload())
    assert [(t, rid, load, i) for t, rid, load, i in spy.log] == [
        (0.0, 0, [0, 0], 0), (0.0, 1, [106, 0], 1), (5.0, 2, [36, 0], 0), (5.0, 3, [106, 0], 1),
        (5.0, 4, [106, 23], 1)]
    assert res.num_finished == 5


@pytest.mark.parametrize("knobs, c_goes_to", [
    ({}, 0),
    ({"balance_abs_threshold_tokens": 35}, 1),            # 36 - 0 > 35 and 36 > 1.5 * 0: imbalanced -> least loaded
    ({"cache_threshold_fraction": 0.96}, 1),              # 64/67 = 0.955 cached: not a useful hit -> least loaded
    ({"min_hit_blocks": 5}, 1),
    ({"load_weight": 2.0}, 1),                            # r0 = 3 + 2 * 36 = 75 > r1 = 67
])
def test_prefix_affinity_knobs(knobs, c_goes_to):
    res = Simulator(cluster(2), PrefixAffinityRouter(**knobs)).run(weighing_workload())
    assert replica_of(res)[2] == c_goes_to


def test_imbalance_needs_both_thresholds():
    r = PrefixAffinityRouter(balance_abs_threshold_tokens=10, balance_rel_threshold=2.0)
    assert r.imbalanced([30, 14]) and r.imbalanced([5, 20])
    assert not r.imbalanced([30, 16])       # spread 14 > 10, but 30 <= 2 * 16
    assert not r.imbalanced([12, 5])        # 12 > 2 * 5, but spread 7 <= 10


@pytest.mark.parametrize("field, value", [
    ("min_hit_blocks", 0), ("min_hit_blocks", 1.5), ("cache_threshold_fraction", 1.2),
    ("cache_threshold_fraction", float("nan")), ("load_weight", -1), ("balance_abs_threshold_tokens", -5),
    ("balance_abs_threshold_tokens", 2.5), ("balance_rel_threshold", 0.5), ("balance_rel_threshold", "x")])
def test_prefix_affinity_refuses_bad_knobs_in_one_line(field, value):
    with pytest.raises(ValueError, match=rf"^router\.{field} must be [^\n]*router\.{field}=") as e:
        PrefixAffinityRouter(**{field: value})
    assert "\n" not in str(e.value)


@pytest.mark.parametrize("name", ["least_outstanding_tokens", "prefix_affinity"])
def test_idle_cluster_is_filled_evenly(name):
    # Every request finishes before the next arrives, so all replicas show 0 outstanding tokens at each
    # arrival: ties go to the replica sent the fewest tokens so far, not always to replica 0.
    seqs = [seq(i, 8, 2, 10.0 * i) for i in range(6)]
    res = Simulator(cluster(3), name).run(seqs)
    assert replica_of(res) == {i: i % 3 for i in range(6)}


def test_prefix_affinity_needs_one_block_size():
    reps = cluster(1) + cluster(1, block_size=32)
    with pytest.raises(ValueError, match="block_size"):
        Simulator(reps, "prefix_affinity").run([seq(0, 8, 2, 0.0)])


def test_replica_view_is_read_only():
    r = cluster(1)[0]
    v = ReplicaView(r)
    assert (v.index, v.num_running, v.num_waiting, v.num_kvcache_blocks, v.block_size) == (0, 0, 0, 256, 16)
    with pytest.raises(AttributeError):
        v.outstanding_tokens = 5
    with pytest.raises(AttributeError):
        v.extra = 1


def test_bad_router_answers_and_names_are_refused():
    class Bad(Router):
        name = "bad"

        def route(self, s, replicas):
            return len(replicas)
    with pytest.raises(ValueError, match=r"must return an int in \[0, 2\)"):
        Simulator(cluster(2), Bad()).run([seq(0, 8, 2, 0.0)])
    with pytest.raises(ValueError, match="known routers"):
        get_router("random")
    with pytest.raises(TypeError, match="Router"):
        Simulator(cluster(2), lambda s, r: 0)
    with pytest.raises(ValueError, match="own Scheduler"):
        r = cluster(1)[0]
        Simulator([r, Replica(r.scheduler, r.cost_model)])
