"""Per-request and per-step tables, written the same way by the engine and the simulator.

Both backends call `on_step` once per scheduler step (or `on_steps_bulk` for k
pure-decode steps at once) and `on_finish` for each FINISHED or REJECTED
sequence. Rows go into typed arrays (array.array, 8 bytes per value; no object
per row), the values of one row side by side so that a row costs one extend,
because this runs in the simulator's hot loop; the tables reshape them with numpy. `requests_frame()` and
`steps_frame()` build the pandas tables; docs/metrics.md defines every column.
Torch-free.

Storage: the values go into Python lists first (an append is cheap) and move in bulk into typed arrays
(array.array, 8 bytes per value) every _STAGE steps or requests and before a table is built: a value
appended to an array one at a time is converted by argument parsing, which cost more than all the rest
of recording (about a tenth of a simulation's instructions).

Step storage: start time, duration, kv_blocks_used and kv_blocks_cached are kept per step; the
decode shape and the other block counts per run of consecutive steps that share
them (one run per on_step, one per fast-path call: num_decode_seqs, the first
step's decode_context_sum, growing by num_decode_seqs a step, its longest decode
context, growing by 1 a step, and used + free); the prefill / preemption /
swap columns only for the steps where one of them is non-zero. batch_size and num_batched_tokens
are derived when the table is built. `record_steps="none"` keeps no step rows at all (a million-request
simulation then holds only the request table); the step count is still kept.

Overlap scheduling (docs/overlap.md): a step's row is recorded when the step is launched, after
schedule() and before Scheduler.mark_in_flight() (which appends placeholders, so the sampled
entries are counted as scheduled). Its times are the step's share of the timeline, not its device
time alone: in the simulator start is when the device starts the step (the previous step's end)
and duration its overlapped price, max(device, host); in the engine's replay start is the previous
step's end (or the step's schedule time after an idle device) and duration runs to the moment its
tokens are on the host, set with `set_step_time` once known (the next step is recorded before).
Consecutive rows tile the busy time in both. Fit calibrated cost models on synchronous runs,
whose durations are schedule + device + sync.

`record_decisions=True` also keeps, for every step with prefill work, a
preemption or a swap, the request ids of the scheduler's decisions
(`decisions_frame()`: which requests got prefill work, were preempted, swapped
out, swapped in), to align two runs decision by decision
(experiments.divergence). Off by default: the simulator's hot path pays one
flag test per such step.
"""
from __future__ import annotations

import struct
from array import array

import numpy as np

from engine.core.batch import Batch
from engine.core.sequence import Sequence, SequenceStatus

