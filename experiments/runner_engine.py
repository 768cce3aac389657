"""Real-time replay of a workload on the real engine, recorded like a simulation.

    rep = EngineReplayer(EngineRunConfig(model_path="ckpt/", device="cuda"))
    run = rep.replay(workload, policy="vllm", num_kvcache_blocks=2048)
    run.requests, run.steps          # the recorder's two tables (engine.core.recorder), same ids as the simulator

The replay is the simulator's loop with wall time for the clock and the model
runner for the cost model:

    add every request whose arrival_time_s <= now      (a request is invisible before its arrival)
    if nothing is unfinished: sleep until the next arrival   (the engine never sleeps while work is pending;
                                                              the last millisecond is spun: IDLE_SPIN_S)
    batch = scheduler.schedule(start); tokens = runner.execute(batch); synchronize the device
    recorder.on_step(start, end - start, batch, ...); scheduler.postprocess(batch, tokens, end)

Time 0 is the moment the replay starts; arrival times are the workload's. Each
request produces exactly its workload output length (max_tokens + ignore_eos).
A step's duration runs from just before schedule() to the moment the device has
finished the step (sampled tokens on the host), so it includes the scheduler's
host time; postprocess() and arrival handling fall in the gap before the next
step (`host_gap_s` in the run's info sums those gaps).

With EngineRunConfig.overlap_scheduling the replay runs run_loop_overlapped instead: each step is
scheduled and launched while the one before runs (docs/overlap.md), and a step's row spans from
the previous step's end to its own tokens on the host.

The model and its KV cache are loaded once; every replay builds a fresh
Scheduler (policy, cache size) over the same runner, so several policies run
back to back without reloading. A replay may give the scheduler fewer KV blocks
(or swap blocks) than the runner allocated, to force preemption, and fewer CPU-tier
blocks of the prefix cache (EngineRunConfig.cpu_cache_num_blocks; 0: none).
"""
from __future__ import annotations

import sys
import time
from collections import deque
from dataclasses import asdict, dataclass, field, fields, replace
from pathlib import Path
from typing import Iterable

from engine.config import EngineConfig
from engine.core.recorder import Recorder
from engine.core.scheduler import Scheduler, SchedulerConfig
from engine.core.sequence import SamplingParams, Sequence
from engine.kernels.compile_log import CompileLog
from experiments.ctrl_c import RECORDER_FILES, interruptible
from experiments.workloads import RequestSpec, prompt_token_ids


@dataclass
class EngineRunConfig(EngineConfig):
    """The engine a replay runs on: engine.config.EngineConfig (same fields, names and defaults) plus the
    sampling temperature of the replayed requests. Built once (from the composed config: `from_config`)
    and handed to engine.llm.LLM as it is."""
    temperature: float = 0.6                # sampling temperature of every replayed request (0 = greedy)

    @classmethod
    def from_config(cls, cfg) -> "EngineRunConfig":
        """From the composed servelab config: each field from `backend.<field>`, else the top-level
        `<field>` (one name in both), else the default; backend.model_path made absolute."""
        from hydra.utils import to_absolute_path
        from omegaconf import OmegaConf

        top, backend = OmegaConf.to_container(cfg, resolve=True), OmegaConf.to_container(cfg.backend, resolve=True)
        values = {f.name: backend[f.name] if f.name in backend else top[f.name]
                  for f in fields(cls) if f.name in backend or f.name in top}
        values["model_path"] = to_absolute_path(str(values["model_path"]))
        try:
            return cls(**values)
        except ValueError as e:         # the engine names its own field: name the key the user types
            field_name = str(e).split(" ", 1)[0]
            if field_name in backend:
                raise ValueError(f"backend.{e}") from None
            raise


@dataclass
class RunResult:
    """One run's tables plus facts about it (JSON-able `info`)."""
    requests: object                        # pandas DataFrame, engine.core.recorder.REQUEST_COLUMNS
    steps: object                           # pandas DataFrame, engine.core.recorder.STEP_COLUMNS
    info: dict = field(default_factory=dict)
    decisions: object = None                # pandas DataFrame, engine.core.recorder.DECISION_COLUMNS, when recorded


