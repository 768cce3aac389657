"""benchmarks/http_floor.py: both bare servers answer the replay's client with a first event, and the figures and the
goal's HTTP budget land in the JSON."""
import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_both_bare_servers_time_a_first_event_against_the_budget(tmp_path):
    out = tmp_path / "floor.json"
    run = subprocess.run([sys.executable, "benchmarks/http_floor.py", "--requests", "6", "--warmup", "1",
                          "--prompt-len", "50", "--gap-s", "0", "--inproc-ttft-ms", "5", "--out", str(out)],
                         cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stdout[-2000:] + run.stderr[-2000:]
    result = json.loads(out.read_text())
    assert abs(result["http_budget_us"] - 250.0) < 1e-6
    for mode in ("asgi", "asgi_proc"):
        r = result[mode]
        assert r["num_requests"] == 6
        assert 0 < r["ttft_us_min"] <= r["ttft_us_p50"] <= r["ttft_us_p90"]
        assert abs(r["p50_over_budget"] - r["ttft_us_p50"] / result["http_budget_us"]) < 1e-9
        assert f"{mode:10s} TTFT p50" in run.stdout


def test_bad_request_count_is_one_line_error():
    run = subprocess.run([sys.executable, "benchmarks/http_floor.py", "--requests", "0"], cwd=ROOT,
                         capture_output=True, text=True, timeout=60)
    assert run.returncode == 2 and "--requests must be at least 1" in run.stderr