REQUEST_COLUMNS = (
    "request_id", "status", "reject_reason", "num_prompt_tokens", "num_output_tokens", "max_output_tokens",
    "arrival_time_s", "first_scheduled_time_s", "first_token_time_s", "finish_time_s", "ttft_s", "tpot_s", "e2e_s",
    "queueing_delay_s", "num_preemptions", "num_swaps", "num_cached_tokens", "num_cpu_cached_tokens", "priority",
    "tenant", "ttft_slo_s", "tpot_slo_s", "ttft_slo_met", "tpot_slo_met", "slo_met", "replica",
)
STEP_COLUMNS = (
    "step", "replica", "start_time_s", "duration_s", "num_prefill_tokens", "num_prefill_seqs", "num_decode_seqs",
    "batch_size", "num_batched_tokens", "kv_blocks_used", "kv_blocks_free", "kv_blocks_cached", "num_preempted",
    "num_swapped_out", "num_swapped_in",
    # step shape, for fitting cost models (sim.cost_model.base.STEP_TABLE_COLUMNS):
    "prefill_context_sum", "prefill_attention_pairs", "num_prefill_samples", "decode_context_sum", "num_swap_blocks",
    # the longest single context (keys attended) of a prefill entry, of a decode entry, of any entry: a cost
    # model's envelope (sim.cost_model.envelope) and the ragged / long-tail contexts a sum hides
    "max_prefill_context_tokens", "max_decode_context_tokens", "max_context_tokens",
    # prefix-cache hits of the step's admissions per tier and the CPU tier's copies, in blocks (a CPU-tier hit
    # is loaded: num_cpu_hit_blocks host -> GPU copies; num_offload_blocks GPU -> host)
    "num_gpu_hit_blocks", "num_cpu_hit_blocks", "num_offload_blocks",
    # num_swap_blocks by direction (device -> host, host -> device): the two copies cost differently per block
    "num_swap_out_blocks", "num_swap_in_blocks",
    # seconds the device spent on the step (CUDA events from its first copy to its sampled tokens), measured
    # where the device runs steps back to back (overlap scheduling; the profile queues a second launch); NaN
    # elsewhere (the simulator, CPU, synchronous replays, where the events would span the host's launches)
    "device_time_s",
    # host seconds of the step's block copies (swaps, CPU-tier copies: index tensors, the host gather or scatter,
    # the waits for the copies' staging), where the engine ran some; NaN elsewhere. Where a swap step's time goes
    "copy_host_s",
    # host seconds from the step's schedule() to the end of its launch (scheduling, block allocation, prefix
    # hashing, input preparation, copies issued, kernel launches or a graph replay; from the drain where a
    # step with copies first waited for the device), with overlap scheduling; NaN elsewhere. What the host
    # spends before a step can run, which the step before hides when it is longer
    "launch_host_s",
)
RECORD_STEPS = ("all", "none")
# float columns measured on some steps (Recorder.set_measured)
_MEASURED = ("device_time_s", "copy_host_s", "launch_host_s")
# One row per step with a decision; each id column holds the request ids, space-separated, in batch order.
DECISION_COLUMNS = ("step", "start_time_s", "prefill_ids", "preempted_ids", "swapped_out_ids", "swapped_in_ids")
# int64 ('q') columns of each run of steps (see the module docstring):
_RUN = ("len", "num_decode_seqs", "decode_context_sum", "max_decode_context_tokens", "num_kvcache_blocks")
# int64 columns stored only for steps where one of them is non-zero (0 elsewhere):
_STEP_SPARSE = ("num_prefill_tokens", "num_prefill_seqs", "num_preempted", "num_swapped_out", "num_swapped_in",
                "prefill_context_sum", "prefill_attention_pairs", "num_prefill_samples", "num_swap_blocks",
                "max_prefill_context_tokens", "num_gpu_hit_blocks", "num_cpu_hit_blocks", "num_offload_blocks",
                "num_swap_out_blocks", "num_swap_in_blocks")
_REQ_FLOAT = ("arrival_time_s", "first_scheduled_time_s", "first_token_time_s", "finish_time_s", "ttft_slo_s",
              "tpot_slo_s")
_REQ_INT = ("num_prompt_tokens", "num_output_tokens", "max_output_tokens", "num_preemptions", "num_swaps",
            "num_cached_tokens", "num_cpu_cached_tokens", "priority")
_NAN = float("nan")


def _per_step(x, k: int, name: str) -> list:
    """A length-k list from a scalar (repeated) or a length-k sequence / numpy array."""
    if isinstance(x, np.ndarray) and x.ndim == 0:
        x = x.item()
    if isinstance(x, np.ndarray) or hasattr(x, "__len__"):
        if len(x) != k:
            raise ValueError(f"on_steps_bulk: {name} has {len(x)} values, expected {k} (one per step) or a scalar")
        return x.tolist() if isinstance(x, np.ndarray) else list(x)
    return [x] * k


def _ids(seqs) -> str:
    return " ".join(str(s.request_id) for s in seqs)


# the staged columns (Python lists while recording) and their arrays' type codes
_STAGED = (("_step_start", "d"), ("_step_dur", "d"), ("_step_used", "q"), ("_step_cached", "q"), ("_run", "q"),
           ("_sparse", "q"), ("_req_float", "d"), ("_req_int", "q"))
