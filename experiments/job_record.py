"""Which process ran a sweep job and how it ended, so that a job that wrote no results is reported by
`servelab-report`, never silently missing from its table.

Each sweep job writes `job.json` into its folder when it starts, and again with `error` when it raises:

    {"started_at": "2026-12-01T11:40:02+00:00", "host": "node17", "pid": 4242,
     "launcher": "slurm" | "local" (submitit's executors) | "process" (joblib, basic),
     "slurm_job_id": "12", "slurm_array_job_id": "9", "slurm_array_task_id": "3",
     "slurm_node": "node17",                                                         (SLURM jobs only)
     "submitit_job_id": "9_3",                                                       (submitit jobs only)
     "log": the job's stderr log (submitit) or its servelab.log,
     "error": one line, only when the job raised}

`failed_jobs(sweep_dir)` lists the jobs of a sweep folder that hold no summary.json: those that started
(job.json; the error line from job.json, else the last error-like line of the log, e.g. slurmstepd's
`*** JOB 12 ON node17 CANCELLED AT ... ***`), and those a submitit launcher submitted (its
`.submitit/<id>/<id>_submitted.pkl`) that never got as far: no result file (never started, or killed as it
started), or one holding an error raised before servelab's job began. A submission is unpickled only then, and
left out when a later launch ran the same overrides. Then the jobs of the sweep's last launch (its multirun.yaml:
the basic sweeper's parameters and the command line's overrides, expanded as Hydra's basic sweeper expands them)
that have no folder and no submission: a sweep stopped (Ctrl-C, a killed launcher) before they ran. A job still
running looks the same as one that was killed.
`lost_job_line(exc)` turns submitit's error about such a job, raised in the submitting command, into one line.
"""
from __future__ import annotations

import json
import os
import pickle
import re
import socket
from dataclasses import asdict, dataclass
from datetime import datetime, timezone
from pathlib import Path

import yaml

from experiments.results import SUMMARY, atomic_write_text, read_summary

JOB_RECORD = "job.json"
HYDRA_LOG = "servelab.log"           # Hydra's per-job log file (hydra.job.name is servelab)
SUBMITIT_DIR = ".submitit"
# Words that mark the line of a log that says why a job ended (slurmstepd, Python, the kernel's OOM killer).
ERROR_WORDS = ("error", "cancelled", "killed", "oom", "timeout", "time limit", "traceback", "exception")


def _slurm_ids() -> dict:
    keys = {"slurm_job_id": "SLURM_JOB_ID", "slurm_array_job_id": "SLURM_ARRAY_JOB_ID",
            "slurm_array_task_id": "SLURM_ARRAY_TASK_ID", "slurm_node": "SLURMD_NODENAME"}
    return {k: os.environ[v] for k, v in keys.items() if os.environ.get(v)}


def current_job(out_dir) -> dict:
    """The record of the job running in this process, whose folder is out_dir."""
    record = {"started_at": datetime.now(timezone.utc).isoformat(timespec="seconds"), "host": socket.gethostname(),
              "pid": os.getpid(), "launcher": "process", "log": str(Path(out_dir) / HYDRA_LOG)}
    executor = os.environ.get("SUBMITIT_EXECUTOR")      # set by submitit inside its jobs ("slurm", "local")
    if executor:
        import submitit

        env = submitit.JobEnvironment()
        record.update(launcher=executor, submitit_job_id=str(env.job_id), log=str(env.paths.stderr))
    record.update(_slurm_ids())
    return record


def record_start(out_dir) -> dict:
    record = current_job(out_dir)
    atomic_write_text(Path(out_dir) / JOB_RECORD, json.dumps(record, indent=2) + "\n")
    return record


def record_failure(out_dir, error_line: str) -> None:
    """Adds the error line to the job's record (written by record_start, or now when the job failed before)."""
    path = Path(out_dir) / JOB_RECORD
    record = read_record(out_dir) or current_job(out_dir)
    record["error"] = error_line
    atomic_write_text(path, json.dumps(record, indent=2) + "\n")


def read_record(folder) -> dict | None:
    try:
        return json.loads((Path(folder) / JOB_RECORD).read_text())
    except (OSError, ValueError):
        return None


