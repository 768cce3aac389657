"""A run's output folder: atomic writes and the "already done?" test that makes sweeps resumable.

Layout of one run's folder (Hydra's output dir):

    requests.parquet     per-request table (docs/metrics.md)
    steps.parquet        per-step table
    token_times.parquet  only with record_token_times=true
    config.yaml          the composed config, interpolations resolved
    summary.json         {"complete", "run_id", "meta", "metrics", ...}; written LAST
    latency_cdf.png, step_timeline.png   (plots=true)

Every file is written to a temporary name in the same folder and moved into
place with os.replace, so a reader (or a relaunched sweep) never sees half a
file. summary.json is the commit marker: a folder whose summary.json says
complete=true is finished and a relaunch skips it; an interrupted run writes
its partial tables with complete=false, and a relaunch runs it again.
"""
from __future__ import annotations

import json
import math
import os
import tempfile
import uuid
from contextlib import contextmanager
from datetime import datetime, timezone
from pathlib import Path

SUMMARY = "summary.json"


_UMASK = os.umask(0)       # the process's umask, read once (reading it means setting it)
os.umask(_UMASK)


@contextmanager
def _atomic_target(path):
    """Yields a temporary name beside `path`; on success it is moved onto `path`, on any
    error (Ctrl-C included) it is removed, so readers never see half a file."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    os.close(fd)
    os.chmod(tmp, 0o666 & ~_UMASK)      # mkstemp's 0600 would keep the results from the user's group
    try:
        yield tmp
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise


def atomic_write_bytes(path, data: bytes) -> Path:
    with _atomic_target(path) as tmp, open(tmp, "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())
    return Path(path)


def atomic_write_text(path, text: str) -> Path:
    return atomic_write_bytes(path, text.encode("utf-8"))


def _jsonable(x):
    """Plain JSON: numpy scalars to Python, NaN/inf to null (strict JSON has neither)."""
    if isinstance(x, dict):
        return {str(k): _jsonable(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [_jsonable(v) for v in x]
    if hasattr(x, "item") and not isinstance(x, (str, bytes)):
        x = x.item()
    if isinstance(x, float) and not math.isfinite(x):
        return None
    return x


def write_json(path, obj) -> Path:
    return atomic_write_text(path, json.dumps(_jsonable(obj), indent=2, allow_nan=False) + "\n")


def write_parquet(df, path) -> Path:
    # zstd: a steps table ~22% smaller than parquet's default snappy and no slower to write (kept real runs travel
    # to the GPU machine and live in the repository)
    with _atomic_target(path) as tmp:
        df.to_parquet(tmp, index=False, compression="zstd")
    return Path(path)


def read_summary(run_dir) -> dict | None:
    """The run's summary.json, or None when missing or unreadable."""
    p = Path(run_dir) / SUMMARY
    try:
        return json.loads(p.read_text(encoding="utf-8"))
    except (FileNotFoundError, json.JSONDecodeError):
        return None


def is_complete(run_dir) -> bool:
    s = read_summary(run_dir)
    return bool(s and s.get("complete") is True)


# Keys that do not change a run's results (ignored when a relaunch compares configs).
NON_RESULT_KEYS = frozenset({"resume", "progress", "plots", "print_summary"})


def config_diff(saved: dict, current: dict, prefix: str = "") -> list[str]:
    """Dotted keys whose values differ between two resolved configs (file paths compared by file name)."""
    out = []
    for k in sorted(set(saved) | set(current)):
        if not prefix and k in NON_RESULT_KEYS:
            continue
        a, b = saved.get(k), current.get(k)
        key = f"{prefix}{k}"
        if isinstance(a, dict) and isinstance(b, dict):
            out += config_diff(a, b, key + ".")
        elif k == "path" and isinstance(a, str) and isinstance(b, str):
            if Path(a).name != Path(b).name:
                out.append(key)
        elif a != b:
            out.append(key)
    return out


def saved_config(run_dir) -> dict | None:
    import yaml
    p = Path(run_dir) / "config.yaml"
    return yaml.safe_load(p.read_text(encoding="utf-8")) if p.is_file() else None


def save_run(run_dir, result, metrics: dict, config_yaml: str, extra: dict | None = None,
             before_summary=None) -> dict:
    """Write the tables, the resolved config, then `before_summary(run_dir)` (plots), and last
    summary.json; returns the summary."""
    run_dir = Path(run_dir)
    write_parquet(result.requests, run_dir / "requests.parquet")
    write_parquet(result.steps, run_dir / "steps.parquet")
    if result.token_times is not None:
        write_parquet(result.token_times, run_dir / "token_times.parquet")
    atomic_write_text(run_dir / "config.yaml", config_yaml)
    if before_summary is not None:
        before_summary(run_dir)
    summary = {
        "complete": bool(result.complete),
        "run_id": uuid.uuid4().hex,
        "finished_at": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        **(extra or {}),
        "meta": result.meta,
        "metrics": metrics,
    }
    write_json(run_dir / SUMMARY, summary)
    return summary