def make_sequences(requests: Iterable, vocab_size: int, *, temperature: float = 0.6, rng_seed: int = 0,
                   eos_token_id: int | None = None, record_token_times: bool = False) -> list[Sequence]:
    """Fresh Sequences (same ids, prompts and lengths every call) from RequestSpecs or Sequences.

    RequestSpec: prompt ids from experiments.workloads.prompt_token_ids(spec, vocab_size, rng_seed),
    max_tokens = num_output_tokens, ignore_eos. A Sequence is copied (prompt, arrival, max_tokens,
    priority, tenant, SLO targets) so the caller's object is never mutated by a run.
    """
    out = []
    for r in requests:
        if isinstance(r, RequestSpec):
            rid, arrival, prio = r.request_id, r.arrival_time_s, r.priority
            prompt, max_tokens = prompt_token_ids(r, vocab_size, rng_seed), int(r.num_output_tokens)
        elif isinstance(r, Sequence):
            rid, arrival, prio = r.request_id, r.arrival_time_s, r.priority
            prompt, max_tokens = r.token_ids[:r.num_prompt_tokens], r.max_output_tokens
        else:
            raise TypeError(f"requests must be experiments.workloads.RequestSpec or engine.core.sequence.Sequence, "
                            f"got {type(r).__name__}")
        params = SamplingParams(temperature=temperature, max_tokens=max_tokens, ignore_eos=True,
                                seed=None)
        out.append(Sequence(rid, prompt, params, arrival_time_s=arrival, priority=prio, eos_token_id=eos_token_id,
                            record_token_times=record_token_times, tenant=r.tenant, ttft_slo_s=r.ttft_slo_s,
                            tpot_slo_s=r.tpot_slo_s))
    ids = [s.request_id for s in out]
    if len(set(ids)) != len(ids):
        raise ValueError("request ids must be unique within a workload")
    out.sort(key=lambda s: s.arrival_time_s)
    return out


def scheduler_config(num_kvcache_blocks: int, num_cpu_blocks: int, cfg: EngineRunConfig,
                     max_model_len: int, cpu_cache_num_blocks: int | None = None) -> SchedulerConfig:
    """The SchedulerConfig both backends of a validation use (identical by construction); cpu_cache_num_blocks
    None: cfg's."""
    given = dict(num_kvcache_blocks=num_kvcache_blocks, num_cpu_blocks=num_cpu_blocks, max_model_len=max_model_len)
    if cpu_cache_num_blocks is not None:
        given["cpu_cache_num_blocks"] = cpu_cache_num_blocks
    return SchedulerConfig.from_settings(cfg, **given)


