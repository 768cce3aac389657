"""The engine's overlap-scheduling pipeline as times: what each recorded step row of a run lasts, given
each step's host work before its launch, its device seconds and its host work after its tokens.

    rows_s = overlapped_row_s(prepare_s, device_s, loop_s, restart, waits)     # each argument [rows]

The loop (engine/llm.py, experiments/runner_engine.run_loop_overlapped, docs/overlap.md) schedules and
launches step k+1, then waits for step k's tokens, then postprocesses step k:

    launch(k+1) = host clock after step k-1's postprocess + prepare(k+1)
    device runs k+1 from max(launch(k+1), end(k)) for device(k+1)
    tokens(k)   = max(end(k), launch(k+1))               the row of step k ends here
    the host postprocesses step k for loop(k), then schedules step k+2

so a step's preparation hides behind the step before's device time: a long prefill after a short
decode leaves the device idle for the rest of its preparation, which max(device, host) of the step alone
does not show. A step with block copies (waits[k]: swaps, CPU-tier loads or offloads) first waits for the
device to finish the step before (the copies' pinned staging is shared: engine/model_runner.launch) and
prepares after that; the row of the step before then ends when the device was found idle. Otherwise a
row runs from the previous row's end to its own tokens; restart[k] marks a row scheduled on an idle
device (its begin: its own schedule), which is where a row starts after a gap.
The simulator's overlap loop (sim/simulator.py, Simulator._overlap_loop) runs the same recursion step by
step, its scheduling in between; this function prices a recorded table (experiments.step_tables).
"""
from __future__ import annotations

import numpy as np

RESTART_GAP_S = 1e-7     # a row starting this much after the previous row's end was scheduled on an idle device


def restarts(start_s, duration_s, gap_s: float = RESTART_GAP_S) -> np.ndarray:
    """[rows] bool: the row starts after a gap (rows tile the busy time: a gap is an idle device or a drained
    pipeline); the first row always."""
    start, dur = np.asarray(start_s, dtype=np.float64), np.asarray(duration_s, dtype=np.float64)
    out = np.ones(len(start), dtype=bool)
    if len(start) > 1:
        out[1:] = start[1:] > start[:-1] + dur[:-1] + gap_s
    return out


def table_restarts(steps) -> np.ndarray:
    """restarts() of a recorded steps table in step order: its start_time_s, and each row's own measured
    seconds (measured_duration_s where recorded, else duration_s); all False without start times."""
    if "start_time_s" not in steps:
        return np.zeros(len(np.asarray(steps["num_prefill_seqs"])), dtype=bool)
    dur = steps["measured_duration_s"] if "measured_duration_s" in steps else steps["duration_s"]
    return restarts(steps["start_time_s"], dur)


def overlapped_row_s(prepare_s, device_s, loop_s, restart, waits=None) -> np.ndarray:
    """[rows] seconds of each row (module docstring). prepare_s: host seconds before the step's launch
    (scheduling, inputs); device_s: the device's seconds; loop_s: host seconds after its tokens
    (postprocess, the loop); restart: the row was scheduled on an idle device (restarts()); waits: the step
    has block copies, so its launch first waits for the device (None: no step has)."""
    pre = np.asarray(prepare_s, dtype=np.float64)
    dev = np.asarray(device_s, dtype=np.float64)
    loop = np.asarray(loop_s, dtype=np.float64)
    restart = np.asarray(restart, dtype=bool)
    n = len(pre)
    waits = np.zeros(n, dtype=bool) if waits is None else np.asarray(waits, dtype=bool)
    out = np.empty(n)
    begin = host = end = 0.0            # row begin, host clock, device end of the step in flight
    for k in range(n):
        if k == 0 or restart[k]:        # scheduled at 0 (relative), launched after its preparation
            begin, host = 0.0, pre[k]
            end = host + dev[k]
        if k + 1 < n and not restart[k + 1]:
            # step k+1 is launched before step k's tokens are collected; with copies, once the device is idle
            drained = max(host, end) if waits[k + 1] else None
            launch = (host if drained is None else drained) + pre[k + 1]
            tokens = max(end, launch)
            end = tokens + dev[k + 1]       # max(launch, end(k)) + device(k+1)
            row_end = tokens if drained is None else max(begin, min(tokens, drained))
        else:
            tokens = row_end = max(end, host)
        out[k] = row_end - begin
        begin, host = row_end, tokens + loop[k]
    return out
