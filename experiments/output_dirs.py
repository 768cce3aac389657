"""Where a run or a sweep writes, so that nothing is overwritten and no two sweeps share a folder.

- hydra.run.dir is `${servelab_unique_dir:outputs/${name}/${now:%Y-%m-%d_%H-%M-%S}}`: the resolver
  registered here creates the folder exclusively, so a second run started in the same second gets
  `<time>_2` (then `_3`, ...), never the first run's folder.
- `OutputGuard` (a Hydra callback, hydra.callbacks in conf/config.yaml) refuses a single run whose
  folder already holds results (an explicit hydra.run.dir=...) before Hydra writes anything into it;
  it names an unnamed sweep (name=default, no hydra.sweep.dir=...) by its command-line overrides,
  sorted, e.g. `sweeps/scheduler=fcfs,vllm+workload.arrival.rate_rps=5,50`, so unrelated sweeps
  never share a folder and relaunching the same command resumes the same one (a named sweep keeps
  `sweeps/<name>`); and it remembers the folder, so an interrupted command can say truthfully what
  it left behind (`interrupted_message`), and a launch that fails before any job started removes the
  sweep folder it created (`remove_unused_sweep`). It also refuses a single run into a folder that holds
  a sweep (multirun.yaml, or job folders with a summary.json), and keeps a relaunch's earlier multirun.yaml
  as multirun.<N>.yaml when this launch's differs (`keep_changed_multirun`).
- A sweep job's folder (hydra.sweep.subdir) is `${servelab_job_dir:}`: Hydra's override_dirname with each
  override made one path component as the sweep folder's name is (`job_name`), so an override holding a
  `/` (a config group) never nests folders, a file in a folder (a calibrated profile) is named by its stem and
  a short hash of its path, and the same overrides give the same folder (a relaunch finds its finished jobs).
"""
from __future__ import annotations

import hashlib
import os
import re
import shutil
from pathlib import Path

from hydra.experimental.callback import Callback
from omegaconf import OmegaConf, open_dict, read_write

from experiments.config_check import is_path_key
from experiments.job_record import failed_jobs
from experiments.kept_copies import kept_name
from experiments.results import NON_RESULT_KEYS, SUMMARY, read_summary
from experiments.user_errors import fail

# Files whose presence means a folder holds a run's results (summary.json is written last).
RESULT_FILES = (SUMMARY, "requests.parquet")
MAX_NAME_CHARS = 120          # one path component; file systems allow 255 bytes
# A job's folder names all its overrides (the report reads them from its summary.json, the folder list shows them)
MAX_JOB_NAME_CHARS = 240

_created: dict[str, str] = {}         # base -> folder created for it in this process
_last_output: dict[str, str] = {}     # "run" or "sweep" -> the folder this command writes into
_created_sweep: list[Path] = []       # the sweep folder, then its parents, that this command's launch created
_created_run: list[Path] = []         # the same for a single run's folder
_made_by_unique_dir: dict[str, list[Path]] = {}   # a folder unique_dir made -> it and the parents it made


def unique_dir(base: str) -> str:
    """Create `base` (or `base_2`, `base_3`, ... when it exists) and return it; the same answer for the
    same base within one process (Hydra resolves hydra.run.dir more than once)."""
    if base in _created:
        return _created[base]
    parents = _missing_folders(Path(base).parent)
    Path(base).parent.mkdir(parents=True, exist_ok=True)
    candidate, n = base, 1
    while True:
        try:
            os.mkdir(candidate)
            break
        except FileExistsError:
            n += 1
            candidate = f"{base}_{n}"
    _created[base] = candidate
    _made_by_unique_dir[candidate] = [Path(candidate), *parents]
    return candidate


def _clean(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9._,=+@-]", "_", text)


def _item_name(key: str, sep: str, value: str) -> str:
    """One override as part of a folder name: a group's `/` as `.`, a file (a key ending in path) by its name,
    odd characters (a value's `/` included: it would nest folders) as `_`. Unchanged when it has none of them."""
    if key.lstrip("+~").endswith("path") and sep:       # a file: its name, not its folders
        value = ",".join(Path(v.strip("'\"")).name for v in value.split(","))
    return _clean(f"{key.replace('/', '.')}{sep}{value}")