class EngineReplayer:
    """Loads the model once; replays workloads in real time under any policy."""

    def __init__(self, config: EngineRunConfig):
        from engine.llm import LLM  # torch is imported only when the engine backend is chosen

        self.config = config
        self.llm = LLM(config)
        self.runner = self.llm.runner
        self.vocab_size = self.llm.vocab_size
        self.max_model_len = self.runner.max_model_len
        self.num_kvcache_blocks = self.runner.num_kvcache_blocks
        self.num_cpu_blocks = self.runner.num_cpu_blocks
        self.cpu_cache_num_blocks = self.runner.cpu_cache_num_blocks
        self._sync = _device_sync(self.runner)

    def scheduler_config(self, num_kvcache_blocks: int | None = None, num_cpu_blocks: int | None = None,
                         cpu_cache_num_blocks: int | None = None):
        """The replay's SchedulerConfig: each block count as given (at most what the runner allocated), else
        the runner's."""
        kv = self.num_kvcache_blocks if num_kvcache_blocks is None else int(num_kvcache_blocks)
        cpu = self.num_cpu_blocks if num_cpu_blocks is None else int(num_cpu_blocks)
        tier = self.cpu_cache_num_blocks if cpu_cache_num_blocks is None else int(cpu_cache_num_blocks)
        if not 0 <= tier <= self.cpu_cache_num_blocks:
            raise ValueError(f"cpu_cache_num_blocks={tier} must be in [0, {self.cpu_cache_num_blocks}] "
                             f"(the CPU-tier blocks the runner allocated); load the engine with a larger "
                             f"EngineRunConfig.cpu_cache_num_blocks")
        if not 1 <= kv <= self.num_kvcache_blocks:
            raise ValueError(f"num_kvcache_blocks={kv} must be in [1, {self.num_kvcache_blocks}] (the blocks the "
                             f"runner allocated); load the engine with a larger EngineRunConfig.num_kvcache_blocks")
        if not 0 <= cpu <= self.num_cpu_blocks:
            raise ValueError(f"num_cpu_blocks={cpu} must be in [0, {self.num_cpu_blocks}] (the swap blocks the "
                             f"runner allocated); load the engine with a larger EngineRunConfig.num_cpu_blocks")
        return scheduler_config(kv, cpu, self.config, self.max_model_len, tier)

    def sequences(self, requests: Iterable) -> list[Sequence]:
        return make_sequences(requests, self.vocab_size, temperature=self.config.temperature,
                              rng_seed=self.config.seed)

    def warmup(self, num_requests: int = 8, prompt_len: int = 512, output_len: int = 8) -> float:
        """Replays a few throw-away requests (prefills of several lengths, then decodes), all arriving at once,
        through the loop the timed replays run (overlapped when the config says so) to trigger JIT compilation,
        autotuning and lazily loaded kernels before anything is timed; returns the seconds it took. A synchronous
        warm-up left the overlap path's own first use to the first replay: on the H200 its first step took 50-130
        ms and its second step's launch 36-103 ms, against ~2-26 ms in every later replay
        (benchmarks/results/generalize/h200_1204/)."""
        from engine.core.sequence import SamplingParams as SP
        t0 = time.perf_counter()
        n = max(1, min(prompt_len, self.max_model_len - output_len - 1))
        lengths = sorted({max(1, n >> k) for k in range(num_requests)})
        seqs = [Sequence(f"warmup-{i}", [(7 * i + 3 * p) % self.vocab_size for p in range(length)],
                         SP(max_tokens=output_len, ignore_eos=True)) for i, length in enumerate(lengths)]
        self.replay(seqs, "vllm", num_cpu_blocks=0, cpu_cache_num_blocks=0)
        self._sync()
        return time.perf_counter() - t0

    def replay(self, requests: Iterable, policy="vllm", *, num_kvcache_blocks: int | None = None,
               num_cpu_blocks: int | None = None, eviction=None, recorder: Recorder | None = None,
               max_wall_s: float | None = None, enable_chunked_prefill: bool | None = None,
               cpu_cache_num_blocks: int | None = None, cpu_cache_eviction=None) -> RunResult:
        """Replays `requests` (RequestSpecs or Sequences) in real time; see the module docstring.

        policy: a registered name or a SchedulingPolicy object (fresh: it keeps per-run state); eviction
        likewise (None: the block manager's default, LRU);
        enable_chunked_prefill overrides the engine config's setting for this replay;
        cpu_cache_num_blocks: the prefix cache's CPU tier (<= the runner's; None: the runner's),
        cpu_cache_eviction its policy, a name or an object (None: LRU)."""
        seqs = self.sequences(requests)
        sched_cfg = self.scheduler_config(num_kvcache_blocks, num_cpu_blocks, cpu_cache_num_blocks)
        if enable_chunked_prefill is not None:
            sched_cfg = replace(sched_cfg, enable_chunked_prefill=bool(enable_chunked_prefill))
        pol = _make_policy(policy) if isinstance(policy, str) else policy
        evict = _make_eviction(eviction) if isinstance(eviction, str) else eviction
        tier_evict = _make_eviction(cpu_cache_eviction) if isinstance(cpu_cache_eviction, str) else cpu_cache_eviction
        sched = Scheduler(sched_cfg, policy=pol, eviction=evict,
                          cpu_cache_eviction=tier_evict if sched_cfg.cpu_cache_num_blocks else None)
        rec = recorder or Recorder()
        info = self.run(sched, seqs, rec, max_wall_s=max_wall_s)
        tier = sched.block_manager.cpu_cache
        info.update(policy=policy if isinstance(policy, str) else pol.name, victim=pol.victim.name,
                    eviction=sched.block_manager.eviction.name, scheduler=asdict(sched_cfg),
                    cpu_cache_eviction=None if tier is None else tier.eviction.name,
                    engine=asdict(self.config),
                    runner_num_kvcache_blocks=self.num_kvcache_blocks, device=str(self.runner.device),
                    dtype=str(self.runner.dtype), attention_backend=self.runner.attn_backend.name,
                    num_cuda_graphs=len(getattr(self.runner, "graphs", {}) or {}))
        return RunResult(rec.requests_frame(), rec.steps_frame(), info,
                         rec.decisions_frame() if rec.record_decisions else None)

    def run(self, sched: Scheduler, seqs: list[Sequence], rec: Recorder, *, max_wall_s: float | None = None) -> dict:
        """The real-time loop over seqs on this engine (run_loop, or run_loop_overlapped when the engine was built
        with overlap scheduling), recording each step's measured seconds; returns the loop's facts."""
        # CUDA with overlap scheduling: each step's device time too (two timing events a step). Only there: run
        # synchronously, a step's events would also span the host's input copies and launches, which the device
        # waits for, so they would not be the device's time.
        self.runner.time_device = getattr(self.runner, "is_cuda", False) and bool(self.config.overlap_scheduling)
        device_time = (lambda: self.runner.last_device_time_s) if self.runner.time_device else None
        copy_time = lambda: getattr(self.runner, "last_copy_host_s", None)    # noqa: E731
        # A kernel compiled inside the run stretches the step that launched it: the run's info says how many.
        with CompileLog() as compiles:
            if self.config.overlap_scheduling:
                info = run_loop_overlapped(sched, self.runner.launch, self.runner.collect, seqs, rec,
                                           release=self.runner.release, max_wall_s=max_wall_s,
                                           device_time=device_time,
                                           drained=lambda: getattr(self.runner, "drained_at_s", None),
                                           copy_time=copy_time)
            else:
                info = run_loop(sched, self.runner.execute, self._sync, seqs, rec, release=self.runner.release,
                                max_wall_s=max_wall_s, device_time=device_time, copy_time=copy_time)
        info.update(compiles.summary())
        return info


