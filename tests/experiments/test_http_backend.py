"""backend=http against a stub OpenAI-compatible server on loopback: what is sent, how it is timed, what fails."""
import json

import numpy as np
import pandas as pd
import pytest

from experiments.http_replay import HttpBackendError, HttpRequest, HttpTarget, replay
from experiments.runner_http import HTTP_COLUMNS, requests_frame, token_times_frame
from experiments.workloads import RequestSpec, prompt_token_ids
from tests.experiments.cli import QUIET, error_line, in_tmp, servelab  # noqa: F401
from tests.experiments.openai_stub import DROP_TOKENS, FAIL_TOKENS, StubServer, free_port

TTFT_S, ITL_S = 0.15, 0.03
# The client is in the same process as the stub (another thread): on a busy 2-core machine a chunk can reach the
# client this late after the server sent it (30 ms was exceeded under load). The server's delays stay well above
# it, so every timing check still tells a right capture from a wrong one.
SLACK_S = 0.08


@pytest.fixture(scope="module")
def stub():
    with StubServer(ttft_s=TTFT_S, itl_s=ITL_S) as s:
        yield s


def _requests(n, max_tokens=4, gap_s=0.03):
    return [HttpRequest(i, gap_s * i, [3 * i + p for p in range(5 + i)], max_tokens) for i in range(n)]


def test_timing_capture_matches_the_servers_send_times(stub):
    first = len(stub.received)
    out = replay(_requests(6), HttpTarget(stub.url))
    df = requests_frame(out)
    assert (df["status"] == "finished").all() and out.num_failed == 0
    for k, rec in enumerate(out.records):
        sent = np.array(stub.sent[first + 1 + k]) - out.t0_perf_s        # the server's clock, on the replay clock
        got = np.array(rec.token_times_s)
        assert len(got) == len(sent) == 4
        lag = got - sent
        assert (lag >= 0).all() and (lag < SLACK_S).all(), lag
        # sent at its arrival time; the server got it then and answered TTFT_S later
        assert 0 <= rec.send_time_s - rec.arrival_time_s < SLACK_S
        assert stub.arrived[first + 1 + k] - out.t0_perf_s == pytest.approx(rec.arrival_time_s, abs=SLACK_S)
    row = df.iloc[0]
    assert row["ttft_s"] == pytest.approx(TTFT_S, abs=SLACK_S)
    assert row["e2e_s"] == pytest.approx(TTFT_S + 3 * ITL_S, abs=SLACK_S)
    assert row["finish_time_s"] == pytest.approx(out.records[0].token_times_s[-1])
    assert row["tpot_s"] == pytest.approx((row["e2e_s"] - row["ttft_s"]) / 3)
    assert list(df["num_output_tokens"]) == [4] * 6 and list(df["num_prompt_tokens"]) == [5 + i for i in range(6)]
    assert df["usage_reported"].all() and list(df["finish_reason"]) == ["length"] * 6
    tt = token_times_frame(out)
    assert len(tt) == 24 and list(tt["token_index"][:4]) == [0, 1, 2, 3]


def test_request_body_token_ids_ignore_eos_and_usage(stub):
    first = len(stub.received)
    replay(_requests(2, max_tokens=3), HttpTarget(stub.url, temperature=0.0))
    bodies = stub.received[first:]
    probe, sent = bodies[0], bodies[1:]
    assert probe["max_tokens"] == 1 and not probe.get("stream")          # the check before the clock starts
    assert [b["prompt"] for b in sent] == [[0, 1, 2, 3, 4], [3, 4, 5, 6, 7, 8]]
    for b in sent:
        assert b["max_tokens"] == 3 and b["ignore_eos"] is True and b["stream"] is True
        assert b["stream_options"] == {"include_usage": True} and b["model"] == "stub-model"
        assert b["temperature"] == 0.0


