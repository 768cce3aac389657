"""Sweep jobs of calibrated runs: one folder level per job whatever the overrides hold, a relaunch that finds them,
the report of runs inside the fit's envelope, and warnings that name their job."""
import pandas as pd
from omegaconf import OmegaConf

from experiments.output_dirs import job_dir, job_name
from experiments.report import collect
from experiments.results import write_parquet
from tests.experiments.cli import QUIET, in_tmp, servelab  # noqa: F401  (in_tmp is a fixture)
from tests.experiments.test_sweep import ROOT

PROFILE = "benchmarks/results/profile_h200_qwen3_0p6b.json"      # relative, as the README gives it
CALIBRATED = ["-m", "hydra/launcher=basic", "model=qwen3_0p6b", "backend/cost_model=calibrated",
              f"backend.cost_model.profile={PROFILE}", "workload.num_requests=20", "scheduler=vllm,srpt", *QUIET]


def calibrated_sweep(tmp, monkeypatch, capsys, *extra):
    if not (tmp / "benchmarks").exists():
        (tmp / "benchmarks").symlink_to(ROOT / "benchmarks")
    return servelab(monkeypatch, capsys, *CALIBRATED, *extra)


def test_job_folders_do_not_nest_and_a_relaunch_finds_them(in_tmp, monkeypatch, capsys):
    code, _, err = calibrated_sweep(in_tmp, monkeypatch, capsys, "name=u_cov", "max_model_len=4096")
    assert code == 0, err
    sweep = in_tmp / "sweeps" / "u_cov"
    jobs = sorted(p.parent for p in sweep.rglob("summary.json"))
    assert [j.parent for j in jobs] == [sweep, sweep]
    assert jobs[0].name == ("backend.cost_model.profile=profile_h200_qwen3_0p6b@d364bc,"
                            "backend.cost_model=calibrated,max_model_len=4096,model=qwen3_0p6b,scheduler=srpt,"
                            "workload.num_requests=20")
    code, out, _ = calibrated_sweep(in_tmp, monkeypatch, capsys, "name=u_cov", "max_model_len=4096")
    assert code == 0 and out.count("[skip]") == 2
    # both runs inside the fit's envelope (outside_by == {}): the report's table is written, coverage in columns
    write_parquet(collect(sweep), in_tmp / "results.parquet")      # as servelab-report writes it
    table = pd.read_parquet(in_tmp / "results.parquet")
    assert table["cost_model_share_steps_outside"].tolist() == [0.0, 0.0]
    assert table["cost_model_share_time_outside"].tolist() == [0.0, 0.0]


def test_a_jobs_warning_names_the_job(in_tmp, monkeypatch, capsys):
    code, _, err = calibrated_sweep(in_tmp, monkeypatch, capsys, "name=far", "max_model_len=8192",
                                    "workload/prompt_len=uniform", "workload.prompt_len.lo=5000",
                                    "workload.prompt_len.hi=7000")
    assert code == 0, err
    warnings = [line for line in err.splitlines() if "WARNING" in line]
    jobs = sorted(p.parent.name for p in (in_tmp / "sweeps" / "far").rglob("summary.json"))
    assert len(warnings) == 2 and len(jobs) == 2
    for line in warnings:
        job = line.removeprefix("[job ").split("] WARNING: ", 1)[0]
        assert job in jobs and "outside the envelope the calibrated cost model was fitted on" in line
    assert {w.split("]")[0] for w in warnings} == {f"[job {j}" for j in jobs}


def test_warning_and_note_lines_carry_the_job_and_nothing_else_does():
    import io
    import sys

    from experiments.job_warnings import named_warnings
    buf = io.StringIO()
    real, sys.stderr = sys.stderr, buf
    try:
        with named_warnings("scheduler=srpt"):
            sys.stderr.write("WARNING: 6.3% clipped\nNOTE: 1,776 arrivals spread\n")
            sys.stderr.write("simulating:  40%|####  | 800/2000\r")            # a progress bar's line
            sys.stderr.write("error: bad value\n")
    finally:
        sys.stderr = real
    assert buf.getvalue() == ("[job scheduler=srpt] WARNING: 6.3% clipped\n[job scheduler=srpt] NOTE: 1,776 arrivals "
                              "spread\nsimulating:  40%|####  | 800/2000\rerror: bad value\n")


