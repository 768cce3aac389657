"""Where the earlier version of a file or folder goes when a command would replace it: beside it, numbered.

    kept_name("sweeps/x/multirun.yaml")   -> sweeps/x/multirun.1.yaml   (then multirun.2.yaml, ...)
    kept_name("sweeps/x/report")          -> sweeps/x/report.1          (a folder: the number at the end)

A relaunched sweep whose multirun.yaml would change (experiments/output_dirs.py) and a report whose files
would change (experiments/report.py) keep the earlier one under this name, so what a finished launch or report
recorded is never overwritten. The number is one above the highest kept so far, so the numbers follow the
order the copies were made in even after one is deleted.
"""
from __future__ import annotations

import re
from pathlib import Path


def kept_name(path) -> Path:
    """The name to keep the earlier `path` under (nothing is moved or created here)."""
    path = Path(path)
    stem, suffix = (path.name, "") if path.is_dir() or not path.suffix else (path.stem, path.suffix)
    pattern = re.compile(rf"{re.escape(stem)}\.(\d+){re.escape(suffix)}")
    taken = [int(m.group(1)) for p in path.parent.iterdir() if (m := pattern.fullmatch(p.name))] \
        if path.parent.is_dir() else []
    return path.with_name(f"{stem}.{max(taken, default=0) + 1}{suffix}")