_STAGE = 1 << 10     # steps (or requests) staged before their values move into the arrays (while still in cache)


def _packed(values: list, code: str) -> bytes:
    """values as the machine bytes of an array.array of type code 'd' or 'q', converted by struct in one
    call (the fastest bulk conversion: per value about 2/3 of array(code, values)'s time, half of numpy's;
    it refuses what the array refuses, such as a float for 'q')."""
    return struct.pack(f"{len(values)}{code}", *values)


def _columns(values: array, width: int, dtype) -> list:
    """The `width` columns of rows stored side by side in `values`, as numpy arrays (copies)."""
    table = np.frombuffer(values, dtype=dtype).reshape(-1, width) if len(values) else np.zeros((0, width), dtype)
    return [table[:, i].copy() for i in range(width)]


class Recorder:
    """record_steps: "all" (one row per step) or "none" (no per-step rows; steps_frame() raises)."""

    def __init__(self, replica: int = 0, record_steps: str = "all", record_decisions: bool = False):
        if record_steps not in RECORD_STEPS:
            raise ValueError(f"Recorder.record_steps must be one of {RECORD_STEPS}, got {record_steps!r}")
        self.replica = int(replica)
        self.record_decisions = bool(record_decisions)
        self._decisions: list[tuple] = []        # (step, start_s, prefill, preempted, swapped_out, swapped_in)
        self.record_steps = record_steps
        self._keep_steps = record_steps == "all"
        self._num_steps = 0
        # Staged values (lists; _flush moves them into self._kept's arrays, see the module docstring):
        self._step_start: list[float] = []
        self._step_dur: list[float] = []
        self._step_used: list[int] = []
        self._step_cached: list[int] = []       # kv_blocks_cached
        self._run: list[int] = []                # len(_RUN) values per run of steps
        self._sparse: list[int] = []             # per sparse row: its step index, then the _STEP_SPARSE values
        self._req_float: list[float] = []        # len(_REQ_FLOAT) values per request
        self._req_int: list[int] = []            # len(_REQ_INT) values per request
        self._kept = {name: array(code) for name, code in _STAGED}   # the values flushed so far, per column
        # the float columns set on some steps only (NaN elsewhere): column -> (rows, values)
        self._measured = {c: (array("q"), array("d")) for c in _MEASURED}
        self._req_ids: list = []
        self._req_status: list[str] = []
        self._req_reason: list = []
        self._req_tenant: list[str] = []
        self._token_times: list[tuple[object, list[float]]] = []   # only sequences that recorded them

    @property
    def num_steps(self) -> int:
        return self._num_steps

    @property
    def num_requests(self) -> int:
        return len(self._req_ids)

    def _flush(self) -> None:
        """Move the staged values into the arrays."""
        kept = self._kept
        for name, code in _STAGED:
            staged = getattr(self, name)
            if staged:
                kept[name].frombytes(_packed(staged, code))
                staged.clear()

    def _stored(self, name: str) -> array:
        """Every value of a staged column so far, as its array."""
        self._flush()
        return self._kept[name]

    # -- hot path ------------------------------------------------------------------
    def on_step(self, start_s: float, duration_s: float, batch: Batch, num_used_blocks: int,
                num_free_blocks: int, num_cached_blocks: int) -> None:
        """One scheduler step that started at start_s and took duration_s (run clock, seconds).

        Call it after schedule() and before postprocess() (with overlap scheduling: before
        mark_in_flight(); the time may follow with set_step_time): num_prefill_samples
        compares each entry's context with its token count as scheduled. Block
        counts: used by live sequences, allocatable (free + cached-free), cached-free.
        """
        row = self._num_steps
        self._num_steps = row + 1
        if not self._keep_steps:
            return
        self._step_start.append(start_s)
        self._step_dur.append(duration_s)
        self._step_used.append(num_used_blocks)
        if len(self._step_start) >= _STAGE:
            self._flush()
        npf = batch.num_prefill_seqs
        nseq = len(batch.seqs)
        ctx = batch.context_lens
        if nseq > npf:      # (_add_run inlined: once per step)
            dctx = ctx[npf:] if npf else ctx
            self._run.extend((1, nseq - npf, sum(dctx), max(dctx), num_used_blocks + num_free_blocks))
        else:
            self._run.extend((1, 0, 0, 0, num_used_blocks + num_free_blocks))
        self._step_cached.append(num_cached_blocks)
        if not (npf or batch.preempted or batch.swapped_out or batch.swapped_in or batch.swap_in or batch.swap_out
                or batch.offload or batch.load):
            return      # a pure decode step: every sparse column is 0
        new = batch.num_new_tokens
        pctx = pairs = samples = 0
        if npf:
            seqs = batch.seqs
            for j in range(npf):
                cj, nj = ctx[j], new[j]
                pctx += cj
                pairs += nj * cj - nj * (nj - 1) // 2     # causal: the query at position q sees q + 1 keys
                samples += cj == len(seqs[j].token_ids)
        self._sparse.extend((row, sum(new[:npf]) if npf else 0, npf, len(batch.preempted), len(batch.swapped_out),
                             len(batch.swapped_in), pctx, pairs, samples, len(batch.swap_in) + len(batch.swap_out),
                             max(ctx[:npf]) if npf else 0, batch.num_gpu_hit_blocks, len(batch.load),
                             len(batch.offload), len(batch.swap_out), len(batch.swap_in)))
        if self.record_decisions:
            self._decisions.append((row, start_s, _ids(batch.seqs[:npf]), _ids(batch.preempted),
                                    _ids(batch.swapped_out), _ids(batch.swapped_in)))

    def set_step_time(self, row: int, start_s: float, duration_s: float) -> None:
        """Overlap scheduling: the start and duration of step `row` (num_steps - 1 right after its
        on_step), known only once its tokens are on the host (see the module docstring)."""
        if self._keep_steps:
            kept = len(self._kept["_step_start"])       # rows flushed into the arrays
            if row >= kept:
                self._step_start[row - kept] = start_s
                self._step_dur[row - kept] = duration_s
            else:
                self._kept["_step_start"][row] = start_s
                self._kept["_step_dur"][row] = duration_s

    def set_measured(self, row: int, column: str, seconds: float) -> None:
        """A measured float column of step `row`: device_time_s (the engine's CUDA events), copy_host_s (the
        host's seconds in its block copies) or launch_host_s (its schedule and launch); see STEP_COLUMNS."""
        if self._keep_steps:
            rows, values = self._measured[column]
            rows.append(row)
            values.append(seconds)

    def on_steps_bulk(self, start_s, duration_s, num_decode_seqs, decode_context_sum, kv_blocks_used,
                      kv_blocks_free, kv_blocks_cached, max_decode_context_tokens=None) -> None:
        """k pure-decode steps at once (no prefill, preemption or swap in any of them).

        start_s: [k] start times; the other arguments are [k] sequences (lists,
        ranges, numpy arrays) or scalars (repeated). batch_size = num_batched_tokens
        = num_decode_seqs; decode_context_sum is the keys attended per step, summed
        over sequences (including that step's token). max_decode_context_tokens: the
        longest decode context per step; None records the mean context rounded up,
        which is exact when every decode entry has the same context.
        """
        k = len(start_s)
        if k == 0:
            return
        self._num_steps += k
        if not self._keep_steps:
            return
        start = _per_step(start_s, k, "start_s")
        dur = _per_step(duration_s, k, "duration_s")
        cols = [_per_step(x, k, name) for x, name in (
            (num_decode_seqs, "num_decode_seqs"), (decode_context_sum, "decode_context_sum"),
            (kv_blocks_used, "kv_blocks_used"), (kv_blocks_free, "kv_blocks_free"),
            (kv_blocks_cached, "kv_blocks_cached"))]
        longest = (None if max_decode_context_tokens is None
                   else _per_step(max_decode_context_tokens, k, "max_decode_context_tokens"))
        self._num_steps -= k
        for i in range(k):      # one run per step: any values are allowed here
            n, ctx, used, free, cached = (int(c[i]) for c in cols)
            self._num_steps += 1
            self._step_start.append(float(start[i]))
            self._step_dur.append(float(dur[i]))
            self._step_used.append(used)
            m = (-(-ctx // n) if n else 0) if longest is None else int(longest[i])
            self._add_run(1, n, ctx, m, used + free)
            self._step_cached.append(cached)
        if len(self._step_start) >= _STAGE:
            self._flush()

    def on_decode_steps(self, start_s: list, duration_s: list, num_seqs: int, first_context_sum: int,
                        kv_blocks_used: list, num_kvcache_blocks: int, kv_blocks_cached,
                        first_context_max: int) -> None:
        """on_steps_bulk for the simulator's fast path (no argument checks): k = len(start_s)
        pure-decode steps of num_seqs sequences; step i attends first_context_sum + i * num_seqs
        keys, its longest context first_context_max + i; kv_blocks_free = num_kvcache_blocks -
        kv_blocks_used; kv_blocks_cached an int or a [k] list."""
        self.on_decode_runs(start_s, duration_s, ((len(start_s), num_seqs, first_context_sum, first_context_max),),
                            kv_blocks_used, num_kvcache_blocks, kv_blocks_cached)

    def on_decode_runs(self, start_s: list, duration_s: list, runs, kv_blocks_used: list, num_kvcache_blocks: int,
                       kv_blocks_cached) -> None:
        """Pure-decode steps in runs of equal batch size (the simulator's decode chains; no argument
        checks): runs = (num_steps, num_seqs, first_context_sum, first_context_max) per run, covering
        the len(start_s) steps in order (step i of a run: sum + i * num_seqs keys, longest context
        max + i); kv_blocks_free = num_kvcache_blocks - kv_blocks_used; kv_blocks_cached an int or a
        list of one value per step."""
        self._num_steps += len(start_s)
        if not self._keep_steps or not start_s:
            return
        self._step_start.extend(start_s)
        self._step_dur.extend(duration_s)
        self._step_used.extend(kv_blocks_used)
        for k, n, s0, m0 in runs:
            self._run += (k, n, s0, m0, num_kvcache_blocks)      # (_add_run inlined)
        if type(kv_blocks_cached) is int:
            self._step_cached += [kv_blocks_cached] * len(start_s)
        else:
            self._step_cached += kv_blocks_cached
        if len(self._step_start) >= _STAGE:
            self._flush()

    def _add_run(self, k: int, num_decode_seqs: int, decode_context_sum: int, max_decode_context: int,
                 total: int) -> None:
        self._run.extend((k, num_decode_seqs, decode_context_sum, max_decode_context, total))

    def on_finish(self, seq: Sequence) -> None:
        """A sequence left the system: FINISHED or REJECTED."""
        status = seq.status
        if status is not SequenceStatus.FINISHED and status is not SequenceStatus.REJECTED:
            raise ValueError(f"Recorder.on_finish: request {seq.request_id!r} is {status.name}; "
                             "only FINISHED or REJECTED sequences are recorded")
        self._req_ids.append(seq.request_id)
        self._req_status.append(status.value)
        self._req_reason.append(seq.reject_reason)
        self._req_tenant.append(seq.tenant)
        first_sched, first_tok, finish = seq.first_scheduled_time_s, seq.first_token_time_s, seq.finish_time_s
        ttft_slo, tpot_slo = seq.ttft_slo_s, seq.tpot_slo_s
        self._req_float.extend((seq.arrival_time_s, _NAN if first_sched is None else first_sched,
                                _NAN if first_tok is None else first_tok,
                                _NAN if finish is None or status is SequenceStatus.REJECTED else finish,
                                _NAN if ttft_slo is None else ttft_slo, _NAN if tpot_slo is None else tpot_slo))
        self._req_int.extend((seq.num_prompt_tokens, len(seq.token_ids) - seq.num_prompt_tokens, seq.max_output_tokens,
                              seq.num_preemptions, seq.num_swaps, seq.num_cached_tokens, seq.num_cpu_cached_tokens,
                              seq.priority))
        if seq.token_times_s:
            self._token_times.append((seq.request_id, list(seq.token_times_s)))
        if len(self._req_int) >= _STAGE * len(_REQ_INT):
            self._flush()

    # -- tables --------------------------------------------------------------------
    def requests_frame(self):
        import pandas as pd
        n = len(self._req_ids)
        cols = {"request_id": self._req_ids, "status": self._req_status, "reject_reason": self._req_reason}
        ints = dict(zip(_REQ_INT, _columns(self._stored("_req_int"), len(_REQ_INT), np.int64)))
        flts = dict(zip(_REQ_FLOAT, _columns(self._stored("_req_float"), len(_REQ_FLOAT), np.float64)))
        arrival, first_tok, finish = flts["arrival_time_s"], flts["first_token_time_s"], flts["finish_time_s"]
        ttft = first_tok - arrival
        e2e = finish - arrival
        nout = ints["num_output_tokens"]
        with np.errstate(divide="ignore", invalid="ignore"):
            # vLLM's TPOT: decode time per output token after the first; undefined for 1-token outputs.
            tpot = np.where(nout > 1, (e2e - ttft) / np.maximum(nout - 1, 1), np.nan)
        for c in ("num_prompt_tokens", "num_output_tokens", "max_output_tokens"):
            cols[c] = ints[c]
        cols.update(flts)
        cols.update(ttft_s=ttft, tpot_s=tpot, e2e_s=e2e, queueing_delay_s=flts["first_scheduled_time_s"] - arrival)
        for c in ("num_preemptions", "num_swaps", "num_cached_tokens", "num_cpu_cached_tokens", "priority"):
            cols[c] = ints[c]
        cols["tenant"] = self._req_tenant
        cols.update(slo_met_columns(ttft, tpot, flts["ttft_slo_s"], flts["tpot_slo_s"], nout))
        cols["replica"] = np.full(n, self.replica, dtype=np.int64)
        return pd.DataFrame(cols, columns=list(REQUEST_COLUMNS))

    def steps_frame(self):
        import pandas as pd
        if not self._keep_steps:
            raise ValueError(f"replica {self.replica}: this Recorder kept no step rows (record_steps='none'); "
                             "build it with record_steps='all' for the per-step table")
        n = self._num_steps
        run = dict(zip(_RUN, _columns(self._stored("_run"), len(_RUN), np.int64)))
        lens = run["len"]
        first = np.cumsum(lens) - lens                                   # first step of each run
        offset = np.arange(n, dtype=np.int64) - np.repeat(first, lens)   # step index within its run
        used = np.frombuffer(self._stored("_step_used"), dtype=np.int64).copy() if n else np.zeros(0, np.int64)
        ndec = np.repeat(run["num_decode_seqs"], lens)
        d = {"num_decode_seqs": ndec,
             "decode_context_sum": np.repeat(run["decode_context_sum"], lens) + offset * ndec,
             "max_decode_context_tokens": np.repeat(run["max_decode_context_tokens"], lens) + offset * (ndec > 0),
             "kv_blocks_used": used, "kv_blocks_free": np.repeat(run["num_kvcache_blocks"], lens) - used,
             "kv_blocks_cached": np.frombuffer(self._stored("_step_cached"), dtype=np.int64).copy() if n
             else np.zeros(0, np.int64)}
        rows, *sparse = _columns(self._stored("_sparse"), 1 + len(_STEP_SPARSE), np.int64)
        sp = {}
        for c, vals in zip(_STEP_SPARSE, sparse):
            col = np.zeros(n, dtype=np.int64)
            col[rows] = vals
            sp[c] = col
        cols = {"step": np.arange(n, dtype=np.int64), "replica": np.full(n, self.replica, dtype=np.int64),
                "start_time_s": (np.frombuffer(self._stored("_step_start"), dtype=np.float64).copy() if n
                                 else np.zeros(0)),
                "duration_s": np.frombuffer(self._stored("_step_dur"), dtype=np.float64).copy() if n else np.zeros(0),
                "batch_size": sp["num_prefill_seqs"] + d["num_decode_seqs"],
                "num_batched_tokens": sp["num_prefill_tokens"] + d["num_decode_seqs"], **d, **sp}
        cols["max_context_tokens"] = np.maximum(cols["max_prefill_context_tokens"], cols["max_decode_context_tokens"])
        for c, (rows, values) in self._measured.items():
            col = np.full(n, np.nan)
            if len(rows):
                col[np.frombuffer(rows, dtype=np.int64)] = np.frombuffer(values, dtype=np.float64)
            cols[c] = col
        return pd.DataFrame(cols, columns=list(STEP_COLUMNS))

    def decisions_frame(self):
        """One row per step with prefill work, a preemption or a swap (DECISION_COLUMNS); needs record_decisions."""
        import pandas as pd
        if not self.record_decisions:
            raise ValueError(f"replica {self.replica}: this Recorder kept no decisions; build it with "
                             "record_decisions=True")
        df = pd.DataFrame(self._decisions, columns=list(DECISION_COLUMNS))
        return df.astype({"step": np.int64, "start_time_s": np.float64})

    def token_times_frame(self):
        """Long table (request_id, token_index, time_s) for sequences that recorded token times."""
        import pandas as pd
        ids, idx, times = [], [], []
        for rid, ts in self._token_times:
            ids.extend([rid] * len(ts))
            idx.extend(range(len(ts)))
            times.extend(ts)
        return pd.DataFrame({"request_id": ids, "token_index": np.asarray(idx, dtype=np.int64),
                             "time_s": np.asarray(times, dtype=np.float64)})


def slo_met_columns(ttft_s, tpot_s, ttft_slo_s, tpot_slo_s, num_output_tokens) -> dict:
    """ttft_slo_met / tpot_slo_met / slo_met per request (pandas nullable booleans): NA where the request
    has no such target, False for a request that never produced its first token (rejected), TPOT of a
    1-token output counted as 0 (vLLM's goodput rule). slo_met: every target it has was met (NA: none)."""
    import pandas as pd
    out = {}
    has = {}
    for name, value, slo in (("ttft", ttft_s, ttft_slo_s), ("tpot", tpot_s, tpot_slo_s)):
        value = np.where(np.isnan(value) & (num_output_tokens == 1) & (name == "tpot") & ~np.isnan(ttft_s),
                         0.0, value)
        has[name] = ~np.isnan(slo)
        with np.errstate(invalid="ignore"):
            met = ~np.isnan(value) & (value <= slo)
        out[f"{name}_slo_met"] = pd.array(np.where(has[name], met, False), dtype="boolean")
        out[f"{name}_slo_met"][~has[name]] = pd.NA
    any_target = has["ttft"] | has["tpot"]
    all_met = (out["ttft_slo_met"].fillna(True) & out["tpot_slo_met"].fillna(True)).to_numpy(dtype=bool)
    out["slo_met"] = pd.array(all_met, dtype="boolean")
    out["slo_met"][~any_target] = pd.NA
    return out


def concat_frames(recorders: list[Recorder]):
    """(requests, steps) of several replicas' recorders, as two DataFrames."""
    import pandas as pd
    if not recorders:
        raise ValueError("concat_frames needs at least one Recorder")
    return (pd.concat([r.requests_frame() for r in recorders], ignore_index=True),
            pd.concat([r.steps_frame() for r in recorders], ignore_index=True))
