"""`backend=http`: a workload replayed in real time against an OpenAI-compatible server, recorded like the others.

    servelab backend=http backend.url=http://127.0.0.1:8000 model=qwen3_0p6b workload=azure workload.path=...

The requests are the ones the simulator and the engine backend run (same ids, arrival times, lengths, and prompt token
ids drawn from the `model=` entry's vocabulary with the root seed), sent by experiments.http_replay. The request table
has the recorder's columns (engine.core.recorder.REQUEST_COLUMNS) plus HTTP_COLUMNS; what a client cannot see is NaN
(first_scheduled_time_s, queueing_delay_s) or 0 (num_preemptions, num_swaps: ask the server's /metrics). A failed
request keeps its row with status "failed" and its `error`; one the server's policy rejected has status "rejected" and
the server's message as reject_reason. Tenant and SLO targets (tenant, ttft_slo_s, tpot_slo_s) are the workload's and
the *_slo_met columns are judged on the client's times. The step table is empty: the server's steps are its own.
What servelab-serve tells of itself on /v1/models (scheduler, eviction, KV blocks, token budget) is summary.json's
meta["server"] and fills num_kvcache_blocks, num_cpu_blocks and max_num_batched_tokens; another server's are None
("set by the server" in the printed summary).
"""
from __future__ import annotations

import logging
import sys
from pathlib import Path

import numpy as np
import pandas as pd

from experiments.http_replay import (
    HttpBackendError,
    HttpRequest,
    HttpTarget,
    ReplayOutcome,
    replay,
    server_max_model_len,
)

# Columns of the request table beyond the recorder's (docs/experiments.md, "Replaying against a server").
HTTP_COLUMNS = ("send_time_s", "finish_reason", "num_token_chunks", "usage_reported", "http_status", "error")


def target_of(backend) -> HttpTarget:
    """The HttpTarget of a composed config's `backend` node (conf/backend/http.yaml) or a dict of its keys."""
    if not backend.get("url"):
        raise HttpBackendError("backend.url is empty: give the server's address, e.g. backend.url=http://127.0.0.1:8000")
    return HttpTarget(url=str(backend.get("url")),
                      model=None if backend.get("model") is None else str(backend.get("model")),
                      prompt_format=str(backend.get("prompt", "token_ids")),
                      temperature=float(backend.get("temperature", 0.6)),
                      api_key=None if backend.get("api_key") is None else str(backend.get("api_key")),
                      request_timeout_s=float(backend.get("request_timeout_s", 600.0)),
                      return_token_ids=bool(backend.get("return_token_ids", True)))


def load_tokenizer(path):
    """A transformers tokenizer from a local folder (backend.prompt=text decodes the prompt token ids with it)."""
    if path is None:
        raise HttpBackendError("backend.prompt=text needs backend.tokenizer=PATH (a tokenizer folder, e.g. the "
                               "checkpoint's): the prompt token ids are decoded with it")
    try:
        from transformers import AutoTokenizer
    except ModuleNotFoundError as e:
        from experiments.user_errors import MissingExtraError
        raise MissingExtraError("backend.prompt=text needs transformers: pip install -e '.[engine]'") from e
    if not Path(path).is_dir():
        raise FileNotFoundError(f"backend.tokenizer={path}: no such folder")
    return AutoTokenizer.from_pretrained(str(path))


def http_requests(specs, vocab_size: int, seed: int, tokenizer=None) -> list[HttpRequest]:
    """One HttpRequest per RequestSpec: prompt token ids as experiments.workloads.prompt_token_ids gives both other
    backends (decoded to text by `tokenizer` when one is given), max_tokens = the workload's output length."""
    from experiments.workloads import prompt_token_ids
    out = []
    for spec in specs:
        ids = prompt_token_ids(spec, vocab_size, seed)
        prompt = ids if tokenizer is None else tokenizer.decode(ids)
        out.append(HttpRequest(int(spec.request_id), float(spec.arrival_time_s), prompt, int(spec.num_output_tokens),
                               num_prompt_tokens=len(ids)))
    return out


