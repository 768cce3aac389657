"""Reading trace files column by column, with errors that name file, line and column.

Rows are split by the csv / json modules (so line numbers are exact), values are
converted and checked vectorized with numpy (pandas, imported only then, parses
what numpy cannot: text that is not a plain number or timestamp). With on_error="raise" the
first bad row in file order raises WorkloadFormatError; with "skip" bad rows are
dropped and counted in WorkloadStats.
"""
from __future__ import annotations

import csv
import json
import re
from pathlib import Path

import numpy as np

from engine.core.requests import WorkloadFormatError, WorkloadStats

ON_ERROR_MODES = ("raise", "skip")
# kind -> (what a good value is, for messages)
KINDS = {
    "count": "an integer >= 1",
    "time": "a finite number >= 0",
    "timestamp": "a timestamp like 2023-11-16 18:15:46.6805900",
    "text": "a non-empty text (e.g. a tenant id)",
    "slo": "a finite number of seconds > 0, or empty for no target",
}
# Timestamps numpy's datetime64 parser reads exactly as pandas' ISO8601 parser does (no zone, <= ns).
_PLAIN_TIMESTAMP = re.compile(r"\d{4}-\d\d-\d\d[ T]\d\d:\d\d:\d\d(?:\.\d{1,9})?")


def check_on_error(on_error: str) -> None:
    if on_error not in ON_ERROR_MODES:
        raise ValueError(f"on_error must be one of {ON_ERROR_MODES}, got {on_error!r}")


def _convert(values, kind: str) -> tuple[np.ndarray, np.ndarray]:
    """Returns (converted values, bad mask). values: a numeric or datetime64 array (converted
    with numpy), or strings (converted with pandas)."""
    typed = isinstance(values, np.ndarray) and values.dtype.kind in "iufM"
    if kind == "text":
        text = np.asarray([str(v).strip() for v in values], dtype=object)
        return text, np.asarray([not t for t in text.tolist()], dtype=bool)
    if kind == "slo":
        empty = np.asarray([v is None or (isinstance(v, str) and not v.strip()) for v in values], dtype=bool)
        x = pd_numeric(["0" if e else v for v, e in zip(values, empty)])
        with np.errstate(invalid="ignore"):
            bad = ~empty & ~(np.isfinite(x) & (x > 0))
        return np.where(empty | bad, np.nan, x), bad
    if kind == "timestamp":
        if typed:
            t = values.astype("datetime64[ns]")
            bad = np.isnat(t)
            ns = t.view(np.int64)
        else:
            import pandas as pd
            t = pd.to_datetime(pd.Series(values, dtype=object), format="ISO8601", errors="coerce")
            bad = t.isna().to_numpy()
            ns = t.to_numpy(dtype="datetime64[ns]").view(np.int64)
        if not (~bad).any():
            return np.zeros(len(values)), bad
        # seconds since the earliest valid timestamp, whole seconds and the remainder divided
        # separately (as pandas' total_seconds: exact to the last bit for spans under 2**53 s)
        whole, rest = np.divmod(ns - ns[~bad].min(), 1_000_000_000)
        return whole + rest / 1_000_000_000, bad
    if typed:
        x = values.astype(np.float64)
    else:
        import pandas as pd
        x = pd.to_numeric(pd.Series(values, dtype=object), errors="coerce").to_numpy(dtype=np.float64)
    with np.errstate(invalid="ignore"):
        if kind == "count":
            bad = ~np.isfinite(x) | (x < 1) | (x != np.floor(x))
            return np.where(bad, 1, x).astype(np.int64), bad
        if kind == "time":
            bad = ~np.isfinite(x) | (x < 0)
            return np.where(bad, 0.0, x), bad
    raise ValueError(f"unknown column kind {kind!r}; allowed: {sorted(KINDS)}")


def pd_numeric(values) -> np.ndarray:
    """values (numbers or numeric text) as float64, NaN where a value is not a number."""
    import pandas as pd
    return pd.to_numeric(pd.Series(list(values), dtype=object), errors="coerce").to_numpy(dtype=np.float64)


def _resolve(columns: dict[str, str], raw: dict[str, list], lines: np.ndarray, row_errors: list,
             path, on_error: str, stats: WorkloadStats) -> tuple[dict[str, np.ndarray], np.ndarray]:
    """Convert raw string columns; raise on or skip bad rows (earliest line first)."""
    out, bad_any = {}, np.zeros(len(lines), dtype=bool)
    cell_errors = []        # (line, column, message)
    for name, kind in columns.items():
        vals, bad = _convert(raw[name], kind)
        out[name] = vals
        if bad.any():
            i = int(np.argmax(bad))
            cell_errors.append((int(lines[i]), name, f"invalid value {raw[name][i]!r}; expected {KINDS[kind]}"))
            bad_any |= bad
    if on_error == "raise" and (cell_errors or row_errors):
        raise WorkloadFormatError(path, *min(cell_errors + row_errors, key=lambda e: e[0]))
    for line in sorted([e[0] for e in row_errors] + lines[bad_any].tolist()):
        stats.note_skip(line)
    if bad_any.any():
        keep = ~bad_any
        out = {k: v[keep] for k, v in out.items()}
        lines = lines[keep]
    return out, lines