def test_failed_requests_are_kept_counted_and_explained(stub):
    reqs = _requests(4)
    reqs[1].max_tokens, reqs[2].max_tokens = FAIL_TOKENS, DROP_TOKENS
    out = replay(reqs, HttpTarget(stub.url))
    df = requests_frame(out)
    assert len(df) == 4 and out.num_failed == 2
    assert list(df["status"]) == ["finished", "failed", "failed", "finished"]
    assert df.loc[1, "error"] == "HTTP 500: stub failure on purpose" and df.loc[1, "http_status"] == 500
    assert "ClientPayloadError" in df.loc[2, "error"] and df.loc[2, "num_token_chunks"] == 2     # aiohttp: cut short
    assert np.isnan(df.loc[2, "finish_time_s"]) and not np.isnan(df.loc[2, "first_token_time_s"])
    assert set(HTTP_COLUMNS) <= set(df.columns)


def test_unreachable_server_is_one_clear_error():
    with pytest.raises(HttpBackendError, match=r"cannot reach the server at backend.url=http://127.0.0.1:\d+ .*"
                                               r"start it"):
        replay(_requests(1), HttpTarget(f"http://127.0.0.1:{free_port()}", connect_timeout_s=2))


def test_wrong_model_name_lists_the_served_ones(stub):
    with pytest.raises(HttpBackendError, match=r"backend.model='nope' is not served .*it serves: stub-model\); "
                                               r"set backend.model=stub-model"):
        replay(_requests(1), HttpTarget(stub.url, model="nope"))


def test_a_server_refusing_token_ids_says_so_before_the_replay():
    with StubServer(token_ids=False) as s:
        with pytest.raises(HttpBackendError, match=r"refused a token-id prompt .*HTTP 400: prompt must be a string.*"
                                                   r"backend.prompt=text"):
            replay(_requests(3), HttpTarget(s.url))
        assert len(s.received) == 1             # only the check: nothing was replayed


def test_bad_target_values_name_the_field():
    with pytest.raises(HttpBackendError, match="backend.url must start with http"):
        HttpTarget("localhost:8000")
    with pytest.raises(HttpBackendError, match="backend.prompt must be one of"):
        HttpTarget("http://x", prompt_format="ids")


# -- through the servelab command -------------------------------------------------------------------------------------
SMALL_HTTP = ["backend=http", "experiment=smoke", "workload.num_requests=5", "workload.arrival.rate_rps=50",
              "workload/output_len=fixed", "workload.output_len.tokens=3", "workload/prompt_len=fixed",
              "workload.prompt_len.tokens=12", *QUIET]


def test_servelab_backend_http_writes_the_same_tables(stub, in_tmp, monkeypatch, capsys):
    first = len(stub.received)
    code, out, err = servelab(monkeypatch, capsys, *SMALL_HTTP, f"backend.url={stub.url}", "hydra.run.dir=run",
                              "print_summary=true", "record_token_times=true")
    assert code == 0, err
    req = pd.read_parquet(in_tmp / "run" / "requests.parquet")
    summary = json.loads((in_tmp / "run" / "summary.json").read_text())
    assert len(req) == 5 and (req["status"] == "finished").all()
    assert {"input_change", "source_line", "trace_num_prompt_tokens", "error", "send_time_s"} <= set(req.columns)
    assert summary["metrics"]["num_finished"] == 5 and summary["meta"]["backend"] == "http"
    assert summary["meta"]["served_model"] == "stub-model" and summary["meta"]["num_failed"] == 0
    assert summary["metrics"]["ttft_s_p50"] == pytest.approx(TTFT_S, abs=SLACK_S)
    assert "itl_s_p50" in summary["metrics"]
    # the prompts are the simulator's: token ids of the model= entry's vocabulary (Qwen3-0.6B's), from the root seed
    specs = [RequestSpec(int(r.request_id), float(r.arrival_time_s), 12, 3) for r in req.itertuples()]
    sent = {tuple(b["prompt"]) for b in stub.received[first + 1:]}
    assert sent == {tuple(prompt_token_ids(s, 151936, 0)) for s in specs}
    assert "finished / rejected" in out


