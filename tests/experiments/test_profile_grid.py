"""The profile grid covers its envelope: long prefills and contexts up to max_model_len, prefix-cache hits,
chunked mixed steps, long-tail decode batches; every shape within the engine's limits (no torch needed)."""
import numpy as np
import pytest

from experiments import profile
from experiments.profile import grid_shapes


def _extent(shape):
    ctx = [n + c for n, c in shape.prefills] + list(shape.decode_ctx)
    return max(ctx, default=0), sum(n for n, _ in shape.prefills) + len(shape.decode_ctx)


@pytest.mark.parametrize("max_model_len", [8192, 16384, 40960])
def test_full_grid_reaches_max_model_len_within_the_limits(max_model_len):
    shapes = grid_shapes("full", max_model_len, 16384, 256)
    assert len({s.label for s in shapes}) == len(shapes)            # no shape timed twice
    longest = max(_extent(s)[0] for s in shapes)
    assert longest == max_model_len
    for s in shapes:
        ctx, tokens = _extent(s)
        assert ctx <= max_model_len and tokens <= 16384 and len(s.prefills) + len(s.decode_ctx) <= 256, s.label
    prefills = [s for s in shapes if s.kind == "prefill"]
    assert max(n for s in prefills for n, _ in s.prefills) == min(max_model_len, 16384)
    # prefix-cache hits: a short chunk on a long cached context, at the long end
    assert any(n <= 128 and n + c == max_model_len for s in prefills for n, c in s.prefills)
    # chunked mixed steps: a chunk with a cached context plus decodes
    assert any(s.kind == "mixed" and s.prefills[0][1] > 0 and len(s.decode_ctx) >= 16 for s in shapes)
    # long-tail decode batches: a few long contexts among many short ones
    tails = [s for s in shapes if s.kind == "decode" and len(s.decode_ctx) >= 32
             and max(s.decode_ctx) >= 8 * np.median(s.decode_ctx)]
    assert len(tails) >= 3 and any(max(s.decode_ctx) >= min(max_model_len, 16384) for s in tails)
    # a short chunk beside a few long decodes, and decode batches either side of the split-K threshold
    assert any(s.kind == "mixed" and len(s.decode_ctx) <= 4 and min(s.decode_ctx) >= 4096
               and s.prefills[0][1] <= 1024 for s in shapes)
    assert {12, 24, 40} <= {len(s.decode_ctx) for s in shapes if s.kind == "decode"}
    # a chunk beside a decode from 0.7 to 1.5 times the chunk's context, alone and with two short ones, in a step of
    # 512 tokens (a graph size: 513 would run the 576-token graph, one more GEMM tile)
    walk = {(s.prefills[0][0] + s.prefills[0][1], s.decode_ctx[0], len(s.decode_ctx)) for s in shapes
            if s.kind == "mixed" and s.prefills[0][0] + len(s.decode_ctx) == 512 and len(s.decode_ctx) in (1, 3)}
    for c in (2048, 4096, 6144):
        if c <= max_model_len:
            assert {(c, int(0.85 * c), 1), (c, c, 1), (c, int(0.95 * c), 3)} <= walk, c
    # fresh prompts at odd multiples of 64 tokens (half a GEMM tile past the even ones)
    assert {320, 576, 1088} <= {s.prefills[0][0] for s in prefills if len(s.prefills) == 1 and s.prefills[0][1] == 0}
    assert any(s.kind == "prefill" and s.prefills == ((8192, 0),) for s in shapes) == (max_model_len >= 8192)


def test_short_limits_and_the_small_grid():
    """At max_model_len 4,096 the long end adds the long-tail decodes and chunked mixed steps that fit (163
    shapes, 132 before, then 12 CPU-tier copy shapes, 7 intermediate chunks whose prompts fit, 20 chunks beside
    a decode around the chunk's context and 7 fresh prompts at odd multiples of 64 tokens: 209); the small grid
    (CPU tests) has no long end (46 shapes, plus 6 CPU-tier ones and 3 intermediate chunks)."""
    full = grid_shapes("full", 4096, 16384, 256)
    assert max(_extent(s)[0] for s in full) == 4096 and len(full) == 209
    assert sum(s.kind in ("tier_out", "tier_in") for s in full) == 12
    assert sum(s.kind == "chunk" for s in full) == 7
    small = grid_shapes("small", 512, 512, 32)
    assert max(_extent(s)[0] for s in small) <= 512 and len(small) == 55