def sweep_name(name: str, overrides) -> str:
    """`name`, or for an unnamed sweep (name=default) its overrides as one folder name."""
    if name != "default":
        return name
    items = []
    for item in overrides or []:
        key, sep, value = str(item).partition("=")
        bare = key.lstrip("+~")
        if bare in NON_RESULT_KEYS or bare == "name" or bare.startswith("hydra"):
            continue
        items.append(_item_name(bare, sep, value))
    return safe_name("+".join(sorted(items)) or "default")


def safe_name(text: str, max_chars: int = MAX_NAME_CHARS) -> str:
    """text as one path component: odd characters replaced, cut to max_chars with a hash of the whole."""
    text = _clean(text)
    if len(text) > max_chars:
        digest = hashlib.sha1(text.encode()).hexdigest()[:8]
        text = f"{text[:max_chars - 9]}_{digest}"
    return text


def _file_label(value: str) -> str:
    """A file in a folder, given to a job (`backend.cost_model.profile=benchmarks/results/h100/profile_h100.json`), as
    its stem and a hash of the path as given (`profile_h100@1f0c2a`): the whole path made the folder name too long
    to read (cut, with a hash), and the stem alone would put two files of one name in different folders into one
    job folder. A bare file name (no folder) is kept as it is."""
    value = value.strip("'\"")
    if "/" not in value:
        return value
    return f"{Path(value).stem}@{hashlib.sha1(value.encode()).hexdigest()[:6]}"


def _job_item(key: str, sep: str, value: str, whole_paths: bool = False) -> str:
    if sep and not whole_paths and is_path_key(key.lstrip("+~").rsplit(".", 1)[-1]):
        value = ",".join(_file_label(v) for v in value.split(","))
    return _item_name(key, sep, value)


def job_name(overrides, exclude_keys=(), item_sep: str = ",", kv_sep: str = "=", whole_paths: bool = False) -> str:
    """A sweep job's folder: Hydra's override_dirname (the job's overrides but exclude_keys, sorted) with each
    override made one path component as in sweep_name, so `backend/cost_model=calibrated` no longer nests folders,
    and a file in a folder named by `_file_label`. Identical to override_dirname for overrides without such
    characters (the folders of earlier sweeps). whole_paths: a file's whole path, `/` as `_` (the folders that
    sweeps launched before `_file_label` made, which a relaunch still resumes)."""
    from hydra.core.override_parser.overrides_parser import OverridesParser

    parsed = OverridesParser.create().parse_overrides([str(o) for o in overrides])
    lines = sorted(o.input_line for o in parsed if o.key_or_group not in set(exclude_keys))
    name = item_sep.join(_job_item(*line.partition("="), whole_paths=whole_paths) for line in lines)
    return safe_name(re.sub("=", kv_sep, name), MAX_JOB_NAME_CHARS)


def job_dir(*, _root_) -> str:
    """hydra.sweep.subdir (conf/config.yaml): the job's job_name, or the folder an earlier naming gave the same job
    when that one holds its results already, so a sweep launched before resumes there: files by their whole path,
    or Hydra's own override_dirname (nested folders, before job names were sanitized)."""
    hc = _root_.hydra
    conf = hc.job.config.override_dirname
    name = job_name(hc.overrides.task, conf.exclude_keys, conf.item_sep, conf.kv_sep)
    earlier = (job_name(hc.overrides.task, conf.exclude_keys, conf.item_sep, conf.kv_sep, whole_paths=True),
               str(hc.job.override_dirname))
    for legacy in earlier:
        if legacy and legacy != name and holds_results(Path(str(hc.sweep.dir)) / legacy):
            return legacy
    return name


def register_resolvers() -> None:
    OmegaConf.register_new_resolver("servelab_unique_dir", unique_dir, use_cache=True, replace=True)
    OmegaConf.register_new_resolver("servelab_job_dir", job_dir, replace=True)


register_resolvers()


