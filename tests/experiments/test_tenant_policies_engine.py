"""edf, vtc and qoe on the engine (the tiny model on CPU, `backend=engine`) decide as in the simulator.

Every request arrives at once (an Azure-format trace with one timestamp, tenant and TTFT-target columns)
and the policies' knobs keep their decisions independent of the clock (targets either hopeless or far
away; qoe's pause hysteresis larger than any lead), so both backends must schedule the same requests
at the same steps: per request the step of its first scheduling, of its first token and of its finish,
its preemptions and its status.
"""
import numpy as np
import pandas as pd
import pytest

from experiments.run import execute
from tests.experiments.test_input_changes import FAST, QUIET, cfg_of, hydra_conf  # noqa: F401  (Hydra's conf)
from tests.experiments.test_validation import tiny  # noqa: F401  (the tiny checkpoint fixture)

# 10 requests: prompt 20-58 tokens, 3-12 outputs; tenants a (heavy: 6 requests) and b; TTFT targets
# 1e-6 s (hopeless: edf rejects them at once), 1e6 s, or none.
ROWS = [(20 + 4 * i, 3 + i % 10, "a" if i % 5 < 3 else "b", {0: "1e-06", 1: "1000000", 2: ""}[i % 3])
        for i in range(10)]

POLICIES = {
    "edf": ["scheduler=edf", "scheduler.on_late=reject", "scheduler.prefill_tokens_per_s=1000"],
    "vtc": ["scheduler=vtc", "scheduler.tenant_weights={b: 2.0}"],
    "qoe": ["scheduler=qoe", "scheduler.pause_hysteresis_s=1000000"],
}


def trace(tmp_path):
    lines = ["TIMESTAMP,ContextTokens,GeneratedTokens,tenant,ttft"]
    lines += [f"2023-11-16 18:15:46.0000000,{p},{o},{t},{s}" for p, o, t, s in ROWS]
    path = tmp_path / "tenants.csv"
    path.write_text("\n".join(lines) + "\n")
    return path


def step_of(times: pd.Series, steps: pd.DataFrame, end: bool) -> np.ndarray:
    """The index of the step that started (end=False) or ended (end=True) at each time; -1 for NaN."""
    marks = (steps["start_time_s"] + steps["duration_s"] if end else steps["start_time_s"]).to_numpy()
    t = times.to_numpy(dtype=float)
    idx = np.searchsorted(marks, t - 1e-9 * np.maximum(1.0, np.abs(t)))
    return np.where(np.isnan(t), -1, idx)


def decisions(run_dir) -> pd.DataFrame:
    req = pd.read_parquet(run_dir / "requests.parquet").sort_values("request_id").reset_index(drop=True)
    steps = pd.read_parquet(run_dir / "steps.parquet")
    return pd.DataFrame({
        "request_id": req["request_id"], "tenant": req["tenant"], "status": req["status"],
        "reason": req["reject_reason"].fillna("").str.split(" can no longer").str[0],
        "first_scheduled_step": step_of(req["first_scheduled_time_s"], steps, end=False),
        "first_token_step": step_of(req["first_token_time_s"], steps, end=True),
        "finish_step": step_of(req["finish_time_s"], steps, end=True),
        "num_preemptions": req["num_preemptions"], "slo_met": req["slo_met"].astype(object)})


@pytest.mark.parametrize("name", sorted(POLICIES))
def test_policy_decides_the_same_on_the_engine_and_in_the_simulator(tiny, tmp_path, name):  # noqa: F811
    common = ["workload=azure", f"workload.path={trace(tmp_path)}", "workload.tenant_column=tenant",
              "workload.ttft_slo_column=ttft", "num_kvcache_blocks=12", "max_num_seqs=3", "max_model_len=256",
              "max_num_batched_tokens=256", "num_cpu_blocks=0", *POLICIES[name], *QUIET]
    sim = execute(cfg_of(*common, *FAST), tmp_path / "sim")
    eng = execute(cfg_of("backend=engine", f"backend.model_path={tiny}", "backend.device=cpu",
                         "backend.enforce_eager=true", *common), tmp_path / "engine")
    a, b = decisions(tmp_path / "sim"), decisions(tmp_path / "engine")
    pd.testing.assert_frame_equal(a.drop(columns="slo_met"), b.drop(columns="slo_met"))
    assert sim["metrics"]["num_steps"] == eng["metrics"]["num_steps"]
    assert set(a["tenant"]) == {"a", "b"}
    if name == "edf":       # the hopeless requests are rejected before they run, in both
        hopeless = a["request_id"].isin([i for i in range(10) if i % 3 == 0])
        assert (a["status"][hopeless] == "rejected").all() and (a["status"][~hopeless] == "finished").all()
        assert (a["reason"][hopeless] == "policy edf: TTFT target 1e-06 s").all()
        assert sim["metrics"]["num_rejected_by_policy"] == eng["metrics"]["num_rejected_by_policy"] == 4
    else:
        assert (a["status"] == "finished").all()
    if name == "vtc":       # the order is the counters' (b, of weight 2, gets in early), not arrival order
        assert list(a["first_scheduled_step"]) != sorted(a["first_scheduled_step"])
