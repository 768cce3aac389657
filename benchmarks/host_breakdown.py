"""Where a step's host seconds before its launch go: one real replay (experiments.validate, same flags) with
timers around the scheduler and each part of the model runner's launch, one row per launched step.

    python benchmarks/host_breakdown.py --out FILE.parquet -- <experiments.validate flags>

Columns (seconds unless named otherwise): schedule_s (Scheduler.schedule: admission, block allocation, prefix
lookup), launch_s (ModelRunner.launch, whole), build_s (StepInputBuilder.build: numpy inputs), to_device_s (the
eager forward's host -> device copies), logits_s (the forward: to_device_s, the launches or a graph replay),
sampler_s, gc_s (the garbage collector's pauses inside the launch and schedule), gc_gen2 (full collections among them),
wait_s = launch_s - build_s - logits_s - sampler_s (the rest: waits on events, token copies),
stream_busy_at_launch / stream_busy_after (the device still ran earlier work when the launch began / ended: a
launch that ends on an idle stream waited for it), num_prefill_tokens, num_prefill_seqs, num_decode_seqs,
num_cached_free_blocks, num_free_blocks, t_s (the launch's start, seconds after the first launch), launch_cpu_s /
schedule_cpu_s (this thread's CPU seconds in the launch / the schedule: far below launch_s / schedule_s, the thread
waited, for the device, a lock or the host's other work; near them, it computed). Not part of the suite: a diagnostic
for the host terms of the fit.

    HOST_BREAKDOWN_GC_FREEZE=1  the engine's heap at start-up moved out of the collector's reach (gc.freeze) once
                                the LLM is built: whether the collector's full passes make the launches' stalls
"""
from __future__ import annotations

import gc
import os
import sys
import time
from pathlib import Path

import pandas as pd

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))     # the repository root, where servelab is not installed

ROWS: list[dict] = []
_state = {"t0": None, "gc_s": 0.0, "gc_gen2": 0, "gc_t0": 0.0, "sched": None, "schedule_s": 0.0, "schedule_gc_s": 0.0,
          "schedule_cpu_s": 0.0, "part": {}}


def _gc_callback(phase, info):
    if phase == "start":
        _state["gc_t0"] = time.perf_counter()
    else:
        _state["gc_s"] += time.perf_counter() - _state["gc_t0"]
        _state["gc_gen2"] += info.get("generation") == 2


def _timed(cls, name: str, key: str):
    orig = getattr(cls, name)

    def wrapper(self, *a, **k):
        t0 = time.perf_counter()
        try:
            return orig(self, *a, **k)
        finally:
            _state["part"][key] = _state["part"].get(key, 0.0) + time.perf_counter() - t0
    setattr(cls, name, wrapper)


