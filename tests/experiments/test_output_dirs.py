"""Output folders: runs never share or overwrite one, unnamed sweeps never mix, Ctrl-C reports the truth."""
import datetime as dt
import json

import hydra.core.utils

import experiments.runner_sim as runner_sim
from experiments.output_dirs import sweep_name, unique_dir
from tests.experiments.cli import SMALL, in_tmp, servelab  # noqa: F401  (in_tmp is a fixture)
from tests.experiments.test_run import InterruptingCostModel


class FrozenClock(dt.datetime):
    @classmethod
    def now(cls, tz=None):
        return dt.datetime(2026, 1, 2, 3, 4, 5)


def summaries(root):
    return {str(p.parent.relative_to(root)): json.loads(p.read_text()) for p in root.rglob("summary.json")}


def test_runs_started_in_the_same_second_get_their_own_folders(in_tmp, monkeypatch, capsys):
    monkeypatch.setattr(hydra.core.utils, "datetime", FrozenClock)      # Hydra's ${now:...}
    outs = [servelab(monkeypatch, capsys, *SMALL, "print_summary=true") for _ in range(2)]
    assert [code for code, _, _ in outs] == [0, 0]
    found = summaries(in_tmp / "outputs")
    assert sorted(found) == ["smoke/2026-01-02_03-04-05", "smoke/2026-01-02_03-04-05_2"]
    assert len({s["run_id"] for s in found.values()}) == 2
    # each run names its own folder
    printed = [next(ln for ln in out.splitlines() if ln.startswith("results: ")) for _, out, _ in outs]
    assert printed[0] != printed[1] and printed[1].endswith("2026-01-02_03-04-05_2")


def test_unique_dir_bumps_and_is_stable_within_a_process(tmp_path, monkeypatch):
    import experiments.output_dirs as od
    monkeypatch.setattr(od, "_created", {})
    base = str(tmp_path / "run")
    assert unique_dir(base) == base and unique_dir(base) == base       # Hydra resolves it more than once
    monkeypatch.setattr(od, "_created", {})                           # another process
    assert unique_dir(base) == base + "_2"


def test_an_explicit_run_dir_holding_results_is_refused_not_overwritten(in_tmp, monkeypatch, capsys):
    out = in_tmp / "mine"
    assert servelab(monkeypatch, capsys, *SMALL, f"hydra.run.dir={out}")[0] == 0
    before = (out / "summary.json").read_text(), (out / ".hydra" / "config.yaml").read_text()
    code, _, err = servelab(monkeypatch, capsys, *SMALL, "seed=3", f"hydra.run.dir={out}")
    assert code == 2 and err.strip().startswith(f"error: hydra.run.dir={out} already holds results")
    assert len(err.strip().splitlines()) == 1
    assert ((out / "summary.json").read_text(), (out / ".hydra" / "config.yaml").read_text()) == before


def test_sweep_name_from_overrides():
    assert sweep_name("fcfs_vs_preemptive", ["scheduler=a,b"]) == "fcfs_vs_preemptive"     # a given name wins
    assert sweep_name("default", ["workload.arrival.rate_rps=5,50", "scheduler=fcfs,vllm", "progress=false",
                                  "workload.path=../shared/traces/x.csv", "workload/output_len=fixed"]) == \
        "scheduler=fcfs,vllm+workload.arrival.rate_rps=5,50+workload.output_len=fixed+workload.path=x.csv"
    # order-independent, so relaunching the same command (in any order) resumes the same sweep
    assert sweep_name("default", ["b=1,2", "a=3"]) == sweep_name("default", ["a=3", "b=1,2"])
    long = sweep_name("default", [f"k{i}=" + "x" * 40 for i in range(10)])
    assert len(long) <= 120 and long != sweep_name("default", [f"k{i}=" + "x" * 40 for i in range(11)])


def test_unnamed_sweeps_do_not_share_a_folder_and_a_relaunch_resumes(in_tmp, monkeypatch, capsys):
    sweep = ["-m", *SMALL, "name=default", "hydra/launcher=basic"]
    assert servelab(monkeypatch, capsys, *sweep, "scheduler=fcfs,vllm")[0] == 0
    assert servelab(monkeypatch, capsys, *sweep, "scheduler=srpt")[0] == 0
    assert sorted(summaries(in_tmp / "sweeps")) == [
        "experiment=smoke+scheduler=fcfs,vllm+workload.num_requests=6/scheduler=fcfs,workload.num_requests=6",
        "experiment=smoke+scheduler=fcfs,vllm+workload.num_requests=6/scheduler=vllm,workload.num_requests=6",
        "experiment=smoke+scheduler=srpt+workload.num_requests=6/scheduler=srpt,workload.num_requests=6"]
    code, out, _ = servelab(monkeypatch, capsys, "-m", "scheduler=fcfs,vllm", *sweep[1:])   # same, reordered
    assert code == 0 and out.count("[skip]") == 2


# -- Ctrl-C ------------------------------------------------------------------------------------
def test_interrupt_before_any_result_says_nothing_was_written(in_tmp, monkeypatch, capsys):
    def interrupted(cfg, *args):
        raise KeyboardInterrupt
    monkeypatch.setattr(runner_sim, "build_workload", interrupted)
    code, _, err = servelab(monkeypatch, capsys, *SMALL)
    assert code == 130 and "no results were written" in err and "complete=false" not in err
    assert not list(in_tmp.rglob("summary.json"))