# An idle replay spins the last millisecond before an arrival: time.sleep wakes 50-200 us late (a sleep's median
# overshoot was 148 us on a 2-core CPU box; on the H200 host, requests arriving at an idle engine were scheduled a
# median of 172 us after their arrival time: benchmarks/results/generalize/h200_1204/), which their TTFT paid and
# a simulated run, scheduling an arrival on an idle replica at once, does not.
IDLE_SPIN_S = 1e-3


class _Intake:
    """The replay's arrivals: requests queued at their arrival time on the run's clock, idle waits.
    spin_s: the last stretch of an idle wait is spun on the clock instead of slept (None: IDLE_SPIN_S with
    time.sleep, 0 with an injected sleep, whose fake clock only moves when it sleeps)."""

    def __init__(self, seqs, sched: Scheduler, rec: Recorder, clock, sleep, max_wall_s, spin_s: float | None = None):
        self.pending = deque(sorted(seqs, key=lambda s: s.arrival_time_s))
        self.sched, self.rec, self.clock, self.sleep, self.max_wall_s = sched, rec, clock, sleep, max_wall_s
        self.spin_s = (IDLE_SPIN_S if sleep is time.sleep else 0.0) if spin_s is None else float(spin_s)
        self.t0 = clock()
        self.start_unix_s = time.time()     # the run clock's 0 on the wall clock (to align GPU clock logs)
        self.num_rejected = 0

    def now(self) -> float:
        return self.clock() - self.t0

    def admit(self) -> None:
        """Queues every request that has arrived (raises TimeoutError past max_wall_s)."""
        now, pending, sched = self.now(), self.pending, self.sched
        while pending and pending[0].arrival_time_s <= now:
            seq = pending.popleft()
            if not sched.add(seq):
                self.reject(seq)
        if self.max_wall_s is not None and now > self.max_wall_s:
            raise TimeoutError(f"replay ran past max_wall_s={self.max_wall_s} s with {sched.num_unfinished} "
                               f"unfinished and {len(pending)} pending requests; lower the load or raise max_wall_s")

    def reject(self, seq) -> None:
        self.num_rejected += 1
        self.rec.on_finish(seq)

    def wait(self) -> float:
        """Waits until the next pending request arrives: sleeps, then spins its last spin_s on the clock;
        returns the seconds waited."""
        arrival = self.pending[0].arrival_time_s
        wait = arrival - self.now()
        if wait <= 0:
            return 0.0
        if wait > self.spin_s:
            self.sleep(wait - self.spin_s)
        while self.spin_s and self.now() < arrival:
            pass
        return wait

    def stalled(self, at_s: float) -> RuntimeError:
        return RuntimeError(f"replay stalled at t={at_s:.3f}s: {self.sched.num_unfinished} unfinished requests, "
                            f"nothing schedulable and no arrivals left")