def install() -> None:
    import torch

    from engine.core.scheduler import Scheduler
    from engine.layers.sampler import Sampler
    from engine.model_runner import ModelRunner
    from engine.step_inputs import StepInputBuilder

    gc.callbacks.append(_gc_callback)
    orig_schedule, orig_launch = Scheduler.schedule, ModelRunner.launch

    def schedule(self, *a, **k):
        g0 = _state["gc_s"]
        t0, c0 = time.perf_counter(), time.thread_time()
        out = orig_schedule(self, *a, **k)
        _state["schedule_s"] = time.perf_counter() - t0
        _state["schedule_cpu_s"] = time.thread_time() - c0
        _state["schedule_gc_s"] = _state["gc_s"] - g0
        _state["sched"] = self
        return out

    def launch(self, batch):
        _state["part"] = {}
        g0, n0 = _state["gc_s"], _state["gc_gen2"]
        stream = torch.cuda.current_stream(self.device) if self.is_cuda else None
        busy0 = stream is not None and not stream.query()
        t0, c0 = time.perf_counter(), time.thread_time()
        if _state["t0"] is None:
            _state["t0"] = t0
        out = orig_launch(self, batch)
        launch_s = time.perf_counter() - t0
        launch_cpu_s = time.thread_time() - c0
        busy1 = stream is not None and not stream.query()
        p = _state["part"]
        bm = _state["sched"].block_manager if _state["sched"] is not None else None
        ROWS.append(dict(
            t_s=t0 - _state["t0"], schedule_s=_state["schedule_s"], schedule_cpu_s=_state["schedule_cpu_s"],
            launch_s=launch_s, launch_cpu_s=launch_cpu_s, build_s=p.get("build", 0.0),
            to_device_s=p.get("to_device", 0.0), logits_s=p.get("logits", 0.0), sampler_s=p.get("sampler", 0.0),
            gc_s=_state["gc_s"] - g0 + _state["schedule_gc_s"], gc_gen2=_state["gc_gen2"] - n0,
            wait_s=launch_s - sum(p.get(k, 0.0) for k in ("build", "logits", "sampler")),
            stream_busy_at_launch=busy0, stream_busy_after=busy1, num_prefill_seqs=batch.num_prefill_seqs,
            num_prefill_tokens=batch.num_prefill_tokens, num_decode_seqs=batch.num_decode_seqs,
            num_cached_free_blocks=bm.num_cached_free_blocks if bm is not None else -1,
            num_free_blocks=bm.num_free_blocks if bm is not None else -1))
        _state["schedule_s"], _state["schedule_gc_s"], _state["schedule_cpu_s"] = 0.0, 0.0, 0.0
        return out

    Scheduler.schedule, ModelRunner.launch = schedule, launch
    if os.environ.get("HOST_BREAKDOWN_GC_FREEZE") == "1":
        from engine.llm import LLM
        orig_init = LLM.__init__

        def init(self, *a, **k):
            orig_init(self, *a, **k)
            gc.collect()
            gc.freeze()
            print(f"host_breakdown: {gc.get_freeze_count()} objects frozen out of the collector's reach")
        LLM.__init__ = init
    _timed(StepInputBuilder, "build", "build")
    _timed(ModelRunner, "_to_device", "to_device")
    _timed(ModelRunner, "_logits", "logits")
    _timed(Sampler, "__call__", "sampler")


STALL_MARGIN_S = 2e-3     # a launch this much above the run's median launch is a stall in summary()


def summary(df: pd.DataFrame, margin_s: float = STALL_MARGIN_S) -> str:
    """A few lines on the launches: the median, the stalls (more than margin_s above it), whether they computed or
    waited (CPU seconds against wall seconds), the collector's share, and the stalls that are a decode batch
    size's first launch (the LM head's first product at that row count: engine/graph_warmup.py)."""
    if df.empty:
        return "host_breakdown: no launches"
    med = float(df["launch_s"].median())
    st = df[df["launch_s"] > med + margin_s]
    first = df["num_prefill_seqs"].eq(0) & ~df["num_decode_seqs"].duplicated() & df["num_decode_seqs"].gt(0)
    lines = [f"host_breakdown: {len(df)} launches, median {med * 1e3:.2f} ms; {len(st)} more than "
             f"{margin_s * 1e3:g} ms above it ({st['launch_s'].sum():.3f} s)"]
    if len(st):
        cpu = float(st["launch_cpu_s"].sum() / st["launch_s"].sum())
        lines.append(f"  their CPU seconds / wall seconds {cpu:.2f} (near 1: the thread computed; far below: it "
                     f"waited); the collector {st['gc_s'].sum() * 1e3:.1f} ms of them; the first launch of a decode "
                     f"batch size: {int((first & df.index.isin(st.index)).sum())}")
    lines.append(f"  the collector in all launches: {df['gc_s'].sum() * 1e3:.1f} ms, {int(df['gc_gen2'].sum())} full "
                 f"collections, the largest pause {df['gc_s'].max() * 1e3:.1f} ms")
    return "\n".join(lines)


def main(argv: list[str]) -> int:
    if "--" not in argv or argv[:1] != ["--out"]:
        print("usage: host_breakdown.py --out FILE.parquet -- <experiments.validate flags>", file=sys.stderr)
        return 2
    out = Path(argv[1])
    install()
    from experiments import validate
    rc = validate.main(argv[argv.index("--") + 1:])
    out.parent.mkdir(parents=True, exist_ok=True)
    df = pd.DataFrame(ROWS)
    df.to_parquet(out)
    print(summary(df))
    print(f"host_breakdown: {len(ROWS)} launches -> {out}")
    return rc


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
