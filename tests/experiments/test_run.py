"""The servelab entry point: files written, hand-checked numbers, resume, Ctrl-C, engine dispatch."""
import json
import os
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest
from hydra import compose, initialize_config_dir

import experiments.runner_sim as runner_sim
from experiments.results import is_complete, read_summary
from experiments.run import execute
from sim.cost_model import ConstantCostModel

ROOT = Path(__file__).resolve().parents[2]
CONF = ROOT / "conf"
QUIET = ["progress=false", "print_summary=false", "plots=false"]
# 8 requests at t=0, 16-token prompts, 4 output tokens, 10 ms per step whatever the batch.
HAND = ["workload=all_at_once", "workload.num_requests=8", "workload/prompt_len=fixed", "workload.prompt_len.tokens=16",
        "workload/output_len=fixed", "workload.output_len.tokens=4", "backend/cost_model=constant",
        "backend.cost_model.step_s=0.01", "model=qwen3_0p6b"]


@pytest.fixture(autouse=True, scope="module")
def hydra_conf():
    with initialize_config_dir(str(CONF), version_base="1.3"):
        yield


def cfg_of(*overrides):
    return compose("config", overrides=list(overrides))


def test_entry_point_writes_all_files(tmp_path):
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    out = tmp_path / "run"
    proc = subprocess.run([sys.executable, "-m", "experiments.run", "experiment=smoke", "workload.num_requests=30",
                           f"hydra.run.dir={out}", "progress=false"],
                          cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert "TTFT p50 / p99" in proc.stdout and "finished / rejected           30 / 0" in proc.stdout
    for name in ("requests.parquet", "steps.parquet", "summary.json", "config.yaml", "latency_cdf.png",
                 "step_timeline.png", ".hydra/config.yaml"):
        assert (out / name).is_file(), name
    summary = json.loads((out / "summary.json").read_text())
    assert summary["complete"] is True and summary["metrics"]["num_finished"] == 30
    assert summary["choices"]["model"] == "qwen3_0p6b" and summary["meta"]["model"] == "Qwen3-0.6B"
    assert len(pd.read_parquet(out / "requests.parquet")) == 30
    assert not list(out.glob(".*.tmp"))               # no temporary files left behind


def test_progress_bar_in_a_log_ends_its_own_line(tmp_path):
    # stdout and stderr into one file (a log): the bar's last state stays, on a line of its own, and the summary's
    # lines do not run on after it
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    log = tmp_path / "run.log"
    with open(log, "w") as f:
        proc = subprocess.run([sys.executable, "-m", "experiments.run", "experiment=smoke", "workload.num_requests=30",
                               f"hydra.run.dir={tmp_path / 'run'}", "plots=false"],
                              cwd=tmp_path, env=env, stdout=f, stderr=subprocess.STDOUT, timeout=120)
    assert proc.returncode == 0, log.read_text()
    lines = log.read_bytes().decode().split("\n")          # "\r" kept: a bar redraws its line with it
    bars = [ln for ln in lines if "req/s]" in ln]          # the bar: "workload.num_requests=30: 100%|...| 30/30 [...]"
    assert len(bars) == 1 and bars[0].endswith("req/s]") and "30/30" in bars[0], bars
    assert any(ln.lstrip().startswith("TTFT p50 / p99") for ln in lines), lines


def test_hand_checked_run(tmp_path):
    # All 8 prompts (128 tokens) prefill in one 10 ms step and sample token 1; three decode steps follow.
    s = execute(cfg_of(*HAND, *QUIET), tmp_path)
    m = s["metrics"]
    assert m["num_finished"] == 8 and m["makespan_s"] == pytest.approx(0.04)
    assert m["ttft_s_p50"] == pytest.approx(0.01) and m["ttft_s_p99"] == pytest.approx(0.01)
    assert m["tpot_s_p50"] == pytest.approx(0.01) and m["e2e_s_p99"] == pytest.approx(0.04)
    assert m["output_throughput_tps"] == pytest.approx(8 * 4 / 0.04)
    steps = pd.read_parquet(tmp_path / "steps.parquet")
    assert steps["num_prefill_tokens"].tolist() == [128, 0, 0, 0]
    assert steps["batch_size"].tolist() == [8, 8, 8, 8]
    assert s["meta"]["request_rate_rps"] is None     # all at once: no rate


def test_slo_goodput_and_forced_kv_blocks(tmp_path):
    # 8 blocks of 16 tokens hold 4 requests at completion (2 blocks each): two waves of 40 ms.
    s = execute(cfg_of(*HAND, *QUIET, "num_kvcache_blocks=8", "scheduler=fcfs", "ttft_slo_s=0.02"), tmp_path)
    m = s["metrics"]
    assert s["meta"]["num_kvcache_blocks"] == 8
    assert m["makespan_s"] == pytest.approx(0.08) and m["num_good"] == 4 and m["slo_attainment"] == 0.5


def test_resume_skips_a_complete_run(tmp_path, capsys):
    first = execute(cfg_of(*HAND, *QUIET), tmp_path)
    second = execute(cfg_of(*HAND, *QUIET), tmp_path)
    assert second["run_id"] == first["run_id"] and "[skip]" in capsys.readouterr().out
    third = execute(cfg_of(*HAND, *QUIET, "resume=false"), tmp_path)
    assert third["run_id"] != first["run_id"]


def test_resume_refuses_results_of_another_config(tmp_path):
    execute(cfg_of(*HAND, *QUIET), tmp_path)
    with pytest.raises(ValueError, match="different config.*seed"):
        execute(cfg_of(*HAND, *QUIET, "seed=5"), tmp_path)


class InterruptingCostModel(ConstantCostModel):
    """Raises KeyboardInterrupt (as Ctrl-C would) at the n-th step it prices."""

    def __init__(self, after_steps):
        super().__init__(step_s=0.01)
        self.left = after_steps

    def step_time_s(self, batch):
        self.left -= 1
        if self.left < 0:
            raise KeyboardInterrupt
        return super().step_time_s(batch)

    def decode_step_times_s(self, num_seqs, start_context_sum, k):
        self.left -= k
        if self.left < 0:
            raise KeyboardInterrupt
        return super().decode_step_times_s(num_seqs, start_context_sum, k)


def test_ctrl_c_keeps_finished_requests(tmp_path, monkeypatch):
    # 40 requests, one every 0.1 s, 4 steps each: the interrupt comes while later ones are still to arrive.
    over = [o for o in HAND if "all_at_once" not in o and "num_requests" not in o] + [
        "workload=poisson", "workload.num_requests=40", "workload.arrival._target_=experiments.workloads.Constant",
        "workload.arrival.rate_rps=10", *QUIET]
    monkeypatch.setattr(runner_sim, "make_cost_model", lambda cfg, m, h: InterruptingCostModel(after_steps=40))
    with pytest.raises(KeyboardInterrupt):
        execute(cfg_of(*over), tmp_path)
    s = read_summary(tmp_path)
    assert s["complete"] is False and s["meta"]["interrupted"] is True and not is_complete(tmp_path)
    req = pd.read_parquet(tmp_path / "requests.parquet")
    assert 0 < len(req) < 40 and (req["status"] == "finished").all()
    assert s["metrics"]["num_finished"] == len(req) and s["meta"]["num_unfinished"] == 40 - len(req)
    monkeypatch.undo()
    done = execute(cfg_of(*over), tmp_path)        # an incomplete run is not skipped: it runs again
    assert done["complete"] is True and done["metrics"]["num_finished"] == 40


def test_engine_backend_is_dispatched(tmp_path):
    # the engine runner's own check of the missing checkpoint path (no placeholder branch any more)
    with pytest.raises(ValueError, match="model_path"):
        execute(cfg_of("backend=engine", *QUIET), tmp_path)


def test_several_replicas_get_a_load_table_lines_and_a_plot(tmp_path, capsys):
    overrides = [*HAND, "progress=false", "num_replicas=2"]          # round_robin: 4 requests each
    s = execute(cfg_of(*overrides), tmp_path / "even")
    out = capsys.readouterr().out
    assert [r["num_requests"] for r in s["replicas"]] == [4, 4] and s["metrics"]["num_idle_replicas"] == 0
    assert read_summary(tmp_path / "even")["replicas"][1]["busy_fraction"] == pytest.approx(1.0)
    assert "replica 0" in out and "replica 1" in out and "4 req (50%), busy 100%" in out
    assert "WARNING" not in out and (tmp_path / "even" / "replica_load.png").is_file()
    # the prefix-cache hits of all replicas together get their own line, when there are any
    from experiments.run import format_summary
    assert "prefix-cache hits" not in out and s["metrics"]["prefix_cache_hit_rate"] == 0
    s["metrics"]["prefix_cache_hit_rate"] = 0.222
    assert "22.2% of prompt tokens" in format_summary(s)
    # one request on four replicas: three idle, the busy one carries 4x the mean
    s = execute(cfg_of(*overrides, "num_replicas=4", "workload.num_requests=1"), tmp_path / "skewed")
    out = capsys.readouterr().out
    assert s["metrics"]["replica_tokens_max_over_mean"] == 4.0
    assert "WARNING" in out and "replica 0 carries 4x the mean replica's tokens (3 replicas idle)" in out


def test_one_replica_has_no_load_table(tmp_path, capsys):
    s = execute(cfg_of(*HAND, "progress=false"), tmp_path)
    assert "replicas" not in s and "replica 0" not in capsys.readouterr().out
    assert not (tmp_path / "replica_load.png").exists()