def _record_measured(rec: Recorder, row: int, device_time, copy_time) -> None:
    """The step's device_time_s and copy_host_s, where the callbacks (None: not measured) have them."""
    for column, read in (("device_time_s", device_time), ("copy_host_s", copy_time)):
        if read is not None and (seconds := read()) is not None:
            rec.set_measured(row, column, seconds)


def run_loop(sched: Scheduler, execute, sync, seqs: list[Sequence], rec: Recorder, *, release=None,
             clock=time.perf_counter, sleep=time.sleep, max_wall_s: float | None = None, device_time=None,
             copy_time=None) -> dict:
    """The real-time loop over `seqs` (sorted by arrival); returns facts about the run.

    execute(batch) -> tokens and sync() are the executor (the model runner and a device
    synchronize); clock and sleep are injectable so the loop can be tested on a fake clock;
    device_time() -> seconds or None, the device's time of the step just executed (the steps'
    device_time_s column); copy_time() -> seconds or None, the host's time in its block copies (copy_host_s).
    """
    intake = _Intake(seqs, sched, rec, clock, sleep, max_wall_s)
    pending, now = intake.pending, intake.now
    bm = sched.block_manager
    busy_s = idle_s = 0.0
    last_end = None
    host_gap_s = 0.0

    while pending or sched.has_unfinished():
        intake.admit()
        if not sched.has_unfinished():
            if pending:
                idle_s += intake.wait()
                last_end = None
            continue
        start = now()
        if last_end is not None:
            host_gap_s += start - last_end
        batch = sched.schedule(start)
        for seq in batch.rejected:          # given up by the policy (e.g. a target it can no longer meet)
            intake.reject(seq)
        if batch.is_empty and not sched.has_unfinished():
            continue                        # the policy rejected all that was left
        if batch.is_empty:
            # Work is queued but the policy runs nothing now: only an arrival can change that.
            if not pending:
                raise intake.stalled(start)
            idle_s += intake.wait()
            last_end = None
            continue
        tokens = execute(batch)
        sync()                              # the step is over when the device is, not when the launch returns
        end = now()
        busy_s += end - start
        rec.on_step(start, end - start, batch, bm.num_used_blocks, bm.num_free_blocks, bm.num_cached_free_blocks)
        _record_measured(rec, rec.num_steps - 1, device_time, copy_time)
        done = sched.postprocess(batch, tokens, end)
        for seq in done:
            if release is not None:
                release(seq.request_id)
            rec.on_finish(seq)
        last_end = end
    wall = now()
    return dict(wall_s=wall, busy_s=busy_s, idle_s=idle_s, host_gap_s=host_gap_s, start_unix_s=intake.start_unix_s,
                num_requests=len(seqs),
                num_rejected=intake.num_rejected, num_steps=rec.num_steps)


