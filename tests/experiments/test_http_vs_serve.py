"""backend=http and the load generator against servelab-serve itself (tiny CPU checkpoint, loopback)."""
import importlib.util
import json
from pathlib import Path

import pandas as pd
import pytest

pytest.importorskip("torch")
pytest.importorskip("fastapi")

from experiments.http_replay import HttpTarget, replay  # noqa: E402
from experiments.runner_http import http_requests, requests_frame  # noqa: E402
from experiments.workloads import Poisson, Uniform, prompt_token_ids, synthetic_workload  # noqa: E402
from tests.experiments.cli import QUIET, in_tmp, servelab  # noqa: E402, F401
from tests.experiments.serve.server import running_server  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
VOCAB = 512


@pytest.fixture(scope="module")
def srv(tmp_path_factory):
    from tests.engine.tiny_model import make_tiny_qwen3
    from tests.experiments.byte_tokenizer import make_byte_tokenizer
    ckpt = tmp_path_factory.mktemp("ckpt_bytes")
    make_tiny_qwen3(ckpt)
    make_byte_tokenizer(ckpt, vocab_size=VOCAB)     # decodes every id the model samples; encodes any text
    with running_server(str(ckpt), num_kvcache_blocks=256, max_model_len=256, max_num_seqs=32) as s:
        yield s


def test_replay_against_servelab_serve_runs_every_request_to_its_length(srv):
    wl = synthetic_workload(12, Poisson(40.0), Uniform(8, 40), Uniform(2, 12), seed=3, max_model_len=256)
    specs = wl.specs()
    out = replay(http_requests(specs, VOCAB, 0), HttpTarget(srv.base, temperature=0.0))
    df = requests_frame(out).set_index("request_id")
    assert out.model == "tiny" and out.num_failed == 0, [r.error for r in out.records]
    for s in specs:
        row = df.loc[s.request_id]
        assert row["status"] == "finished" and row["finish_reason"] == "length"
        assert row["num_output_tokens"] == s.num_output_tokens == row["max_output_tokens"]
        assert row["num_prompt_tokens"] == s.num_prompt_tokens and row["usage_reported"]
        # each token has its time, though a chunk may carry several (the server sends what a step left queued)
        rec = out.records[[r.request_id for r in out.records].index(s.request_id)]
        assert len(rec.token_times_s) == s.num_output_tokens >= row["num_token_chunks"] >= 1
        assert 0 < row["ttft_s"] <= row["e2e_s"]
    srv.wait_idle()
    assert srv.llm.scheduler.block_manager.num_used_blocks == 0


def test_servelab_backend_http_against_servelab_serve(srv, in_tmp, monkeypatch, capsys):
    code, out, err = servelab(monkeypatch, capsys, "backend=http", f"backend.url={srv.url}", "experiment=smoke",
                              "workload.num_requests=8", "workload.arrival.rate_rps=30", "workload/output_len=fixed",
                              "workload.output_len.tokens=4", "workload/prompt_len=uniform", "workload.prompt_len.lo=4",
                              "workload.prompt_len.hi=30", f"model.vocab_size={VOCAB}", "max_model_len=256",
                              "hydra.run.dir=run", *QUIET)
    assert code == 0, err
    req = pd.read_parquet(in_tmp / "run" / "requests.parquet")
    summary = json.loads((in_tmp / "run" / "summary.json").read_text())
    assert len(req) == 8 and (req["status"] == "finished").all() and (req["num_output_tokens"] == 4).all()
    assert summary["meta"]["served_model"] == "tiny" and summary["metrics"]["num_output_tokens"] == 32
    # the server got the simulator's prompt token ids: its usage counts them
    assert (req["num_prompt_tokens"] == req["trace_num_prompt_tokens"]).all()
    assert prompt_token_ids  # same function as the other backends (experiments.runner_http.http_requests)


