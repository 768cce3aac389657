"""What a trace format module declares (one module per format in experiments/workloads/formats/)."""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Callable


@dataclass(frozen=True)
class TraceFormat:
    """name: what `read_trace(path, format=name)` and detect_format call it; description: how an error
    names such a file; reader: the function a conf/workload YAML names as `_target_` (it reads the file
    into a Workload); matches(path, header, first_line): whether a file is of this format (header: the
    first line split at commas, stripped), asked in detect_order (lower first); has_arrivals: False for
    a lengths-only file, which read_trace cannot turn into a workload by itself."""
    name: str
    description: str
    reader: Callable
    matches: Callable[[Path, list, str], bool]
    detect_order: int = 10
    has_arrivals: bool = True