def test_servelab_backend_http_failures_are_rows_and_a_warning(stub, in_tmp, monkeypatch, capsys):
    code, out, err = servelab(monkeypatch, capsys, *SMALL_HTTP, f"backend.url={stub.url}", "hydra.run.dir=run",
                              f"workload.output_len.tokens={FAIL_TOKENS}")
    assert code == 0, err
    req = pd.read_parquet(in_tmp / "run" / "requests.parquet")
    assert len(req) == 5 and (req["status"] == "failed").all()
    assert "WARNING: 5 requests failed against" in err and "HTTP 500: stub failure on purpose" in err
    summary = json.loads((in_tmp / "run" / "summary.json").read_text())
    assert summary["meta"]["num_failed"] == 5 and summary["metrics"]["num_finished"] == 0


def test_servelab_backend_http_user_errors_are_one_line(stub, in_tmp, monkeypatch, capsys):
    line = error_line(monkeypatch, capsys, *SMALL_HTTP, f"backend.url=http://127.0.0.1:{free_port()}")
    assert "cannot reach the server" in line
    line = error_line(monkeypatch, capsys, *SMALL_HTTP, f"backend.url={stub.url}", "backend.model=other")
    assert "backend.model='other' is not served" in line
    line = error_line(monkeypatch, capsys, *SMALL_HTTP, f"backend.url={stub.url}", "backend.prompt=text")
    assert "backend.prompt=text needs backend.tokenizer=PATH" in line
    line = error_line(monkeypatch, capsys, *SMALL_HTTP, f"backend.url={stub.url}", "backend.urll=x")
    assert "unknown key backend.urll" in line


def test_text_prompts_when_told(in_tmp, monkeypatch, capsys):
    pytest.importorskip("transformers")
    from tests.engine.tiny_model import make_tiny_tokenizer
    make_tiny_tokenizer(in_tmp / "tok")
    with StubServer(token_ids=False) as s:
        code, out, err = servelab(monkeypatch, capsys, *SMALL_HTTP, f"backend.url={s.url}", "hydra.run.dir=run",
                                  "backend.prompt=text", f"backend.tokenizer={in_tmp / 'tok'}",
                                  "model.vocab_size=512")
        assert code == 0, err
        texts = [b["prompt"] for b in s.received[1:]]
    assert all(isinstance(t, str) and len(t.split()) == 12 for t in texts)
    summary = json.loads((in_tmp / "run" / "summary.json").read_text())
    assert summary["meta"]["prompt_format"] == "text" and summary["metrics"]["num_finished"] == 5
    assert "prompts were sent as text" in err


# -- experiments.validate with a server as its real side --------------------------------------------------------------
def test_validate_takes_a_url_as_its_real_side(stub, tmp_path, capsys):
    from experiments import validate
    from tests.engine.tiny_model import TINY
    ckpt = tmp_path / "ckpt"            # the simulated side reads the served checkpoint's config.json only
    ckpt.mkdir()
    (ckpt / "config.json").write_text(json.dumps({
        "architectures": ["Qwen3ForCausalLM"], "model_type": "qwen3", "hidden_size": TINY["hidden_size"],
        "intermediate_size": TINY["intermediate_size"], "num_hidden_layers": TINY["num_hidden_layers"],
        "num_attention_heads": TINY["num_attention_heads"], "num_key_value_heads": TINY["num_key_value_heads"],
        "head_dim": TINY["head_dim"], "vocab_size": TINY["vocab_size"],
        "max_position_embeddings": TINY["max_position_embeddings"], "torch_dtype": "float32"}))
    first = len(stub.received)
    assert validate.main(["--real-url", stub.url, "--model", str(ckpt), "--num-kvcache-blocks", "64",
                          "--max-model-len", "256", "--num-requests", "6", "--rate-rps", "40", "--prompt-len", "8:16",
                          "--output-len", "3:5", "--out-dir", str(tmp_path), "--name", "url"]) == 0
    report = json.loads((tmp_path / "validation_url.json").read_text())
    assert report["real_side"] == f"the server at {stub.url}, replayed over HTTP"
    entry = report["policies"]["vllm"]
    assert entry["real"]["summary"]["num_finished"] == 6 and entry["real"]["info"]["num_failed"] == 0
    sim = entry["sims"]["roofline"]
    assert sim["join"] == {"num_real": 6, "num_sim": 6, "num_joined": 6, "num_finished_both": 6, "one_to_one": True}
    assert sim["step_time"] is None                 # a server's steps are not seen over HTTP
    assert all(max(b["prompt"]) < TINY["vocab_size"] for b in stub.received[first + 1:])