def run_loop_overlapped(sched: Scheduler, launch, collect, seqs: list[Sequence], rec: Recorder, *, release=None,
                        clock=time.perf_counter, sleep=time.sleep, max_wall_s: float | None = None,
                        device_time=None, drained=None, copy_time=None) -> dict:
    """run_loop with overlap scheduling (docs/overlap.md): each step is scheduled and launched while the
    one before runs (launch(batch) -> handle, then Scheduler.mark_in_flight), and the one before is then
    collected (collect(handle) -> tokens, Scheduler.postprocess_in_flight).

    A step's row is recorded when it is launched; its time once its tokens are on the host
    (Recorder.set_step_time): from the previous step's end (or its own schedule, after an idle
    device) to then, so the rows tile the busy time. host_gap_s is 0: the loop's host work falls
    inside the rows. drained() -> a clock() reading or None: when the latest launch first waited for the device to
    finish the step before (a step with block copies reuses their staging); that step's row ends there, and the
    copies' time goes to the row of the step they belong to."""
    intake = _Intake(seqs, sched, rec, clock, sleep, max_wall_s)
    pending, now = intake.pending, intake.now
    bm = sched.block_manager
    busy_s = idle_s = 0.0
    last_end = None
    in_flight = None            # (batch, handle, schedule time, recorder row) of the step the device runs
    drained_s = None            # when the latest launch found the device drained of the in-flight step

    while pending or sched.has_unfinished() or in_flight is not None:
        intake.admit()
        launched = None
        if sched.has_unfinished():
            start = now()
            batch = sched.schedule(start)
            for seq in batch.rejected:
                intake.reject(seq)
            if not batch.is_empty:
                handle = launch(batch)      # reads the batch's inputs before mark_in_flight changes them
                launched_s = now()
                if drained is not None and in_flight is not None and (at := drained()) is not None:
                    drained_s = at - intake.t0
                rec.on_step(start, 0.0, batch, bm.num_used_blocks, bm.num_free_blocks, bm.num_cached_free_blocks)
                rec.set_measured(rec.num_steps - 1, "launch_host_s",
                                 launched_s - (start if drained_s is None else max(start, drained_s)))
                sched.mark_in_flight(batch)
                launched = (batch, handle, start, rec.num_steps - 1)
        if in_flight is None:
            in_flight = launched
            if launched is None:    # nothing runs: only an arrival can change that
                if sched.has_unfinished() and not pending:
                    raise intake.stalled(now())
                if pending:
                    idle_s += intake.wait()
                last_end = None
            continue                # with a step launched: schedule the next one behind it at once
        batch, handle, scheduled_s, row = in_flight
        tokens = collect(handle)
        end = now()
        begin = scheduled_s if last_end is None else max(scheduled_s, last_end)
        row_end = end if drained_s is None else max(begin, min(end, drained_s))
        drained_s = None
        rec.set_step_time(row, begin, row_end - begin)
        _record_measured(rec, row, device_time, copy_time)
        busy_s += row_end - begin
        for seq in sched.postprocess_in_flight(batch, tokens, end):
            if release is not None:
                release(seq.request_id)
            rec.on_finish(seq)
        last_end, in_flight = row_end, launched
    return dict(wall_s=now(), busy_s=busy_s, idle_s=idle_s, host_gap_s=0.0, start_unix_s=intake.start_unix_s,
                num_requests=len(seqs),
                num_rejected=intake.num_rejected, num_steps=rec.num_steps)


def check_model_matches(cfg, chosen_by: list | None = None) -> None:
    """ValueError when the run's `model=` entry does not have the dimensions of the checkpoint the engine
    loads (backend.model_path): the simulator would price one model and the engine run another. chosen_by: the
    command line's overrides that picked or changed the model, named in the error."""
    from hydra.utils import to_absolute_path
    from omegaconf import OmegaConf

    from engine.hf_config import load_hf_config
    from experiments.config import ModelConfig
    from sim.specs.models import MODEL_SPECS, ModelSpec

    path = to_absolute_path(str(cfg.backend.model_path))
    ckpt = ModelSpec.from_hf_config(load_hf_config(path))
    spec = ModelConfig(**OmegaConf.to_container(cfg.model, resolve=True)).to_spec()
    diff = spec.shape_mismatches(ckpt)
    if diff:
        same = [s.name for s in MODEL_SPECS.values() if not s.shape_mismatches(ckpt)]
        given = ", ".join(chosen_by or ["model="])
        fix = (f"use the entry of that checkpoint (model.name={same[0]})" if same else
               f"leave {given} out, or give that checkpoint's dimensions (model.num_layers=... etc.)")
        by = f" (from {given})" if chosen_by else ""
        raise ValueError(f"model={spec.name}{by} does not match the checkpoint {path} ({'; '.join(diff)}); {fix}")


