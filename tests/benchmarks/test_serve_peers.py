"""benchmarks/serve_peers.py: servers replayed by the same client, side by side, and each over the reference."""
import importlib.util
import json
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def load():
    spec = importlib.util.spec_from_file_location("serve_peers", ROOT / "benchmarks" / "serve_peers.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def _run(folder: Path, ttft_p50: float, tps: float, tokens: int = 500) -> str:
    folder.mkdir(parents=True)
    metrics = {"num_requests": 10, "num_finished": 10, "num_output_tokens": tokens, "ttft_s_p50": ttft_p50,
               "ttft_s_p90": 2 * ttft_p50, "tpot_s_p50": 0.002, "tpot_s_p90": 0.003, "e2e_s_p50": 0.4,
               "e2e_s_p90": 0.8, "output_throughput_tps": tps, "request_throughput_rps": 5.0,
               "makespan_s": tokens / tps}
    (folder / "summary.json").write_text(json.dumps({"metrics": metrics, "meta": {"num_failed": 0}}))
    return str(folder)


def test_both_servers_and_the_ratios_over_the_reference(tmp_path, capsys):
    mod = load()
    lg = tmp_path / "loadgen_vllm.json"
    lg.write_text(json.dumps({"command": ["python", "-m", "guidellm"], "successful": 6, "ttft_ms_p50": 30.0}))
    out = tmp_path / "peers.json"
    rc = mod.main(["--http", f"servelab={_run(tmp_path / 's', 0.010, 1000.0)}",
                   "--http", f"vllm={_run(tmp_path / 'v', 0.025, 990.0)}", "--loadgen", f"vllm={lg}",
                   "--reference", "servelab", "--setting", "kv_blocks=16384", "--out", str(out)])
    assert rc == 0
    report = json.loads(out.read_text())
    assert report["reference"] == "servelab" and report["settings"] == {"kv_blocks": "16384"}
    assert report["servers"]["vllm"]["metrics"]["ttft_s_p90"] == pytest.approx(0.050)
    assert report["ratios_over_reference"]["vllm"]["ttft_s_p50"] == pytest.approx(2.5)
    assert report["ratios_over_reference"]["vllm"]["output_throughput_tps"] == pytest.approx(0.99)
    assert "servelab" not in report["ratios_over_reference"]
    assert report["servers"]["vllm"]["loadgen"] == {"command": "python -m guidellm", "successful": 6,
                                                    "ttft_ms_p50": 30.0}
    assert report["same_requests_and_output_tokens"] is True
    printed = capsys.readouterr().out
    assert "vllm: TTFT p50/p90 25.0/50.0 ms" in printed and "servelab: TTFT p50/p90 10.0/20.0 ms" in printed


def test_different_output_tokens_are_flagged(tmp_path):
    mod = load()
    out = tmp_path / "peers.json"
    mod.main(["--http", f"a={_run(tmp_path / 'a', 0.01, 1000.0, tokens=500)}",
              "--http", f"b={_run(tmp_path / 'b', 0.01, 1000.0, tokens=499)}", "--out", str(out)])
    assert json.loads(out.read_text())["same_requests_and_output_tokens"] is False


def test_a_skipped_server_is_reported_and_a_missing_run_fails(tmp_path, capsys):
    mod = load()
    out = tmp_path / "peers.json"
    ok = _run(tmp_path / "s", 0.010, 1000.0)
    rc = mod.main(["--http", f"vllm={tmp_path / 'none'}", "--http", f"servelab={ok}", "--reference", "servelab",
                   "--skipped", "vllm=CPU only", "--out", str(out)])
    report = json.loads(out.read_text())
    assert rc == 0 and report["servers"]["vllm"]["skipped"] == "CPU only"
    assert report["ratios_over_reference"] == {} and report["same_requests_and_output_tokens"] is None
    assert "vllm: skipped: CPU only" in capsys.readouterr().out
    rc = mod.main(["--http", f"vllm={tmp_path / 'none'}", "--http", f"servelab={ok}", "--reference", "servelab",
                   "--out", str(out)])
    assert rc == 1 and "summary.json" in json.loads(out.read_text())["servers"]["vllm"]["missing"]


@pytest.mark.parametrize("args, message", [(["--http", "novalue"], "give NAME=VALUE"),
                                           (["--http", "a=x", "--http", "a=y"], "given twice"),
                                           (["--http", "a=x", "--reference", "b"], "not one of the --http")])
def test_bad_arguments_are_one_line_errors(tmp_path, args, message):
    with pytest.raises(SystemExit, match=message):
        load().main([*args, "--out", str(tmp_path / "o.json")])