def test_a_warning_after_a_progress_bar_starts_a_line_of_its_own():
    """tqdm ends its line with "\r": a WARNING written next would sit on the bar's line in a log (and a grep for
    lines starting with WARNING would miss it)."""
    import io
    import sys

    from experiments.job_warnings import named_warnings
    buf = io.StringIO()
    real, sys.stderr = sys.stderr, buf
    try:
        with named_warnings("scheduler=srpt"):
            sys.stderr.write("simulating:   0%|  | 0/2000\r")
            sys.stderr.write("WARNING: 6.3% clipped\n")
    finally:
        sys.stderr = real
    assert buf.getvalue() == "simulating:   0%|  | 0/2000\r\n[job scheduler=srpt] WARNING: 6.3% clipped\n"
    assert any(ln.startswith("[job scheduler=srpt] WARNING") for ln in buf.getvalue().split("\n"))


def test_job_name_is_hydras_override_dirname_for_plain_overrides():
    plain = ["workload.arrival.rate_rps=5", "scheduler=fcfs", "+extra=1", "seed=7"]
    assert job_name(plain) == "+extra=1,scheduler=fcfs,seed=7,workload.arrival.rate_rps=5"
    assert job_name(["workload.path=a/b.csv", "scheduler=x"], exclude_keys=["workload.path"]) == "scheduler=x"
    assert "/" not in job_name(["backend/cost_model=calibrated", "backend.cost_model.profile=/abs/dir/p.json"])
    assert len(job_name([f"k{i}=" + "x" * 40 for i in range(10)])) <= 240


def test_a_file_in_a_folder_is_named_by_its_stem_and_stays_apart_from_its_namesakes():
    # README's band_demo sweep: the profile's whole path made the name too long, cut and ended in a hash
    band = ["model=qwen3_0p6b", "hardware=h100_sxm", "backend/cost_model=calibrated", "num_kvcache_blocks=600",
            "backend.cost_model.profile=benchmarks/results/generalize/h100_1205c/profile_h100_1205c.json",
            "scheduler=vllm_swap", "workload.num_requests=500", "workload.arrival.rate_rps=25"]
    name = job_name(band)
    profile = name.split(",")[0]
    assert profile.startswith("backend.cost_model.profile=profile_h100_1205c@") and len(profile) == 52
    assert name.endswith(",workload.num_requests=500")             # not cut
    # the same file name in another folder (a refit beside it) gets another folder; the same path the same one
    namesake = [o.replace("h100_1205c/profile", "h100_1205c/kind_floor/profile") for o in band]
    assert job_name(namesake) != name and job_name(list(reversed(band))) == name
    assert job_name(["backend.cost_model.profile=p.json"]) == "backend.cost_model.profile=p.json"   # no folder


def hydra_node(tmp_path, overrides, override_dirname):
    return OmegaConf.create({"hydra": {
        "sweep": {"dir": str(tmp_path)}, "overrides": {"task": overrides},
        "job": {"override_dirname": override_dirname,
                "config": {"override_dirname": {"kv_sep": "=", "item_sep": ",", "exclude_keys": []}}}}})


def test_a_sweep_launched_with_nested_job_folders_resumes_in_them(tmp_path):
    overrides = ["backend.cost_model.profile=r/p.json", "scheduler=vllm"]
    legacy = "backend.cost_model.profile=r/p.json,scheduler=vllm"
    new = "backend.cost_model.profile=p@af293e,scheduler=vllm"
    assert job_dir(_root_=hydra_node(tmp_path, overrides, legacy)) == new
    (tmp_path / legacy).mkdir(parents=True)
    (tmp_path / legacy / "summary.json").write_text("{}")
    assert job_dir(_root_=hydra_node(tmp_path, overrides, legacy)) == legacy


def test_a_sweep_launched_with_whole_paths_in_job_names_resumes_in_them(tmp_path):
    overrides = ["backend.cost_model.profile=r/p.json", "scheduler=vllm"]
    node = hydra_node(tmp_path, overrides, "backend.cost_model.profile=r/p.json,scheduler=vllm")
    assert job_dir(_root_=node) == "backend.cost_model.profile=p@af293e,scheduler=vllm"
    whole = tmp_path / "backend.cost_model.profile=r_p.json,scheduler=vllm"
    whole.mkdir()
    (whole / "summary.json").write_text("{}")
    assert job_dir(_root_=node) == whole.name
