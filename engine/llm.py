"""Offline and step-wise front end of the real engine.

    llm = LLM("/path/to/Qwen3-0.6B", max_num_seqs=64)     # or LLM(EngineConfig("/path/to/Qwen3-0.6B", ...))
    outs = llm.generate(["Hello", [1, 2, 3]], SamplingParams(temperature=0, max_tokens=32))
    outs[0].text, outs[0].token_ids

Step API (what an online loop or the experiment runner drives; the clock is injectable):
    rid = llm.add_request(prompt, sampling_params, request_id=None, arrival_time_s=None)
    finished = llm.step()          # RequestOutputs of the requests that finished in this step
    llm.has_unfinished()
    llm.abort_request(rid)         # between steps: drop it and free its KV blocks

An online server checks a request where it arrives and queues it where the engine steps:
    seq = llm.make_sequence(prompt, params, request_id, arrival_time_s)   # ValueError naming the field
    llm.submit(seq)
    batch, finished, rejected = llm.step_batch()  # the step's Batch (every sequence that got a token), the
                                                  # finished, those the policy rejected

With overlap_scheduling=True (docs/overlap.md) a step_batch() call schedules and launches the next step
before it collects the one it returns; an unfinished sequence's token_ids may then end in placeholders
for the tokens of steps in flight (engine.core.in_flight.is_placeholder), and llm.drain() collects the
step left in flight. Outputs and finish reasons are the synchronous loop's (greedy and seeded sampling).

With tensor_parallel_size > 1 the LLM holds worker processes: call llm.close() or use
`with LLM(...) as llm:` (they are also stopped at interpreter exit). Worker processes are started
with multiprocessing's spawn method, so a script creating an LLM needs the usual
`if __name__ == "__main__":` guard.
"""
from __future__ import annotations

import time
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Callable

from engine.config import EngineConfig
from engine.core.scheduler import Scheduler, SchedulerConfig
from engine.core.sequence import SamplingParams, Sequence, SequenceStatus
from engine.models import load_hf_config

_TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "tokenizer.model", "vocab.json")


@dataclass
class RequestOutput:
    request_id: object
    prompt_token_ids: list[int]
    token_ids: list[int]               # generated tokens only
    text: str | None                   # decoded output (None when the checkpoint has no tokenizer)
    finish_reason: str | None          # "length" | "eos" | "rejected" (the scheduling policy gave up on it)
    arrival_time_s: float
    first_token_time_s: float | None
    finish_time_s: float | None
    num_cached_tokens: int
    num_preemptions: int
    num_swaps: int
    num_cpu_cached_tokens: int = 0     # of num_cached_tokens, loaded from the prefix cache's CPU tier
    reject_reason: str | None = None   # why, when finish_reason is "rejected"


@dataclass
class StepStats:
    """One executed step, in seconds of the LLM's clock."""
    start_s: float
    duration_s: float
    num_seqs: int
    num_prefill_tokens: int
    num_decode_seqs: int
    num_preempted: int
    num_swapped_out: int
    num_swapped_in: int
    num_free_blocks: int


def _rates(pbar, tokens: dict, seconds: dict, refresh: bool) -> None:
    """The progress bar's prefill and decode tokens per second so far."""
    pbar.set_postfix(prefill=f"{tokens['prefill'] / max(seconds['prefill'], 1e-9):.0f}tok/s",
                     decode=f"{tokens['decode'] / max(seconds['decode'], 1e-9):.0f}tok/s", refresh=refresh)