def holds_results(folder) -> bool:
    return any((Path(folder) / f).exists() for f in RESULT_FILES)


def sweep_held(folder) -> str | None:
    """What makes `folder` hold a sweep (its multirun.yaml, or a job folder with a summary.json below it), or None.
    Hidden folders (.hydra, .submitit, .git, .venv) are not searched."""
    folder = Path(folder)
    if (folder / "multirun.yaml").is_file():
        return "multirun.yaml"
    if not folder.is_dir():
        return None
    for parent, dirs, files in os.walk(folder):
        dirs[:] = sorted(d for d in dirs if not d.startswith("."))
        if parent != str(folder) and SUMMARY in files:
            return f"job folder {Path(parent).relative_to(folder)} with a {SUMMARY}"
    return None


class OutputGuard(Callback):
    """Refuses a single run into a folder that holds results; records where the command writes."""

    def on_run_start(self, config, **kwargs) -> None:
        run_dir = str(config.hydra.run.dir)
        _last_output["run"] = run_dir
        _created_run[:] = _made_by_unique_dir.get(run_dir) or _missing_folders(Path(run_dir))
        # Hydra turns a callback's Exception into a warning and goes on: stop here (fail), before it writes.
        if holds_results(run_dir):
            fail(f"hydra.run.dir={run_dir} already holds results ({SUMMARY}); give another folder, or delete "
                 "that one to run again (a sweep, -m, resumes instead)")
        sweep = sweep_held(run_dir)
        if sweep:
            fail(f"hydra.run.dir={run_dir} holds a sweep ({sweep}); a single run writes into a folder of its own: "
                 "give another folder (servelab-report reads the sweep; servelab -m ... adds jobs to it)")

    def on_multirun_start(self, config, **kwargs) -> None:
        hydra_overrides = list(config.hydra.overrides.hydra)
        given = any(str(o).lstrip("+~").startswith("hydra.sweep.dir=") for o in hydra_overrides)
        if not given and config.name == "default":
            # Each job's config is composed again from the master's hydra overrides plus the job's own
            # (which no longer hold the comma lists), so the folder travels as one more hydra override.
            sweep_dir = str(Path(str(config.hydra.sweep.dir)).parent / sweep_name(config.name,
                                                                                   config.hydra.overrides.task))
            with read_write(config.hydra), open_dict(config.hydra):
                config.hydra.sweep.dir = sweep_dir
                config.hydra.overrides.hydra.append(f"hydra.sweep.dir='{sweep_dir}'")
        _last_output["sweep"] = str(config.hydra.sweep.dir)
        # the folders this launch creates (Hydra makes them next, parents first): removed again by
        # remove_unused_sweep when the launch fails before any job wrote into them
        _created_sweep[:] = _missing_folders(Path(str(config.hydra.sweep.dir)))
        print(f"sweep folder: {config.hydra.sweep.dir}", flush=True)
        kept = keep_changed_multirun(Path(str(config.hydra.sweep.dir)), OmegaConf.to_yaml(config))
        if kept:
            print(f"multirun.yaml: this launch's config differs from the one in {config.hydra.sweep.dir}; the earlier "
                  f"one is kept as {kept}", flush=True)


def keep_changed_multirun(sweep_dir: Path, new_text: str) -> Path | None:
    """Before Hydra writes this launch's multirun.yaml (its sweeper saves the config a multirun callback gets,
    `new_text`): an earlier one with other content (a relaunch with more values, other overrides) is renamed to
    multirun.<N>.yaml and that name returned, so a sweep's folder keeps the record of every launch that wrote
    into it; an identical one (the same command again) is left as it is. Returns None when nothing was kept."""
    earlier = sweep_dir / "multirun.yaml"
    if not earlier.is_file() or earlier.read_text(encoding="utf-8") == new_text:
        return None
    kept = kept_name(earlier)
    earlier.rename(kept)
    return kept


def _missing_folders(folder: Path) -> list[Path]:
    """folder and its parents that do not exist yet, deepest first: what Hydra is about to create."""
    created = []
    while not folder.exists() and folder != folder.parent:
        created.append(folder)
        folder = folder.parent
    return created