@dataclass(frozen=True)
class FailedJob:
    """A sweep job without complete results: its folder (relative to the sweep; None when it never started),
    its overrides, the scheduler's ids, its log (None when there is none) and the line that says why."""
    run_dir: str | None
    overrides: tuple[str, ...]
    job_id: str | None
    log: str | None
    error: str


def describe(job) -> str:
    """One line: which job, its ids, why, its log. job: a FailedJob or its dataclasses.asdict."""
    job = job if isinstance(job, dict) else asdict(job)
    where = job["run_dir"] or " ".join(job["overrides"])
    ids = f" (job {job['job_id']})" if job["job_id"] else ""
    return f"{where}{ids}: {job['error']}; log: {job['log'] or 'none'}"


def error_line(log) -> str | None:
    """The last line of a log file that says why the job ended (see ERROR_WORDS), or None."""
    try:
        lines = Path(log).read_text(errors="replace").splitlines()
    except OSError:
        return None
    for line in reversed(lines):
        low = line.lower()
        if any(w in low for w in ERROR_WORDS) and "bypassing signal" not in low:
            return line.strip()
    return None


def _overrides(folder: Path) -> tuple[str, ...]:
    try:
        return tuple(str(o) for o in yaml.safe_load((folder / ".hydra" / "overrides.yaml").read_text()) or ())
    except (OSError, yaml.YAMLError):
        return ()


def _job_id(record: dict) -> str | None:
    slurm = record.get("slurm_job_id")
    sub = record.get("submitit_job_id")
    if slurm and sub and slurm != sub:
        return f"{sub}, SLURM id {slurm}"
    return slurm or sub


def _started_failures(sweep_dir: Path) -> list[FailedJob]:
    failed = []
    for folder in sorted({p.parent for p in sweep_dir.rglob(JOB_RECORD)} |
                         {p.parent.parent for p in sweep_dir.rglob(".hydra/overrides.yaml")}):
        if SUBMITIT_DIR in folder.relative_to(sweep_dir).parts or folder == sweep_dir:
            continue
        summary = read_summary(folder)
        if summary is not None:        # complete, or interrupted (complete=false): the report lists those itself
            continue
        record = read_record(folder) or {}
        log = record.get("log") or (str(folder / HYDRA_LOG) if (folder / HYDRA_LOG).is_file() else None)
        why = record.get("error") or (error_line(log) if log else None)
        why = why or f"no {SUMMARY} and no error in its log (killed, or still running)"
        failed.append(FailedJob(str(folder.relative_to(sweep_dir)), _overrides(folder), _job_id(record), log, why))
    return failed


def _submitted_overrides(pkl: Path) -> tuple[str, ...]:
    """The overrides of a job a submitit launcher submitted (its `<id>_submitted.pkl`; () when unreadable).
    A pickle runs code as it loads, like submitit's own reading of it: read only sweep folders you trust."""
    try:
        with open(pkl, "rb") as f:
            # submitit's pickle of the launcher call: args = (overrides, job_dir_key, job_num, job_id, state)
            return tuple(str(o) for o in pickle.load(f).args[0])
    except Exception:        # the launcher not installed here, a torn file: that job cannot be named
        return ()


def _raised(folder: Path, job_id: str) -> str | bool | None:
    """From submitit's result file of a job: False when it ended well, the last line of its traceback when it
    raised before servelab's job began (in the job's own set-up), None when there is no result."""
    results = sorted(folder.glob(f"{job_id}_*_result.pkl"))
    if not results:
        return None
    try:
        with open(results[0], "rb") as f:
            outcome, value = pickle.load(f)[:2]     # ("success", return value) or ("error", traceback text)
    except Exception:
        return False
    if outcome != "error":
        return False
    lines = [line.strip() for line in str(value).splitlines() if line.strip()]
    return lines[-1] if lines else "raised (no traceback in its result file)"