class LLM:
    def __init__(self, model_path: str | Path | EngineConfig, *, clock: Callable[[], float] | None = None,
                 policy=None, eviction=None, cpu_cache_eviction=None, **engine_options):
        from engine.model_runner import ModelRunner  # torch is imported here, not at module import

        if isinstance(model_path, EngineConfig):
            if engine_options:
                raise TypeError(f"LLM(config, ...) takes no engine options besides the EngineConfig, got "
                                f"{sorted(engine_options)}; set them in the EngineConfig")
            self.config = replace(model_path)   # the runner fills the derived fields in the LLM's own copy
        else:
            self.config = EngineConfig.from_kwargs(str(model_path), **engine_options)
        hf_config = load_hf_config(self.config.model_path)
        self.runner = ModelRunner(self.config, hf_config)
        self.scheduler = Scheduler(SchedulerConfig.from_settings(
            self.config, num_kvcache_blocks=self.runner.num_kvcache_blocks, num_cpu_blocks=self.runner.num_cpu_blocks,
            max_model_len=self.runner.max_model_len, cpu_cache_num_blocks=self.runner.cpu_cache_num_blocks),
            policy=policy, eviction=eviction, cpu_cache_eviction=cpu_cache_eviction)
        self.clock = clock or time.perf_counter
        self.tokenizer = _load_tokenizer(self.config.model_path)
        eos = hf_config.get("eos_token_id")
        if isinstance(eos, list):
            eos = eos[0] if eos else None
        if eos is None and self.tokenizer is not None:
            eos = self.tokenizer.eos_token_id
        self.eos_token_id = eos
        self.vocab_size = self.runner.model.config.vocab_size
        self.last_step: StepStats | None = None
        self._live: dict[object, Sequence] = {}
        self._next_id = 0
        # overlap scheduling: (batch, LaunchedStep, its schedule time) of the step the device runs, and the
        # time the latest collected step's tokens reached the host
        self._in_flight = None
        self._last_end_s: float | None = None

    # -- requests -------------------------------------------------------------------
    def make_sequence(self, prompt, params: SamplingParams | None = None, request_id=None,
                      arrival_time_s: float | None = None) -> Sequence:
        """A checked, not yet queued Sequence (ValueError naming the limit a request breaks)."""
        if isinstance(prompt, str):
            if self.tokenizer is None:
                raise ValueError(f"prompt is a string but {self.config.model_path!r} has no tokenizer files "
                                 f"({', '.join(_TOKENIZER_FILES)}); pass token id lists instead")
            token_ids = self.tokenizer.encode(prompt)
        else:
            token_ids = [int(t) for t in prompt]
        if request_id is None:
            request_id = self._next_id
            self._next_id += 1
        if request_id in self._live:
            raise ValueError(f"request_id {request_id!r} is already in flight; request ids must be unique")
        params = params or SamplingParams()
        n, limit = len(token_ids), self.runner.max_model_len
        if n == 0:
            raise ValueError(f"request {request_id!r}: the prompt is empty; give at least one token")
        if min(token_ids) < 0 or max(token_ids) >= self.vocab_size:
            raise ValueError(f"request {request_id!r}: token ids must be in [0, {self.vocab_size}) (vocab_size), "
                             f"got min {min(token_ids)} max {max(token_ids)}")
        if n > limit:
            raise ValueError(f"request {request_id!r}: prompt has {n} tokens, more than max_model_len={limit}; "
                             f"shorten the prompt or raise max_model_len")
        if n + params.max_tokens > limit:
            raise ValueError(f"request {request_id!r}: prompt ({n}) + max_tokens ({params.max_tokens}) exceeds "
                             f"max_model_len={limit}; lower max_tokens to <= {limit - n} or raise max_model_len")
        blocks = -(-(n + params.max_tokens) // self.config.block_size)
        if blocks > self.runner.num_kvcache_blocks:
            raise ValueError(f"request {request_id!r} needs {blocks} KV blocks (prompt {n} + max_tokens "
                             f"{params.max_tokens}, block_size {self.config.block_size}) but the KV cache has only "
                             f"{self.runner.num_kvcache_blocks}; raise num_kvcache_blocks / gpu_memory_utilization "
                             f"or lower max_tokens")
        arrival = self.clock() if arrival_time_s is None else arrival_time_s
        return Sequence(request_id, token_ids, params, arrival_time_s=arrival, eos_token_id=self.eos_token_id)

    def submit(self, seq: Sequence) -> None:
        """Queues a Sequence from make_sequence (ValueError when the scheduler rejects it)."""
        if not self.scheduler.add(seq):
            raise ValueError(f"request {seq.request_id!r} rejected: {seq.reject_reason}")
        self._live[seq.request_id] = seq

    def add_request(self, prompt, sampling_params: SamplingParams | None = None, request_id=None,
                    arrival_time_s: float | None = None):
        """Queues one request (a string or a list of token ids); returns its request id."""
        seq = self.make_sequence(prompt, sampling_params, request_id, arrival_time_s)
        self.submit(seq)
        return seq.request_id

    def abort_request(self, request_id) -> bool:
        """Drops an unfinished request and frees its KV blocks (GPU and swap); call between steps.
        Returns False when no such request is in flight (finished already, or never added)."""
        seq = self._live.pop(request_id, None)
        if seq is None:
            return False
        self.scheduler.abort(seq)
        self.runner.release(request_id)
        return True

    def has_unfinished(self) -> bool:
        return self.scheduler.has_unfinished() or self._in_flight is not None

    def close(self) -> None:
        """Stops tensor-parallel worker processes (a no-op with tensor_parallel_size=1). Idempotent."""
        self.runner.close()

    def __enter__(self) -> "LLM":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    # -- stepping -------------------------------------------------------------------
    def step(self) -> list[RequestOutput]:
        """Schedules and runs one step; returns the requests that finished in it."""
        _, finished, _ = self.step_batch()
        return [self._output(seq) for seq in finished]

    def step_batch(self):
        """Schedules and runs one step; returns (its Batch, or None when nothing ran; the Sequences that
        finished in it, already released; the waiting Sequences the policy rejected at its start, status
        REJECTED with their reject_reason, no longer in flight). Every sequence of batch.seqs whose
        output grew got one token in this step.

        With config.overlap_scheduling the call schedules and launches the next step first, then
        collects the step launched before it and returns that one (docs/overlap.md)."""
        if self.config.overlap_scheduling:
            return self._step_overlapped()
        start = self.clock()
        batch = self.scheduler.schedule(start)
        rejected = list(batch.rejected)
        for seq in rejected:            # a waiting sequence holds no KV blocks
            self._live.pop(seq.request_id, None)
        if batch.is_empty:
            self.last_step = None
            return None, [], rejected
        tokens = self.runner.execute(batch)
        end = self.clock()
        finished = self.scheduler.postprocess(batch, tokens, end)
        self._stepped(batch, start, end, finished)
        return batch, finished, rejected

    def _stepped(self, batch, start: float, end: float, finished: list[Sequence]) -> None:
        """After a step's postprocess: its StepStats, and the finished requests released."""
        self.last_step = StepStats(start, end - start, batch.num_seqs, batch.num_prefill_tokens,
                                   batch.num_decode_seqs, len(batch.preempted), len(batch.swapped_out),
                                   len(batch.swapped_in), self.scheduler.block_manager.num_free_blocks)
        for seq in finished:
            self.runner.release(seq.request_id)
            del self._live[seq.request_id]

    def _step_overlapped(self):
        """step_batch() with overlap scheduling: schedule and launch step N+1 while the device runs step N,
        then collect and postprocess step N. With nothing in flight it launches two steps first."""
        rejected: list[Sequence] = []
        while True:
            launched = self._launch_next(rejected)
            prev, self._in_flight = self._in_flight, launched
            if prev is not None or launched is None:
                break
        if prev is None:
            self.last_step = None
            return None, [], rejected
        return (*self._collect(prev), rejected)

    def _launch_next(self, rejected: list):
        """Schedules the next step and queues it on the device; None when nothing runs."""
        start = self.clock()
        batch = self.scheduler.schedule(start)
        for seq in batch.rejected:
            self._live.pop(seq.request_id, None)
            rejected.append(seq)
        if batch.is_empty:
            return None
        handle = self.runner.launch(batch)          # reads the batch's inputs before mark_in_flight changes them
        self.scheduler.mark_in_flight(batch)
        return batch, handle, start

    def _collect(self, launched):
        """Waits for a launched step's tokens and postprocesses it: (its batch, the sequences it finished)."""
        batch, handle, scheduled_s = launched
        tokens = self.runner.collect(handle)
        end = self.clock()
        finished = self.scheduler.postprocess_in_flight(batch, tokens, end)
        # A step's row covers its share of the timeline: from the previous step's tokens (or its own
        # schedule, after an idle device) to its own; consecutive steps tile the busy time.
        start = scheduled_s if self._last_end_s is None else max(scheduled_s, self._last_end_s)
        self._last_end_s = end
        self._stepped(batch, start, end, finished)
        return batch, finished

    def drain(self) -> list[RequestOutput]:
        """Overlap scheduling: collects the step in flight without launching another (a no-op when none
        is); returns the requests it finished. Afterwards the device is idle and no token is pending."""
        if self._in_flight is None:
            return []
        launched, self._in_flight = self._in_flight, None
        _, finished = self._collect(launched)
        self._last_end_s = None
        return [self._output(seq) for seq in finished]

    def _output(self, seq: Sequence) -> RequestOutput:
        out_ids = seq.output_token_ids
        text = self.tokenizer.decode(out_ids, skip_special_tokens=True) if self.tokenizer is not None else None
        rejected = seq.status is SequenceStatus.REJECTED
        return RequestOutput(seq.request_id, seq.token_ids[:seq.num_prompt_tokens], out_ids, text,
                             "rejected" if rejected else seq.finish_reason, seq.arrival_time_s,
                             seq.first_token_time_s, seq.finish_time_s, seq.num_cached_tokens, seq.num_preemptions,
                             seq.num_swaps, seq.num_cpu_cached_tokens, seq.reject_reason if rejected else None)

    def generate(self, prompts, sampling_params: SamplingParams | list[SamplingParams] | None = None,
                 use_tqdm: bool = True) -> list[RequestOutput]:
        """Runs prompts (strings or token-id lists; one prompt alone is fine) to completion, in submission order.
        A request the scheduling policy rejects while it waits (e.g. scheduler=edf_reject) comes back with
        finish_reason "rejected" and its reject_reason."""
        if isinstance(prompts, str) or (isinstance(prompts, (list, tuple)) and prompts
                                        and isinstance(prompts[0], int)):
            prompts = [prompts]
        if sampling_params is None or isinstance(sampling_params, SamplingParams):
            sampling_params = [sampling_params or SamplingParams()] * len(prompts)
        if len(sampling_params) != len(prompts):
            raise ValueError(f"got {len(prompts)} prompts but {len(sampling_params)} sampling_params; "
                             f"pass one SamplingParams or one per prompt")
        # Validate everything before any work, so a bad prompt does not leave half a batch queued.
        seqs = [self.make_sequence(p, sp) for p, sp in zip(prompts, sampling_params)]
        for seq in seqs:
            self.submit(seq)
        results: dict[object, RequestOutput] = {}
        pbar = None
        if use_tqdm:
            from tqdm.auto import tqdm
            pbar = tqdm(total=len(seqs), desc="Generating", dynamic_ncols=True)
        tokens = {"prefill": 0, "decode": 0}
        seconds = {"prefill": 0.0, "decode": 0.0}
        wanted = {s.request_id for s in seqs}
        shown_at = float("-inf")
        while len(results) < len(seqs):
            if not self.has_unfinished():
                missing = [s.request_id for s in seqs if s.request_id not in results]
                raise RuntimeError(f"requests {missing[:5]} left the engine without finishing (aborted while "
                                   f"generate ran?)")
            _, finished, rejected = self.step_batch()
            for seq in (*finished, *rejected):
                if seq.request_id in wanted:    # requests queued with add_request finish silently here
                    results[seq.request_id] = self._output(seq)
                    if pbar is not None:
                        pbar.update(1)
            s = self.last_step
            if pbar is not None and s is not None:
                kind = "prefill" if s.num_prefill_tokens else "decode"
                tokens["prefill"] += s.num_prefill_tokens
                tokens["decode"] += s.num_decode_seqs
                seconds[kind] += s.duration_s
                if s.start_s - shown_at > 0.5:      # formatting every step would cost ~1 ms per step
                    shown_at = s.start_s
                    _rates(pbar, tokens, seconds, refresh=False)
        if pbar is not None:
            _rates(pbar, tokens, seconds, refresh=True)     # the whole run's: a short one showed its first step's
            pbar.close()
        if not self.scheduler.has_unfinished():
            self.drain()        # overlap scheduling: the step left in flight only computes discarded tokens
        return [results[s.request_id] for s in seqs]


def _load_tokenizer(model_path):
    if not any((Path(model_path) / f).is_file() for f in _TOKENIZER_FILES):
        return None
    from transformers import AutoTokenizer
    return AutoTokenizer.from_pretrained(str(model_path))