@pytest.mark.slow
def test_guidellm_against_servelab_serve(srv, tmp_path):
    pytest.importorskip("guidellm")
    spec = importlib.util.spec_from_file_location("loadgen", ROOT / "benchmarks" / "loadgen.py")
    loadgen = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(loadgen)
    rc = loadgen.main(["--url", srv.base, "--tokenizer", str(srv.llm.config.model_path), "--rate-rps", "10",
                       "--num-requests", "8", "--prompt-tokens", "32", "--output-tokens", "6", "--max-seconds", "40",
                       "--workers", "1", "--out", str(tmp_path)])
    summary = json.loads((tmp_path / "loadgen.json").read_text())
    assert rc == 0, (tmp_path / "guidellm.log").read_text()[-3000:]
    assert (summary["successful"], summary["errored"], summary["incomplete"]) == (8, 0, 0)
    assert summary["output_tokens_mean"] == 6


def test_a_server_with_an_api_key(srv, tmp_path):
    from experiments.http_replay import HttpBackendError, HttpRequest
    from experiments.serve.config import ServeOptions
    with running_server(srv.llm.config.model_path, serve_options=ServeOptions(api_key="sesame"), num_kvcache_blocks=64,
                        max_model_len=128) as keyed:
        reqs = [HttpRequest(0, 0.0, [1, 2, 3], 2)]
        with pytest.raises(HttpBackendError, match=r"refused the request \(HTTP 401: .*\); give its key as "
                                                   r"backend.api_key"):
            replay(reqs, HttpTarget(keyed.base))
        out = replay(reqs, HttpTarget(keyed.base, api_key="sesame"))
    assert out.num_failed == 0 and out.records[0].num_output_tokens == 2


def test_backend_http_records_prefix_hits_and_the_servers_setup(srv, in_tmp, monkeypatch, capsys):
    # two requests of one 40-token prompt (one shared Mooncake block), the second after the first finished: it finds
    # two full blocks of 16 in the server's prefix cache
    trace = in_tmp / "shared.jsonl"
    trace.write_text("".join(json.dumps({"timestamp": t, "input_length": 40, "output_length": 2, "hash_ids": [7]})
                             + "\n" for t in (0, 1500)))
    code, out, err = servelab(monkeypatch, capsys, "backend=http", f"backend.url={srv.url}", "workload=mooncake",
                              f"workload.path={trace}", f"model.vocab_size={VOCAB}", "max_model_len=256",
                              "hydra.run.dir=run", "progress=false", "plots=false", "print_summary=true")
    assert code == 0, err
    req = pd.read_parquet(in_tmp / "run" / "requests.parquet").sort_values("arrival_time_s")
    assert list(req["num_cached_tokens"]) == [0, 32] and req["usage_reported"].all()
    summary = json.loads((in_tmp / "run" / "summary.json").read_text())
    assert summary["metrics"]["prefix_cache_hit_rate"] == pytest.approx(32 / 80)
    facts = summary["meta"]["server"]
    assert (facts["scheduler"], facts["eviction"], facts["num_kvcache_blocks"]) == ("vllm", "lru", 256)
    lines = {ln.split("  ")[0]: ln for ln in out.splitlines()}
    assert "scheduler=vllm, eviction=lru (the server's)" in lines["setup"]
    assert "256 blocks (+" in lines["KV cache"] and "None" not in lines["KV cache"]
    assert f"max_num_batched_tokens {facts['max_num_batched_tokens']} (the server's)" in lines["limits"]


def test_backend_http_prompts_outside_the_servers_vocabulary_name_the_model_fix(srv, in_tmp, monkeypatch, capsys):
    from tests.experiments.cli import error_line
    line = error_line(monkeypatch, capsys, "backend=http", f"backend.url={srv.url}", "experiment=smoke",
                      "model=qwen3_8b", "workload.num_requests=2", *QUIET,
                      # requests within the server's max_model_len: no clipping WARNING before the error
                      "workload/prompt_len=fixed", "workload.prompt_len.tokens=12", "workload/output_len=fixed",
                      "workload.output_len.tokens=3")
    assert "outside [0, 512)" in line and "backend.prompt=text" not in line
    assert "model=qwen3_8b, vocab_size 151936" in line and f"model.vocab_size={VOCAB}" in line, line