def requests_frame(outcome: ReplayOutcome, specs: dict | None = None) -> pd.DataFrame:
    """The request table of a replay: REQUEST_COLUMNS (derived as engine.core.recorder does) + HTTP_COLUMNS.
    specs: request_id -> RequestSpec, the source of priority, tenant and SLO targets (None: the defaults)."""
    from engine.core.recorder import REQUEST_COLUMNS, slo_met_columns
    from engine.core.requests import DEFAULT_TENANT
    recs = outcome.records
    given = [(specs or {}).get(r.request_id) for r in recs]
    nan = float("nan")
    arrival = np.array([r.arrival_time_s for r in recs], dtype=np.float64)
    first = np.array([r.token_times_s[0] if r.token_times_s else nan for r in recs], dtype=np.float64)
    finish = np.array([r.finish_time_s if r.ok else nan for r in recs], dtype=np.float64)
    nout = np.array([r.num_output_tokens for r in recs], dtype=np.int64)
    ttft, e2e = first - arrival, finish - arrival
    with np.errstate(divide="ignore", invalid="ignore"):
        tpot = np.where(nout > 1, (e2e - ttft) / np.maximum(nout - 1, 1), np.nan)
    zeros = np.zeros(len(recs), dtype=np.int64)
    ttft_slo, tpot_slo = (np.array([nan if g is None or getattr(g, k) is None else float(getattr(g, k)) for g in given],
                                   dtype=np.float64) for k in ("ttft_slo_s", "tpot_slo_s"))
    cols = {
        "request_id": [r.request_id for r in recs],
        "status": ["finished" if r.ok else "rejected" if r.rejected else "failed" for r in recs],
        "reject_reason": [r.error if r.rejected else None for r in recs],
        "num_prompt_tokens": np.array([r.num_prompt_tokens for r in recs], dtype=np.int64),
        "num_output_tokens": nout, "max_output_tokens": np.array([r.max_tokens for r in recs], dtype=np.int64),
        "arrival_time_s": arrival, "first_scheduled_time_s": np.full(len(recs), nan), "first_token_time_s": first,
        "finish_time_s": finish, "ttft_s": ttft, "tpot_s": tpot, "e2e_s": e2e,
        "queueing_delay_s": np.full(len(recs), nan), "num_preemptions": zeros, "num_swaps": zeros.copy(),
        "num_cached_tokens": np.array([r.num_cached_tokens for r in recs], dtype=np.int64),
        "priority": np.array([0 if g is None else int(g.priority) for g in given], dtype=np.int64),
        "tenant": [DEFAULT_TENANT if g is None else g.tenant for g in given],
        "ttft_slo_s": ttft_slo, "tpot_slo_s": tpot_slo,
        **slo_met_columns(ttft, tpot, ttft_slo, tpot_slo, nout),
        "replica": zeros.copy(),
        "send_time_s": np.array([nan if r.send_time_s is None else r.send_time_s for r in recs], dtype=np.float64),
        "finish_reason": [r.finish_reason for r in recs],
        "num_token_chunks": np.array([r.num_chunks for r in recs], dtype=np.int64),
        "usage_reported": np.array([r.usage is not None for r in recs], dtype=bool),
        "http_status": pd.array([r.http_status for r in recs], dtype="Int64"),
        "error": [r.error for r in recs],
    }
    return pd.DataFrame(cols, columns=list(REQUEST_COLUMNS) + list(HTTP_COLUMNS))


def token_times_frame(outcome: ReplayOutcome) -> pd.DataFrame:
    """(request_id, token_index, time_s): one row per output token (its chunk's arrival), as
    Recorder.token_times_frame."""
    ids, idx, times = [], [], []
    for r in outcome.records:
        ids.extend([r.request_id] * len(r.token_times_s))
        idx.extend(range(len(r.token_times_s)))
        times.extend(r.token_times_s)
    return pd.DataFrame({"request_id": ids, "token_index": np.asarray(idx, dtype=np.int64),
                         "time_s": np.asarray(times, dtype=np.float64)})


def empty_steps_frame() -> pd.DataFrame:
    from engine.core.recorder import Recorder
    return Recorder().steps_frame()