def test_validate_with_a_url_names_what_it_needs(stub, tmp_path):
    from experiments import validate
    with pytest.raises(ValueError, match="--real-url needs --num-kvcache-blocks, --max-model-len"):
        validate.main(["--real-url", stub.url, "--model", str(tmp_path), "--out-dir", str(tmp_path)])
    with pytest.raises(ValueError, match="the server runs one policy"):
        validate.main(["--real-url", stub.url, "--model", str(tmp_path), "--num-kvcache-blocks", "8",
                       "--max-model-len", "64", "--policies", "vllm,fcfs", "--out-dir", str(tmp_path)])


def test_ctrl_c_keeps_what_the_client_saw(stub):
    import os
    import signal
    import threading
    reqs = [HttpRequest(i, 0.25 * i, [1, 2, 3], 2) for i in range(40)]      # 10 s of arrivals
    timer = threading.Timer(1.0, lambda: os.kill(os.getpid(), signal.SIGINT))
    timer.start()
    try:
        out = replay(reqs, HttpTarget(stub.url))
    finally:
        timer.cancel()
    df = requests_frame(out)
    assert out.interrupted and len(df) == 40
    done = df[df["status"] == "finished"]
    assert 2 <= len(done) <= 6 and list(done["request_id"]) == list(range(len(done)))
    assert set(df.loc[df["status"] == "failed", "error"]) == {"interrupted (Ctrl-C) before it finished"}


def test_token_counts_without_token_ids_in_the_chunks():
    with StubServer(ttft_s=0.01, itl_s=0.002, token_ids_field=False) as s:
        out = replay(_requests(2, max_tokens=5), HttpTarget(s.url))
        assert all(b.get("return_token_ids") is True for b in s.received)
    # one token per chunk when the server names none
    assert [len(r.token_times_s) for r in out.records] == [5, 5] and [r.num_chunks for r in out.records] == [5, 5]
    with StubServer(ttft_s=0.01, itl_s=0.002) as s:
        replay(_requests(1, max_tokens=2), HttpTarget(s.url, return_token_ids=False))
        assert all("return_token_ids" not in b for b in s.received)


def test_a_url_without_the_api_says_so(stub):
    with pytest.raises(HttpBackendError, match=r"no OpenAI API at http://127.0.0.1:\d+/api/v1 \(GET /models: HTTP 404"):
        replay(_requests(1), HttpTarget(stub.url + "/api"))
    with pytest.raises(HttpBackendError, match=r"no OpenAI API .*\(POST /completions: HTTP 404"):
        replay(_requests(1), HttpTarget(stub.url + "/api", model="stub-model"))