def _remove_created(created: list[Path]) -> None:
    """rmdir each folder of `created` (deepest first), stopping at the first that is not empty."""
    for folder in created:
        try:
            folder.rmdir()
        except OSError:       # not empty (something else wrote there meanwhile): keep it and its parents
            break
    created.clear()


def _close_log_files(folder: Path) -> None:
    """Close and detach the logging file handlers writing into folder (Hydra's job log, servelab.log): a handler
    left on a removed file would fail at its next record (in-process callers: tests, a server started later)."""
    import logging
    loggers = [logging.getLogger(), *(lg for lg in logging.Logger.manager.loggerDict.values()
                                      if isinstance(lg, logging.Logger))]
    for logger in loggers:
        for handler in list(logger.handlers):
            name = getattr(handler, "baseFilename", None)
            if name and Path(name).parent == folder.resolve():
                logger.removeHandler(handler)
                handler.close()


def remove_unused_run() -> str | None:
    """After a single run failed: removes its folder when the run wrote nothing there but Hydra's .hydra/ and an
    empty servelab.log (a refused setting or input), and the parent folders created with it that are left empty,
    so that a mistake leaves no folder that looks like a run; returns it. A folder with anything else is kept."""
    if not _created_run:
        return None
    root = _created_run[0]
    if not root.is_dir():
        return None
    for entry in root.iterdir():
        if entry.name == "servelab.log" and entry.is_file() and entry.stat().st_size == 0:
            continue
        if entry.name == ".hydra" and entry.is_dir() and all(p.is_file() and p.suffix == ".yaml"
                                                             for p in entry.iterdir()):
            continue
        return None
    _close_log_files(root)
    shutil.rmtree(root)
    _remove_created(_created_run[1:])      # the parents it made, left empty
    _created_run.clear()
    return str(root)


def remove_unused_sweep() -> str | None:
    """After a failed launch: removes the sweep folder this command created when it holds nothing but Hydra's
    multirun.yaml (no job started), and the parent folders created with it that are left empty; returns it."""
    if not _created_sweep:
        return None
    root = _created_sweep[0]
    if not root.is_dir() or any(p.name != "multirun.yaml" for p in root.iterdir()):
        return None
    (root / "multirun.yaml").unlink(missing_ok=True)
    _remove_created(_created_sweep)
    return str(root)


def sweep_folder() -> str | None:
    """The sweep folder this command writes into (None before a sweep started, or for a single run)."""
    return _last_output.get("sweep")


def interrupted_message() -> str:
    """What an interrupted command left on disk, read from the folder it was writing into."""
    if "sweep" in _last_output:
        root = Path(_last_output["sweep"])
        summaries = [read_summary(p.parent) for p in root.rglob(SUMMARY)] if root.is_dir() else []
        done = sum(1 for s in summaries if s and s.get("complete") is True)
        partial = len(summaries) - done
        if not partial and root.is_dir() and not failed_jobs(root):
            return f"interrupted after every job finished: sweep {root} holds {done} complete job(s)"
        return (f"interrupted: sweep {root} holds {done} complete job(s) and {partial} interrupted one(s) "
                f"(summary.json complete=false, partial results); jobs without a summary.json wrote nothing. "
                "Relaunch the same command to finish it: complete jobs are skipped")
    if "run" in _last_output:
        run_dir = Path(_last_output["run"])
        if not run_dir.exists():        # remove_unused_run took the folder Hydra made: nothing was in it
            return f"interrupted: no results were written (the empty folder {run_dir} is removed)"
        s = read_summary(run_dir)
        if s is not None and s.get("complete") is True:
            return f"interrupted after the run finished: its complete results are in {run_dir}"
        if s is not None and s.get("complete") is False:
            n = (s.get("metrics") or {}).get("num_finished")
            return (f"interrupted: the {n} requests finished so far were written to {run_dir} "
                    "(summary.json complete=false); run the command again for complete results (in a new folder: "
                    "a run never writes into one that holds results)")
        return f"interrupted: no results were written ({run_dir} holds no summary.json)"
    return "interrupted before any run started: nothing was written"
