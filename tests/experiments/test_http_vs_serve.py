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