def test_a_sweep_runs_one_job_at_a_time_in_folders_named_without_the_url(stub, in_tmp, monkeypatch, capfd):
    rates = ["-m", *SMALL_HTTP, f"backend.url={stub.url}", "workload.arrival.rate_rps=40,50",
             f"hydra.sweep.dir={in_tmp / 'sw'}"]
    # the job's error comes from a joblib worker process: read the file descriptors
    code, _, err = servelab(monkeypatch, capfd, *rates, "hydra/launcher=local", "hydra.launcher.n_jobs=2")
    assert code == 2 and "error: backend=http in a sweep runs its jobs one at a time" in err
    assert "hydra/launcher=basic" in err and not list((in_tmp / "sw").rglob("summary.json"))
    code, _, err = servelab(monkeypatch, capfd, *rates, "hydra/launcher=basic")
    assert code == 0, err
    jobs = sorted(p.parent.relative_to(in_tmp / "sw") for p in (in_tmp / "sw").rglob("summary.json"))
    assert len(jobs) == 2 and not any("backend.url" in str(j) or "127.0.0.1" in str(j) for j in jobs)


def test_backend_http_summary_says_what_the_server_sets(stub, in_tmp, monkeypatch, capsys):
    """A server that tells nothing of its scheduler (not servelab-serve): the summary says it sets them, not None
    and not the run's own scheduler= / eviction= defaults."""
    code, out, err = servelab(monkeypatch, capsys, *SMALL_HTTP, f"backend.url={stub.url}", "hydra.run.dir=run",
                              "print_summary=true")
    assert code == 0, err
    lines = {ln.split("  ")[0]: ln for ln in out.splitlines()}
    assert lines["setup"].endswith("scheduler and eviction set by the server"), lines["setup"]
    assert lines["KV cache"].endswith("set by the server") and "None" not in lines["KV cache"]
    assert lines["limits"].endswith("max_num_batched_tokens set by the server"), lines["limits"]
    summary = json.loads((in_tmp / "run" / "summary.json").read_text())
    assert summary["meta"]["server"] == {} and summary["meta"]["num_kvcache_blocks"] is None


def test_a_vllm_style_vocabulary_error_gets_the_model_fix():
    from experiments.http_replay import _outside_vocabulary, _vocabulary_fix
    text = '{"error": {"message": "Token id 98401 is out of vocabulary", "type": "BadRequestError"}}'
    assert _outside_vocabulary(text) and not _outside_vocabulary('{"error": {"message": "prompt too long"}}')
    fix = _vocabulary_fix(text, {}, "model=qwen3_8b, vocab_size 151936")
    assert "model=qwen3_8b, vocab_size 151936" in fix and "model.vocab_size=<the server's vocabulary size>" in fix
    assert "model.vocab_size=32000" in _vocabulary_fix(text, {"vocab_size": 32000}, None)


def test_max_model_len_is_the_servers_and_the_warning_names_it(in_tmp, monkeypatch, capsys):
    """A server that reports its max_model_len (servelab-serve, vLLM) bounds the run's: the workload is clipped to it,
    and the loss WARNING names the server's limit, not the model entry's 40960-token window (raising max_model_len
    past the server's would only get HTTP 400s)."""
    long = [*SMALL_HTTP, "workload.prompt_len.tokens=12", "workload.output_len.tokens=8", "print_summary=true"]
    with StubServer(ttft_s=0.01, itl_s=0.001, max_model_len=16) as s:
        code, out, err = servelab(monkeypatch, capsys, *long, f"backend.url={s.url}", "hydra.run.dir=a")
        assert code == 0, err
        assert "max_model_len 16 (the server's)" in out and "5 clipped to max_model_len=16" in err
        assert "start the server with a longer max_model_len (its /v1/models says 16)" in err
        assert "the model's limit" not in err
        code, out, err = servelab(monkeypatch, capsys, *long, f"backend.url={s.url}", "hydra.run.dir=b",
                                  "max_model_len=14")
        assert code == 0, err
        assert "raise max_model_len (up to 16, the server's limit)" in err and "the model's limit" not in err
        line = error_line(monkeypatch, capsys, *long, f"backend.url={s.url}", "max_model_len=100")
        assert "max_model_len=100 exceeds the server's 16" in line and "max_model_len <= 16" in line