def test_interrupt_mid_run_names_the_folder_and_the_count(in_tmp, monkeypatch, capsys):
    monkeypatch.setattr(runner_sim, "make_cost_model", lambda cfg, m, h: InterruptingCostModel(after_steps=2))
    code, _, err = servelab(monkeypatch, capsys, *SMALL, "workload=all_at_once", "workload.num_requests=6",
                            "hydra.run.dir=cut")
    s = json.loads((in_tmp / "cut" / "summary.json").read_text())
    assert code == 130 and s["complete"] is False
    assert f"the {s['metrics']['num_finished']} requests finished so far were written to cut" in err


def test_interrupt_at_the_first_step_writes_nothing_and_removes_the_empty_folder(in_tmp, monkeypatch, capsys):
    monkeypatch.setattr(runner_sim, "make_cost_model", lambda cfg, m, h: InterruptingCostModel(after_steps=0))
    code, _, err = servelab(monkeypatch, capsys, *SMALL, "workload=all_at_once", "workload.num_requests=6",
                            "hydra.run.dir=cut")
    assert code == 130 and "interrupted: no results were written (the empty folder cut is removed)" in err
    assert not (in_tmp / "cut").exists()


def test_interrupted_sweep_counts_what_each_job_left(in_tmp, monkeypatch, capsys):
    # the second job is cut short; the third never starts
    calls = []

    def cost_model(cfg, m, h):
        calls.append(1)
        return InterruptingCostModel(after_steps=10_000 if len(calls) == 1 else 2)
    monkeypatch.setattr(runner_sim, "make_cost_model", cost_model)
    code, _, err = servelab(monkeypatch, capsys, "-m", *SMALL, "hydra/launcher=basic", "hydra.sweep.dir=sw",
                            "scheduler=fcfs,vllm,srpt")
    assert code == 130 and len(calls) == 2
    assert "sweep sw holds 1 complete job(s) and 1 interrupted one(s)" in err
    assert "jobs without a summary.json wrote nothing" in err
    assert len(summaries(in_tmp / "sw")) == 2


# -- a sweep's folder ---------------------------------------------------------------------------
def test_a_run_dir_holding_a_sweep_is_refused(in_tmp, monkeypatch, capsys):
    assert servelab(monkeypatch, capsys, "-m", *SMALL, "hydra/launcher=basic", "hydra.sweep.dir=sw",
                    "scheduler=fcfs")[0] == 0
    code, _, err = servelab(monkeypatch, capsys, *SMALL, "hydra.run.dir=sw")
    assert code == 2 and err.strip() == (
        "error: hydra.run.dir=sw holds a sweep (multirun.yaml); a single run writes into a folder of its own: give "
        "another folder (servelab-report reads the sweep; servelab -m ... adds jobs to it)")
    (in_tmp / "sw" / "multirun.yaml").unlink()          # its job folders alone say so too
    code, _, err = servelab(monkeypatch, capsys, *SMALL, "hydra.run.dir=sw")
    assert code == 2 and "holds a sweep (job folder scheduler=fcfs,workload.num_requests=6 with a summary.json)" in err
    assert not (in_tmp / "sw" / "summary.json").exists()


def test_a_sweep_that_fails_validation_leaves_no_folder(in_tmp, monkeypatch, capsys):
    code, out, err = servelab(monkeypatch, capsys, "-m", "scheduler=vllm,srtp", "workload.num_requests=10", *SMALL[2:],
                              "hydra/launcher=basic")
    assert code == 2 and err.startswith("error: scheduler=srtp: no such option")
    assert "sweep folder: sweeps/scheduler=vllm,srtp+workload.num_requests=10" in out
    assert list(in_tmp.iterdir()) == []          # sweeps/ was made by the launch too


def test_a_failed_launch_keeps_a_sweep_folder_it_did_not_create(in_tmp, monkeypatch, capsys):
    sweep = ["-m", *SMALL, "hydra/launcher=basic", "name=mine"]
    assert servelab(monkeypatch, capsys, *sweep, "scheduler=fcfs")[0] == 0
    assert servelab(monkeypatch, capsys, *sweep, "scheduler=fcfs,srtp")[0] == 2
    assert (in_tmp / "sweeps" / "mine" / "multirun.yaml").is_file() and len(summaries(in_tmp / "sweeps")) == 1


def test_a_relaunch_keeps_the_earlier_multirun_yaml_when_its_own_differs(in_tmp, monkeypatch, capsys):
    sweep, folder = ["-m", *SMALL, "hydra/launcher=basic", "name=mine"], in_tmp / "sweeps" / "mine"
    assert servelab(monkeypatch, capsys, *sweep, "scheduler=fcfs")[0] == 0
    first = (folder / "multirun.yaml").read_text()
    code, out, _ = servelab(monkeypatch, capsys, *sweep, "scheduler=fcfs")       # the same command: left as it is
    assert code == 0 and "multirun.yaml:" not in out
    assert sorted(p.name for p in folder.glob("multirun*")) == ["multirun.yaml"]
    assert (folder / "multirun.yaml").read_text() == first
    for n, more in enumerate(("scheduler=fcfs,vllm", "scheduler=fcfs,vllm,srpt"), start=1):
        before = (folder / "multirun.yaml").read_text()
        code, out, _ = servelab(monkeypatch, capsys, *sweep, more)
        kept = [ln for ln in out.splitlines() if ln.startswith("multirun.yaml:")]
        assert code == 0 and kept == [f"multirun.yaml: this launch's config differs from the one in sweeps/mine; the "
                                      f"earlier one is kept as sweeps/mine/multirun.{n}.yaml"]
        assert (folder / f"multirun.{n}.yaml").read_text() == before and f"- {more}\n" in (
            folder / "multirun.yaml").read_text()
    assert (folder / "multirun.1.yaml").read_text() == first