def replay_meta(outcome: ReplayOutcome, target: HttpTarget) -> dict:
    """Facts about a replay for summary.json meta: failures, outputs shorter than asked, client lateness."""
    recs = outcome.records
    late = [r.send_time_s - r.arrival_time_s for r in recs if r.send_time_s is not None]
    failed = [r for r in recs if not r.ok and not r.rejected]
    short = [r for r in recs if r.ok and r.num_output_tokens != r.max_tokens]
    return {"backend": "http", "url": target.url, "served_model": outcome.model, "prompt_format": target.prompt_format,
            "num_failed": len(failed), "first_errors": [f"request {r.request_id}: {r.error}" for r in failed[:5]],
            "num_output_length_mismatch": len(short),
            "num_usage_missing": sum(r.ok and r.usage is None for r in recs),
            "client_send_lateness_s_max": float(max(late)) if late else None,
            "client_send_lateness_s_p50": float(np.median(late)) if late else None,
            "wall_s": outcome.wall_s, "interrupted": outcome.interrupted}


def report_failures(meta: dict, out=None) -> None:
    """The failed requests (count and first errors) and outputs of another length, printed on `out` (stderr)."""
    out = out or sys.stderr
    if meta["num_failed"]:
        print(f"WARNING: {meta['num_failed']} requests failed against {meta['url']} (kept as status=failed with their "
              f"error): " + "; ".join(meta["first_errors"]), file=out, flush=True)
    if meta["num_output_length_mismatch"]:
        print(f"WARNING: {meta['num_output_length_mismatch']} requests got another output length than max_tokens "
              "(does the server honour ignore_eos?)", file=out, flush=True)
    if meta["prompt_format"] == "text":
        print("note: prompts were sent as text (backend.prompt=text): the server's own tokenization sets the prompt "
              "lengths (num_prompt_tokens against trace_num_prompt_tokens)", file=out, flush=True)


def check_sequential_sweep() -> None:
    """ValueError in a sweep whose launcher runs several jobs at once: they would load the one server together."""
    from hydra.core.hydra_config import HydraConfig
    from hydra.types import RunMode
    if not HydraConfig.initialized():
        return
    hc = HydraConfig.get()
    n_jobs = hc.launcher.get("n_jobs") if hc.launcher is not None else None
    if hc.mode == RunMode.MULTIRUN and n_jobs is not None and int(n_jobs) != 1:
        raise ValueError(f"backend=http in a sweep runs its jobs one at a time (hydra.launcher.n_jobs={n_jobs} would "
                         "send several runs to the server at once): add hydra/launcher=basic or "
                         "hydra.launcher.n_jobs=1")


def run_http(cfg, desc: str = "http"):
    """The Hydra entry point's http backend (experiments/run.py); returns experiments.runner_sim.RunResult."""
    from omegaconf import OmegaConf

    from experiments.config import ModelConfig
    from experiments.runner_sim import RunResult, build_workload, check_input, model_max_model_len, offered_rate_rps
    from experiments.workloads.changes import add_input_columns

    # Hydra's job logging is at INFO: httpx would log every request of the replay.
    for name in ("httpx", "httpcore"):
        logging.getLogger(name).setLevel(logging.WARNING)
    check_sequential_sweep()
    b = cfg.backend
    target = target_of(b)
    tokenizer = load_tokenizer(b.get("tokenizer")) if target.prompt_format == "text" else None
    if int(cfg.num_replicas) != 1:
        raise ValueError(f"backend=http replays against one server; got num_replicas={cfg.num_replicas}")
    model = ModelConfig(**OmegaConf.to_container(cfg.model, resolve=True)).to_spec()
    server_len = server_max_model_len(target)
    max_len, max_len_source = replay_max_model_len(cfg, model_max_model_len(cfg, model), server_len)
    wl = build_workload(cfg, max_len)
    in_meta = check_input(wl, max_len, model.max_model_len, server_len)
    specs = wl.specs()
    reqs = http_requests(specs, model.vocab_size, int(cfg.seed), tokenizer)
    outcome = replay(reqs, target, max_wall_s=None if b.get("max_wall_s") is None else float(b.max_wall_s),
                     prompt_vocabulary=f"{_model_choice(model.name)}, vocab_size {model.vocab_size}")
    server = outcome.server_facts
    req = requests_frame(outcome, {int(s.request_id): s for s in specs})
    req = add_input_columns(req, wl)
    meta = {**replay_meta(outcome, target), "model": outcome.model, "prompt_vocabulary_of": model.name,
            "hardware": f"server at {target.url}",
            "num_replicas": 1, "server": server,
            "num_kvcache_blocks": server.get("num_kvcache_blocks"), "num_cpu_blocks": server.get("num_cpu_blocks"),
            "cpu_cache_num_blocks": server.get("cpu_cache_num_blocks"),
            "request_rate_rps": offered_rate_rps(cfg, wl), "num_unfinished": 0, **in_meta,
            "max_model_len": int(max_len), "max_model_len_source": max_len_source,
            "max_num_batched_tokens": server.get("max_num_batched_tokens"),
            "max_num_batched_tokens_source": "the server's" if server.get("max_num_batched_tokens") is not None
            else "set by the server"}
    report_failures(meta)
    token_times = token_times_frame(outcome) if cfg.record_token_times else None
    return RunResult(req, empty_steps_frame(), token_times, meta, complete=not outcome.interrupted)