def run_engine(cfg, desc: str = "engine"):
    """The Hydra entry point's engine backend (experiments/run.py): cfg is the composed servelab config.

    Returns experiments.runner_sim.RunResult, like run_sim. One replica, no tensor parallelism.
    """
    from experiments.runner_sim import (
        ProgressRecorder,
        build_workload,
        check_input,
        check_weighted_tenants_exist,
        limits_meta,
        make_scheduler,
        offered_rate_rps,
        progress_bar,
    )
    from experiments.runner_sim import RunResult as TableResult
    from experiments.workloads.changes import add_input_columns

    b = cfg.backend
    if b.get("model_path") is None:
        raise ValueError("backend.model_path is null: the engine backend needs a checkpoint directory, e.g. "
                         "backend=engine backend.model_path=~/models/Qwen3-0.6B")
    if int(cfg.num_replicas) != 1 or int(cfg.tensor_parallel_size) != 1:
        raise ValueError(f"the engine backend runs one replica without tensor parallelism; got num_replicas="
                         f"{cfg.num_replicas}, tensor_parallel_size={cfg.tensor_parallel_size}")
    given_len = cfg.get("max_model_len")
    rcfg = EngineRunConfig.from_config(cfg)
    # The engine settles max_model_len (a given value is checked against the checkpoint), so the workload
    # is clipped to the limit the engine really has.
    rep = EngineReplayer(rcfg)
    positions = rep.runner.model.config.max_position_embeddings
    max_len = rep.max_model_len
    max_len_source = "given" if given_len is not None else (
        f"the engine's default for this checkpoint: min(4096, max_position_embeddings={positions})")
    wl = build_workload(cfg, max_len)
    in_meta = check_input(wl, max_len, positions)
    check_weighted_tenants_exist(cfg, wl)
    warm_s = rep.warmup()
    sched = make_scheduler(cfg, rep.num_kvcache_blocks, rep.num_cpu_blocks, max_len, rep.cpu_cache_num_blocks)
    seqs = make_sequences(wl, rep.vocab_size, temperature=rcfg.temperature, rng_seed=rcfg.seed,
                          record_token_times=bool(cfg.record_token_times))
    bar = progress_bar(len(seqs), desc, bool(cfg.progress))
    rec = ProgressRecorder(0, bar)     # the bar moves as requests finish: one cheap update each, none per step
    interrupted = False
    info: dict = {}
    try:
        with interruptible(protect=RECORDER_FILES):
            info = rep.run(sched, seqs, rec)
    except KeyboardInterrupt:          # keep what finished
        interrupted = True
    finally:
        bar.close()
    meta = {"backend": "engine", "model": Path(rcfg.model_path).name, "hardware": _device_label(rep.runner),
            "num_replicas": 1, "num_kvcache_blocks": rep.num_kvcache_blocks, "num_cpu_blocks": rep.num_cpu_blocks,
            "cpu_cache_num_blocks": rep.cpu_cache_num_blocks, "cpu_cache_gib": rcfg.cpu_cache_gib,
            "request_rate_rps": offered_rate_rps(cfg, wl), "warmup_s": warm_s,
            "overlap_scheduling": bool(rcfg.overlap_scheduling),
            "interrupted": interrupted, **info, **in_meta, **limits_meta(sched, max_len_source)}
    note_compiles(meta)
    req = add_input_columns(rec.requests_frame(), wl)
    meta["num_unfinished"] = len(wl) - len(req)
    token_times = rec.token_times_frame() if cfg.record_token_times else None
    return TableResult(req, rec.steps_frame(), token_times, meta, complete=not interrupted)


def note_compiles(info: dict, file=None) -> str | None:
    """Prints (stderr) and returns the NOTE line for a run that compiled kernels after its warm-up, else None: the
    steps that launched them took longer than the kernels' own time (info: EngineReplayer.run's)."""
    triton, torch_frames = info.get("triton_compiles") or 0, info.get("torch_compiles") or 0
    if not (triton or torch_frames):
        return None
    kernels = ", ".join(sorted(set(info.get("triton_compiled_kernels") or ())))
    seconds = info.get("triton_compile_s") or 0.0
    text = (f"NOTE the engine compiled during the run: {triton} Triton kernel(s) ({seconds:.2f} s"
            f"{': ' + kernels if kernels else ''}) and {torch_frames} torch.compile frame(s); the steps that "
            f"launched them are longer by that time (triton_compiles, torch_compiles in the run's meta)")
    print(text, file=file or sys.stderr, flush=True)
    return text


def _device_label(runner) -> str:
    if getattr(runner, "is_cuda", False):
        import torch
        return torch.cuda.get_device_name(runner.device)
    return "cpu"


def _device_sync(runner):
    if getattr(runner, "is_cuda", False):
        import torch
        device = runner.device
        return lambda: torch.cuda.synchronize(device)
    return lambda: None


def _make_policy(name: str):
    from policies.registry import make_scheduling_policy
    return make_scheduling_policy(name)


def _make_eviction(name: str):
    from policies.registry import make_eviction_policy
    return make_eviction_policy(name)
