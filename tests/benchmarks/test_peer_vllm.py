"""benchmarks/peer_vllm.py and peer_online.py on CPU with the tiny model: servelab's runs land, a vLLM that
does not import is recorded as that run's error (never raised), and no ratio is claimed without both sides."""
import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.skipif(importlib.util.find_spec("vllm") is not None, reason="vLLM imports here: the peer would run")
def test_servelab_side_lands_when_vllm_does_not_import(tmp_path):
    out = tmp_path / "peer.json"
    proc = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "peer_vllm.py"), "--preset", "tiny",
                           "--device", "cpu", "--num-requests", "3", "--min-len", "4", "--max-len", "12",
                           "--repeats", "1", "--out", str(out)], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    res = json.loads(out.read_text())
    ours, peer = res["runs"]
    assert ours["engine"] == "servelab" and ours["output_tokens"] == res["output_tokens"] > 0
    assert peer["engine"] == "vllm" and "No module named 'vllm'" in peer["error"]
    assert "servelab_over_vllm" not in res


@pytest.mark.skipif(importlib.util.find_spec("vllm") is not None, reason="vLLM imports here: the peer would run")
def test_online_peer_times_servelab_at_a_client(tmp_path):
    pytest.importorskip("zmq")
    from tests.helpers import trace_file
    trace = trace_file("AzureLLMInferenceTrace_conv.csv")
    out = tmp_path / "online.json"
    proc = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "peer_online.py"), "--trace", str(trace),
                           "--preset", "tiny", "--device", "cpu", "--max-requests", "6", "--rate-rps", "30",
                           "--max-model-len", "512", "--num-kvcache-blocks", "256", "--out", str(out)],
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    res = json.loads(out.read_text())
    ours, peer = res["runs"]
    assert ours["engine"] == "servelab" and ours["num_requests"] == 6
    assert 0 < ours["ttft_s_p50"] <= ours["e2e_s_p50"] and ours["output_throughput_tps"] > 0
    assert peer["engine"] == "vllm" and "No module named 'vllm'" in peer["error"]
    assert "servelab_over_vllm" not in res