def test_an_intermediate_chunk_samples_nothing():
    """A `chunk` shape is a prompt's intermediate chunk (its prompt runs on past the step): no entry samples, so the
    step reads no LM head (lm_head_step 0); the same tokens as a `prefill` shape sample once."""
    from engine.core.recorder import Recorder
    rng = np.random.default_rng(0)
    for kind, samples in (("chunk", 0), ("prefill", 1)):
        b = profile.build_batch(profile.Shape(kind, ((512, 3072),)), 16, 1000, 0.6, rng)
        assert b.context_lens == [3584] and b.num_new_tokens == [512] and b.samples(0) == bool(samples)
        rec = Recorder()
        rec.on_step(0.0, 1.0, b, 0, 0, 0)
        assert rec.steps_frame()["num_prefill_samples"].tolist() == [samples]
    full = grid_shapes("full", 16384, 16384, 256)
    assert {c + n for s in full if s.kind == "chunk" for n, c in s.prefills} >= {512, 1536, 3584, 6144, 8192, 12288}


def test_swaps_ride_beside_a_timed_decode_batch_on_blocks_of_their_own():
    """A swap in a serving step shares it with running decodes, and the host issues its copies while the device
    runs them; the grid times swaps so, beside a decode batch the grid also times alone, and the copied blocks
    are none of the batch's."""
    for grid, args in (("full", (16384, 16384, 256)), ("small", (512, 512, 16))):
        shapes = grid_shapes(grid, *args)
        swaps = [s for s in shapes if s.swap_blocks]
        assert {s.kind for s in swaps} == {"swap_out", "swap_in"} and len(swaps) >= 6
        for s in swaps:
            assert s.decode_ctx and not s.prefills and profile.Shape("decode", (), s.decode_ctx) in shapes, s.label
    rng = np.random.default_rng(0)
    shape = profile.Shape("swap_out", (), (64,) * 4, swap_blocks=3)
    assert shape.blocks_needed(16) == 4 * 4 + 3
    out = profile.build_batch(shape, 16, 1000, 0.0, rng)
    inn = profile.build_batch(profile.Shape("swap_in", (), (64,) * 4, swap_blocks=3), 16, 1000, 0.0, rng)
    own = {b for seq in out.seqs for b in seq.block_table}
    assert own == set(range(16)) and out.swap_out == [(16, 0), (17, 1), (18, 2)] and not out.swap_in
    assert inn.swap_in == [(0, 16), (1, 17), (2, 18)] and not inn.swap_out


def test_tier_grid_is_the_full_grids_tier_shapes_and_their_decode_batch():
    full = grid_shapes("full", 16384, 16384, 256)
    tier = grid_shapes("tier", 16384, 16384, 256)
    assert [s for s in full if s.tier_blocks] == tier[1:] and len(tier) == 13
    assert tier[0].kind == "decode" and tier[0] in full and tier[0].decode_ctx == tier[1].decode_ctx == (1024,) * 32
    short = grid_shapes("tier", 512, 512, 16)         # the tiny test model's limits: the decode batch clipped
    assert short[0].decode_ctx == (512,) * 16 and max(s.tier_blocks for s in short) == 1024


def test_dry_run_lists_the_grid_and_prices_it(capsys, tmp_path):
    from sim.cost_model.calibrated import CalibratedCostModel
    fit = tmp_path / "fit.json"
    CalibratedCostModel(coefficients={"step": 1e-3}).save(fit)
    assert profile.main(["--model", "unused", "--out", "unused.csv", "--dry-run", "--max-model-len", "16384",
                         "--estimate-with", str(fit), "--repeats", "3", "--warmup", "1"]) == 0
    out = capsys.readouterr().out.splitlines()
    n = len(grid_shapes("full", 16384, 16384, 256))
    assert len(out) == n + 1 and out[-1].startswith(f"{n} shapes (grid full, max_model_len 16384)")
    # a forward step is priced 1 ms (copies alone 0): warmup + 3 runs and their queued pairs, at duty 0.5
    forward = sum(1 for sh in grid_shapes("full", 16384, 16384, 256) if sh.prefills or sh.decode_ctx)
    assert f"about {1e-3 * (1 + 3 * 3) / 0.5 * forward:.0f} s" in out[-1]