def failed_jobs(sweep_dir) -> list[FailedJob]:
    """Jobs of the sweep folder that wrote no summary.json (see the module docstring)."""
    sweep_dir = Path(sweep_dir)
    failed = _started_failures(sweep_dir)
    seen = {tuple(sorted(_overrides(p.parent.parent))) for p in sweep_dir.rglob(".hydra/overrides.yaml")}
    started_ids = {r.get("submitit_job_id") for r in map(read_record, (p.parent for p in sweep_dir.rglob(JOB_RECORD)))
                   if r}
    for pkl in sorted(sweep_dir.glob(f"{SUBMITIT_DIR}/*/*_submitted.pkl")):
        job_id, folder = pkl.name[: -len("_submitted.pkl")], pkl.parent
        if job_id in started_ids:
            continue        # it started: listed above if it failed
        raised = _raised(folder, job_id)
        if raised is False:
            continue        # it ended with a result
        overrides = _submitted_overrides(pkl)
        if overrides and tuple(sorted(overrides)) in seen:
            continue        # a later launch ran the same job (listed above if it failed)
        logs = sorted(folder.glob(f"{job_id}_*_log.err"))
        log = str(logs[0]) if logs else None
        why = (raised or (error_line(log) if log else None)
               or ("ended without results and without an error line in its log (killed?)" if log else
                   "never started (cancelled or failed before it ran)"))
        failed.append(FailedJob(None, overrides, job_id, log, why))
    named = seen | {tuple(sorted(j.overrides)) for j in failed}
    for overrides in launched_jobs(sweep_dir):
        if tuple(sorted(overrides)) not in named:
            failed.append(FailedJob(None, overrides, None, None, NO_FOLDER))
    return failed


BASIC_SWEEPER = "hydra._internal.core_plugins.basic_sweeper.BasicSweeper"
NO_FOLDER = "never started: the sweep stopped before it ran (no folder; the sweep's multirun.yaml lists it)"


def launched_jobs(sweep_dir) -> list[tuple[str, ...]]:
    """Each job's overrides of the sweep's last launch, from its multirun.yaml, in launch order; [] when there is
    none, or its sweeper is not Hydra's basic one (another sweeper's jobs cannot be listed in advance)."""
    try:
        cfg = yaml.safe_load((Path(sweep_dir) / "multirun.yaml").read_text())
        hydra = cfg["hydra"]
        if hydra["sweeper"]["_target_"] != BASIC_SWEEPER:
            return []
        from hydra._internal.core_plugins.basic_sweeper import BasicSweeper
        from hydra.core.override_parser.overrides_parser import OverridesParser

        params = [f"{k}={v}" for k, v in (hydra["sweeper"].get("params") or {}).items()]
        parsed = OverridesParser.create().parse_overrides(params + list(hydra["overrides"]["task"]))
        return [tuple(job) for batch in BasicSweeper.split_arguments(parsed, None) for job in batch]
    except Exception:       # no multirun.yaml, a torn or hand-edited one: its jobs cannot be listed
        return []


def lost_job_line(exc: BaseException) -> str | None:
    """One line for submitit's error about a sweep job that ended without a result, else None.

    UncompletedJobError: the job left no result file (cancelled, killed, past its time limit, its node lost);
    FailedJobError: it raised before servelab's job began (in submitit's or Hydra's set-up, in the job)."""
    name, text = type(exc).__name__, str(exc)
    if name == "UncompletedJobError":
        job = re.search(r"Job (\S+) \(task", text)
        state = re.search(r"\(state: ([^)]*)\)", text)
        result = re.search(r"with path (\S+)_result\.pkl", text)
        log = f"{result.group(1)}_log.err" if result else None
        log = log if log and Path(log).is_file() else None      # a job killed as it started wrote none
        why = error_line(log) if log else None
        return (f"sweep job {job.group(1) if job else '?'} ended without results (state: "
                f"{state.group(1) if state else 'unknown'})" + (f": {why}" if why else "") + f"; log: {log or 'none'}")
    if name == "FailedJobError":
        trace = text.split("-" * 22)[1] if text.count("-" * 22) >= 2 else text
        lines = [line.strip() for line in trace.splitlines() if line.strip()]
        log = re.search(r"- (\S+_log\.err)", text)
        return (f"a sweep job failed before it began: {lines[-1] if lines else '?'}; "
                f"log: {log.group(1) if log else 'none'}")
    return None