def _read_csv_fast(path, header: list[str], columns) -> dict | None:
    """The columns as numpy arrays (float64 numbers, datetime64 timestamps), if every line is a
    complete row of plain numbers and timestamps; else None (the line-by-line reader then finds
    and names the bad rows)."""
    with open(path, newline="", encoding="utf-8") as f:
        reader = csv.reader(f)
        next(reader)
        rows = list(reader)
    nfields = len(header)
    if any(len(row) != nfields for row in rows):
        return None
    out = {}
    for c, kind in columns.items():
        i = header.index(c)
        col = [row[i] for row in rows]
        try:
            if kind == "timestamp":
                if not all(map(_PLAIN_TIMESTAMP.fullmatch, col)):
                    return None
                out[c] = np.array(col, dtype="datetime64[ns]")
            elif kind in ("text", "slo"):
                out[c] = col        # converted (and checked) by _convert
            else:
                out[c] = np.array(col, dtype=str).astype(np.float64)
        except ValueError:
            return None
    return out


def read_csv_columns(path, columns: dict[str, str], on_error: str = "raise"):
    """Read the named columns of a CSV with a header line.

    columns: name -> kind (see KINDS). Returns (dict name -> array, source_line
    array [n] of 1-based file lines, WorkloadStats). Extra columns are ignored.
    """
    check_on_error(on_error)
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"trace file not found: {path}")
    stats = WorkloadStats(source=str(path))
    with open(path, newline="", encoding="utf-8") as f:
        reader = csv.reader(f)
        header = next(reader, None)
        if header is None:
            raise WorkloadFormatError(path, 1, None, "file is empty; expected a header line")
        header = [h.strip() for h in header]
        missing = [c for c in columns if c not in header]
        if missing:
            raise WorkloadFormatError(path, 1, missing[0], f"missing column; the header has {header}, "
                                                          f"this format needs {list(columns)}")
        idx = [header.index(c) for c in columns]
        nfields = len(header)
    fast = _read_csv_fast(path, header, columns)
    if fast is not None:
        # Well-formed rows (row i is line i + 2). Any bad value sends us to
        # the line-by-line reader below, whose line numbers are exact.
        n = len(fast[next(iter(columns))])
        try:
            out, lines = _resolve(columns, fast, np.arange(2, n + 2, dtype=np.int64), [], path, "raise", stats)
            stats.num_rows_read = n
            return out, lines, stats
        except WorkloadFormatError:
            pass
    with open(path, newline="", encoding="utf-8") as f:
        reader = csv.reader(f)
        next(reader)
        raw_rows, lines, row_errors = [], [], []
        for row in reader:
            if not row or (len(row) == 1 and not row[0].strip()):
                stats.num_blank_lines += 1
                continue
            stats.num_rows_read += 1
            if len(row) != nfields:
                row_errors.append((reader.line_num, None, f"expected {nfields} fields ({','.join(header)}), "
                                                          f"got {len(row)}: {','.join(row)!r}"))
                continue
            raw_rows.append([row[i] for i in idx])
            lines.append(reader.line_num)
    cols = list(zip(*raw_rows)) if raw_rows else [()] * len(columns)
    raw = {name: list(col) for name, col in zip(columns, cols)}
    return (*_resolve(columns, raw, np.asarray(lines, dtype=np.int64), row_errors, path, on_error, stats), stats)


def read_jsonl_columns(path, columns: dict[str, str], list_column: str | None = None, on_error: str = "raise"):
    """Read a JSON-lines file: one object per line with the numeric `columns` and
    optionally one list-of-ints field `list_column` (returned as tuples)."""
    check_on_error(on_error)
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"trace file not found: {path}")
    stats = WorkloadStats(source=str(path))
    raw = {c: [] for c in columns}
    lists, lines, row_errors = [], [], []
    with open(path, encoding="utf-8") as f:
        for lineno, text in enumerate(f, start=1):
            if not text.strip():
                stats.num_blank_lines += 1
                continue
            stats.num_rows_read += 1
            try:
                obj = json.loads(text)
            except json.JSONDecodeError as e:
                row_errors.append((lineno, None, f"invalid JSON ({e.msg} at character {e.pos})"))
                continue
            if not isinstance(obj, dict):
                row_errors.append((lineno, None, f"expected a JSON object, got {type(obj).__name__}"))
                continue
            missing = [c for c in (*columns, *([list_column] if list_column else [])) if c not in obj]
            if missing:
                row_errors.append((lineno, missing[0], f"missing field; the object has {sorted(obj)}"))
                continue
            if list_column is not None:
                h = obj[list_column]
                if not isinstance(h, list) or not all(type(x) is int and x >= 0 for x in h):
                    row_errors.append((lineno, list_column, f"expected a list of integers >= 0, got {str(h)[:80]}"))
                    continue
                lists.append(tuple(h))
            for c, kind in columns.items():
                v = obj[c]
                if kind == "text" and isinstance(v, (str, int)) and not isinstance(v, bool):
                    raw[c].append(str(v))
                elif kind == "slo" and v is None:
                    raw[c].append(None)          # JSON null: no target
                else:
                    raw[c].append(v if isinstance(v, (int, float)) and not isinstance(v, bool) else repr(v))
            lines.append(lineno)
    lines_arr = np.asarray(lines, dtype=np.int64)
    out, kept = _resolve(columns, raw, lines_arr, row_errors, path, on_error, stats)
    if list_column is not None:
        if len(kept) != len(lines_arr):
            keep_set = set(kept.tolist())
            lists = [h for h, ln in zip(lists, lines) if ln in keep_set]
        out[list_column] = lists
    return out, kept, stats
