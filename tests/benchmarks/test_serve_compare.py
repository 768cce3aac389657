"""benchmarks/serve_compare.py: the HTTP-over-in-process ratios and the goals they are held to."""
import importlib.util
import json
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def load():
    spec = importlib.util.spec_from_file_location("serve_compare", ROOT / "benchmarks" / "serve_compare.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def _summary(ttft_p50, tps, failed=None):
    return {"metrics": {"num_requests": 10, "num_finished": 10, "num_output_tokens": 500, "ttft_s_p50": ttft_p50,
                        "output_throughput_tps": tps, "makespan_s": 500 / tps},
            "meta": {"num_failed": failed}}


@pytest.mark.parametrize("ttft, tps, ttft_ok, tps_ok", [(0.0105, 1000.0, True, True), (0.0106, 1000.0, False, True),
                                                         (0.010, 979.0, True, False), (0.010, 1021.0, True, False)])
def test_goals(ttft, tps, ttft_ok, tps_ok):
    out = load().compare(_summary(0.010, 1000.0), _summary(ttft, tps, failed=0))
    assert out["ratios_http_over_inproc"]["ttft_s_p50"] == pytest.approx(ttft / 0.010)
    assert out["ratios_http_over_inproc"]["output_throughput_tps"] == pytest.approx(tps / 1000.0)
    assert (out["ttft_p50_goal_met"], out["output_tps_goal_met"]) == (ttft_ok, tps_ok)
    assert out["same_requests_and_output_tokens"] and out["http_failed"] == 0


def test_command_writes_the_report_and_names_a_missing_run(tmp_path, capsys):
    mod = load()
    for name, s in (("inproc", _summary(0.010, 1000.0)), ("http", _summary(0.0102, 995.0))):
        (tmp_path / name).mkdir()
        (tmp_path / name / "summary.json").write_text(json.dumps(s))
    out = tmp_path / "c.json"
    assert mod.main(["--inproc", str(tmp_path / "inproc"), "--http", str(tmp_path / "http"), "--out", str(out)]) == 0
    assert json.loads(out.read_text())["ttft_p50_goal_met"] is True
    assert "ratio 1.0200 (goal <= 1.05: met)" in capsys.readouterr().out
    assert mod.main(["--inproc", str(tmp_path / "nope"), "--http", str(tmp_path / "http"), "--out", str(out)]) == 1
    assert "--inproc" in capsys.readouterr().err


def test_gpu_serve_script_parses():
    assert subprocess.run(["bash", "-n", str(ROOT / "benchmarks" / "gpu_serve.sh")]).returncode == 0


def test_repeats_give_each_sides_spread(tmp_path, capsys):
    mod = load()
    dirs = {}
    for name, s in (("in1", _summary(0.010, 1000.0)), ("in2", _summary(0.011, 990.0)), ("h1", _summary(0.0102, 995.0)),
                    ("h2", _summary(0.0104, 1001.0))):
        (tmp_path / name).mkdir()
        (tmp_path / name / "summary.json").write_text(json.dumps(s))
        dirs[name] = str(tmp_path / name)
    out = tmp_path / "c.json"
    assert mod.main(["--inproc", dirs["in1"], dirs["in2"], "--http", dirs["h1"], dirs["h2"], "--out", str(out)]) == 0
    report = json.loads(out.read_text())
    assert report["ratios_http_over_inproc"]["ttft_s_p50"] == pytest.approx(1.02)      # the first runs
    assert report["repeats"]["inproc"]["runs"]["ttft_s_p50"] == [0.010, 0.011]
    assert report["repeats"]["inproc"]["max_over_min"]["ttft_s_p50"] == pytest.approx(1.1)
    assert report["repeats"]["http"]["max_over_min"]["output_throughput_tps"] == pytest.approx(1001 / 995)
    assert "inproc: TTFT p50 over 2 runs 0.0100, 0.0110 s (max / min 1.1000)" in capsys.readouterr().out
