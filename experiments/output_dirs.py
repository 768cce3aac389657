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
  it left behind (`interrupted_message`).
"""
from __future__ import annotations

import hashlib
import os
import re
from pathlib import Path

from hydra.experimental.callback import Callback
from omegaconf import OmegaConf, open_dict, read_write

from experiments.results import NON_RESULT_KEYS, SUMMARY, read_summary
from experiments.user_errors import fail

# Files whose presence means a folder holds a run's results (summary.json is written last).
RESULT_FILES = (SUMMARY, "requests.parquet")
MAX_NAME_CHARS = 120          # one path component; file systems allow 255 bytes

_created: dict[str, str] = {}         # base -> folder created for it in this process
_last_output: dict[str, str] = {}     # "run" or "sweep" -> the folder this command writes into


def unique_dir(base: str) -> str:
    """Create `base` (or `base_2`, `base_3`, ... when it exists) and return it; the same answer for the
    same base within one process (Hydra resolves hydra.run.dir more than once)."""
    if base in _created:
        return _created[base]
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
    return candidate


def _clean(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9._,=+@-]", "_", text)


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
        if bare.endswith("path") and sep:       # a file: its name, not its folders
            value = ",".join(Path(v.strip("'\"")).name for v in value.split(","))
        items.append(_clean(f"{bare.replace('/', '.')}{sep}{value}"))
    return safe_name("+".join(sorted(items)) or "default")


def safe_name(text: str) -> str:
    """text as one path component: odd characters replaced, cut to MAX_NAME_CHARS with a hash of the whole."""
    text = _clean(text)
    if len(text) > MAX_NAME_CHARS:
        digest = hashlib.sha1(text.encode()).hexdigest()[:8]
        text = f"{text[:MAX_NAME_CHARS - 9]}_{digest}"
    return text


def register_resolvers() -> None:
    OmegaConf.register_new_resolver("servelab_unique_dir", unique_dir, use_cache=True, replace=True)


register_resolvers()


def holds_results(folder) -> bool:
    return any((Path(folder) / f).exists() for f in RESULT_FILES)


class OutputGuard(Callback):
    """Refuses a single run into a folder that holds results; records where the command writes."""

    def on_run_start(self, config, **kwargs) -> None:
        run_dir = str(config.hydra.run.dir)
        _last_output["run"] = run_dir
        if holds_results(run_dir):
            # Hydra turns a callback's Exception into a warning and goes on: stop here, before it writes.
            fail(f"hydra.run.dir={run_dir} already holds results ({SUMMARY}); give another folder, or delete "
                 "that one to run again (a sweep, -m, resumes instead)")

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
        print(f"sweep folder: {config.hydra.sweep.dir}", flush=True)


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
        return (f"interrupted: sweep {root} holds {done} complete job(s) and {partial} interrupted one(s) "
                f"(summary.json complete=false, partial results); jobs without a summary.json wrote nothing. "
                "Relaunch the same command to finish it: complete jobs are skipped")
    if "run" in _last_output:
        run_dir = Path(_last_output["run"])
        s = read_summary(run_dir)
        if s is not None and s.get("complete") is False:
            n = (s.get("metrics") or {}).get("num_finished")
            return (f"interrupted: the {n} requests finished so far were written to {run_dir} "
                    "(summary.json complete=false); run the command again for complete results (in a new folder: "
                    "a run never writes into one that holds results)")
        return f"interrupted: no results were written ({run_dir} holds no summary.json)"
    return "interrupted before any run started: nothing was written"