def replay_max_model_len(cfg, model_len: tuple[int, str], server_len: int | None) -> tuple[int, str]:
    """(max_model_len, where it comes from) of a replay: the model's (model_len, runner_sim.model_max_model_len)
    bounded by the server's own where its /v1/models gives one, as the engine backend takes the engine's: a
    longer request would only come back as an HTTP 400."""
    max_len, source = model_len
    if server_len is None or server_len >= max_len:
        return max_len, source
    if cfg.get("max_model_len") is not None:
        raise ValueError(f"max_model_len={max_len} exceeds the server's {server_len} (its /v1/models); set "
                         f"max_model_len <= {server_len}, or leave it null (the server's)")
    return server_len, "the server's"


def _model_choice(name: str) -> str:
    """`model=<the config group option>` as the command line wrote it (Hydra's choice), else the entry's name."""
    from hydra.core.hydra_config import HydraConfig
    choice = HydraConfig.get().runtime.choices.get("model") if HydraConfig.initialized() else None
    return f"model={choice}" if choice else f"model.name={name}"


class HttpReplayer:
    """Stands in for experiments.runner_engine.EngineReplayer in experiments.validate: the real side is a server.

    The server runs its own scheduler and KV cache, so the simulated side needs what the server was started with:
    `config` (an EngineRunConfig: model_path = a folder holding the checkpoint's config.json, block size, limits),
    num_kvcache_blocks, num_cpu_blocks and max_model_len. `replay(specs, policy)` ignores `policy` (the server's is
    the one it was started with) and returns experiments.runner_engine.RunResult with an empty step table."""

    def __init__(self, target: HttpTarget, config, vocab_size: int, max_model_len: int, num_kvcache_blocks: int,
                 num_cpu_blocks: int = 0):
        self.target, self.config = target, config
        self.vocab_size, self.max_model_len = int(vocab_size), int(max_model_len)
        self.num_kvcache_blocks, self.num_cpu_blocks = int(num_kvcache_blocks), int(num_cpu_blocks)

    def scheduler_config(self, num_kvcache_blocks: int | None = None, num_cpu_blocks: int | None = None):
        from experiments.runner_engine import scheduler_config
        kv = self.num_kvcache_blocks if num_kvcache_blocks is None else int(num_kvcache_blocks)
        cpu = self.num_cpu_blocks if num_cpu_blocks is None else int(num_cpu_blocks)
        return scheduler_config(kv, cpu, self.config, self.max_model_len)

    def replay(self, requests, policy=None, *, max_wall_s: float | None = None, **_):
        from experiments.runner_engine import RunResult
        specs = list(requests)
        outcome = replay(http_requests(specs, self.vocab_size, self.config.seed), self.target, max_wall_s=max_wall_s)
        meta = replay_meta(outcome, self.target)
        report_failures(meta)
        meta["policy"] = policy if isinstance(policy, str) else getattr(policy, "name", None)
        return RunResult(requests_frame(outcome, {int(s.request_id): s for s in specs}),
                         empty_steps_frame(), meta)
