"""Shutdown: SIGTERM lets in-flight requests finish within serve.shutdown_grace_s and exits 0; past the grace
they are aborted (a last chunk with finish_reason "abort") and their KV blocks freed."""
from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

pytest.importorskip("torch")
httpx = pytest.importorskip("httpx")
pytest.importorskip("fastapi")

from engine.core.sequence import SequenceStatus  # noqa: E402
from tests.experiments.serve.server import running_server  # noqa: E402

ROOT = Path(__file__).resolve().parents[3]


def start(ckpt, *overrides):
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    proc = subprocess.Popen([sys.executable, "-m", "experiments.serve", f"backend.model_path={ckpt}",
                             "backend.device=cpu", "serve.port=0", *overrides], cwd=ROOT, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    lines, deadline = [], time.monotonic() + 120
    while time.monotonic() < deadline:
        line = proc.stdout.readline()
        if not line:
            break
        lines.append(line)
        found = re.search(r"Uvicorn running on (http://127\.0\.0\.1:\d+)", line)
        if found:
            return proc, found.group(1), lines
    proc.kill()
    raise AssertionError("the server did not start:\n" + "".join(lines))


@pytest.mark.slow
def test_sigterm_lets_a_stream_finish_and_exits_0(ckpt):
    proc, base, log = start(ckpt, "num_kvcache_blocks=64", "max_model_len=512", "serve.shutdown_grace_s=60",
                            "scheduler=srpt", "eviction=lfu")
    try:
        assert any("scheduler srpt" in line for line in log), log
        assert httpx.get(f"{base}/health", timeout=30).status_code == 200
        body = {"prompt": [1, 2, 3], "max_tokens": 300, "ignore_eos": True, "stream": True,
                "stream_options": {"include_usage": True}}
        chunks = []
        with httpx.stream("POST", f"{base}/v1/completions", json=body, timeout=60) as r:
            for line in r.iter_lines():
                if line.startswith("data: "):
                    chunks.append(line)
                    if len(chunks) == 1:
                        proc.send_signal(signal.SIGTERM)
        assert chunks[-1] == "data: [DONE]" and '"finish_reason":"length"' in chunks[-3]
        assert '"completion_tokens":300' in chunks[-2]
        out, _ = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 0, "".join(log) + out
    assert "shut down" in out and "Traceback" not in out


def test_past_the_grace_in_flight_requests_are_aborted(ckpt, monkeypatch):
    with running_server(ckpt, grace_s=0) as srv:
        execute = srv.llm.runner.execute
        monkeypatch.setattr(srv.llm.runner, "execute", lambda batch: (time.sleep(0.01), execute(batch))[1])
        seqs = []
        submit = srv.llm.submit
        monkeypatch.setattr(srv.llm, "submit", lambda seq: (seqs.append(seq), submit(seq)))
        body = {"prompt": [1, 2, 3], "max_tokens": 100, "ignore_eos": True, "stream": True}
        ended = threading.Event()
        lines, failures = [], []

        def client():
            try:
                with httpx.stream("POST", f"{srv.url}/completions", json=body, timeout=30) as r:
                    lines.extend(line for line in r.iter_lines() if line)
            except httpx.HTTPError as e:
                failures.append(repr(e))    # the server closed the connection mid-stream
            ended.set()
        threading.Thread(target=client, daemon=True).start()
        while not seqs or seqs[0].num_output_tokens < 2:
            time.sleep(0.005)
        srv.stop()
        assert ended.wait(30)
        # the stream ends as a request does: a last chunk saying "abort", then [DONE]; not cut mid-body
        assert not failures and lines[-1] == "data: [DONE]" and '"finish_reason":"abort"' in lines[-2], (failures,
                                                                                                          lines[-3:])
        assert not srv.engine.alive
        (seq,) = seqs
        assert seq.status is SequenceStatus.ABORTED and seq.num_output_tokens < 100
        bm = srv.llm.scheduler.block_manager
        bm.check_invariants([])
        assert bm.num_used_blocks == 0 and not srv.llm._live