def test_device_seconds_come_from_a_launch_queued_behind_another():
    """time_step: the device seconds of each repeat are those of a second launch queued behind a first (the
    device runs them back to back), not of the timed execute(); a step with block copies, and a runner that
    does not time its device, are left as they are."""
    import numpy as np

    from engine.core.batch import Batch
    from experiments.profile import time_step

    class Runner:
        time_device = True

        def __init__(self):
            self.calls, self.last_device_time_s = [], None

        def execute(self, batch):
            self.calls.append("execute")
            self.last_device_time_s = 9.0           # the events of a step timed alone: host launches included

        def launch(self, batch):
            self.calls.append("launch")
            return len(self.calls)

        def collect(self, handle):
            self.calls.append("collect")
            self.last_device_time_s = 0.001 * handle

    r = Runner()
    wall, dev, mhz, capped = time_step(r, Batch(), warmup=1, repeats=2, sync=lambda: None)
    assert len(wall) == 2 and list(dev) == pytest.approx([0.004, 0.009])    # the second launch of each repeat
    assert np.isnan(mhz).all() and not capped.any()                        # no clock given
    assert r.calls == ["execute"] + ["execute", "launch", "launch", "collect", "collect"] * 2
    r = Runner()
    _, dev, _, _ = time_step(r, Batch(swap_out=[(0, 1)]), warmup=0, repeats=1, sync=lambda: None)
    assert r.calls == ["execute"] and list(dev) == [9.0]
    r = Runner()
    r.time_device = False
    _, dev, _, _ = time_step(r, Batch(), warmup=0, repeats=1, sync=lambda: None)
    assert r.calls == ["execute"] and np.isnan(dev).all()


def test_duty_cycle_idles_in_proportion_and_the_clock_is_read_while_the_pair_runs():
    """time_step(duty_cycle=d): after every execute() and every queued pair the profiler sleeps (1/d - 1) times
    what it took, so the device is busy d of the time; the clock is read between the pair's launches and their
    collection (the device busy), once per repeat."""

    from engine.core.batch import Batch
    from experiments.profile import time_step

    now = [0.0]
    calls = []

    class Runner:
        time_device = True
        last_device_time_s = None

        def execute(self, batch):
            calls.append("execute")
            now[0] += 0.010                       # 10 ms a step

        def launch(self, batch):
            calls.append("launch")
            return None

        def collect(self, handle):
            calls.append("collect")
            now[0] += 0.005
            self.last_device_time_s = 0.005

    class Clock:
        def sm_mhz(self):
            calls.append("clock")
            return 1980.0 - 100 * calls.count("clock")

        def power_capped(self):
            return calls.count("clock") == 2

    sleeps = []
    import experiments.profile as prof
    real = prof.time.perf_counter
    prof.time.perf_counter = lambda: now[0]
    try:
        wall, dev, mhz, capped = time_step(Runner(), Batch(), warmup=1, repeats=2, sync=lambda: None,
                                           duty_cycle=0.25, clock=Clock(), sleep=sleeps.append)
    finally:
        prof.time.perf_counter = real
    assert sleeps == pytest.approx([0.030, 0.030, 0.030, 0.030, 0.030])   # 3x each busy 10 ms (warmup, runs, pairs)
    assert calls == ["execute"] + ["execute", "launch", "launch", "clock", "collect", "collect"] * 2
    assert list(mhz) == [1880.0, 1780.0] and list(capped) == [False, True]
    assert list(wall) == pytest.approx([0.010, 0.010]) and list(dev) == pytest.approx([0.005, 0.005])
    with pytest.raises(ValueError, match="duty_cycle"):
        time_step(Runner(), Batch(), warmup=0, repeats=1, sync=lambda: None, duty_cycle=0.0)


def test_layout_grid_times_each_shape_on_contiguous_and_on_scattered_blocks():
    """`--grid layout`: each shape twice, on blocks 0, 1, 2, ... and on distinct blocks drawn from the whole cache
    (the same step otherwise: shape columns equal)."""
    shapes = grid_shapes("layout", 16384, 16384, 256)
    assert len(shapes) == 20 and [s.scattered for s in shapes] == [False, True] * 10
    assert all(a.prefills == b.prefills and a.decode_ctx == b.decode_ctx for a, b in zip(shapes[::2], shapes[1::2]))
    assert len({s.label for s in shapes}) == len(shapes)
    rng = np.random.default_rng(0)
    plain = profile.build_batch(shapes[0], 16, 1000, 0.6, rng)
    spread = profile.build_batch(shapes[1], 16, 1000, 0.6, rng, num_blocks=10_000)
    assert plain.seqs[0].block_table == list(range(128))          # 2,048 tokens: 128 blocks
    table = spread.seqs[0].block_table
    assert len(set(table)) == 128 and max(table) < 10_000 and table != sorted(table)
    with pytest.raises(ValueError, match="num_blocks"):
        profile.build_batch(shapes[1], 16, 1000, 0.6, rng)
    # within small limits, only the shapes that fit
    small = grid_shapes("layout", 4096, 4096, 64)
    assert small and all(_extent(s)[0] <= 4096 and _extent(s)[1] <= 4096 for s in small)
