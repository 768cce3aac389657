"""Fit the `calibrated` cost model to a per-step timing table and save it as a small JSON.

    python -m experiments.calibrate table.csv [more.csv ...] --out profile.json [--hardware H200] [--model Qwen3-0.6B]

Input: tables with the columns of sim.cost_model.base.STEP_TABLE_COLUMNS, i.e.
a profile (experiments.profile) or the steps table of a real run (engine
recorder; CSV or parquet). The fit runs on a random 80% of the rows and the
other 20% measure the held-out error (median and p90 of |predicted - measured|
/ measured); then the model is refitted on all rows and saved with that error,
the command, the fit date and the profile's metadata (device, model) from
`<table>.meta.json` when present.
"""
from __future__ import annotations

import argparse
import json
import shlex
import sys
from pathlib import Path

import numpy as np
import pandas as pd

from sim.cost_model.calibrated import KNEE_CANDIDATES, CalibratedCostModel, relative_errors


def read_table(path) -> pd.DataFrame:
    p = Path(path)
    if not p.is_file():
        raise FileNotFoundError(f"step table not found: {p}")
    return pd.read_parquet(p) if p.suffix == ".parquet" else pd.read_csv(p)


def heldout_split(n: int, fraction: float, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """(train, test) row indices: a random `fraction` of rows held out, at least one row each."""
    if not 0.0 < fraction < 1.0:
        raise ValueError(f"heldout fraction must be in (0, 1), got {fraction}")
    perm = np.random.default_rng(seed).permutation(n)
    k = min(max(1, int(round(fraction * n))), n - 1)
    return np.sort(perm[k:]), np.sort(perm[:k])


def error_stats(pred: np.ndarray, true: np.ndarray) -> dict:
    e = relative_errors(pred, true)
    return {"median_rel_err": float(np.median(e)), "p90_rel_err": float(np.percentile(e, 90)),
            "max_rel_err": float(e.max()), "num_rows": int(len(e))}


def calibrate(table: pd.DataFrame, *, heldout_fraction: float = 0.2, seed: int = 0,
              knee_candidates=KNEE_CANDIDATES, metadata: dict | None = None) -> tuple[CalibratedCostModel, dict]:
    """Held-out error of a fit on the rest, then the model refitted on every row; returns (model, report)."""
    table = table[np.isfinite(table["duration_s"]) & (table["duration_s"] > 0)].reset_index(drop=True)
    train, test = heldout_split(len(table), heldout_fraction, seed)
    part = CalibratedCostModel.fit(table.iloc[train], knee_candidates=knee_candidates)
    heldout = error_stats(part.predict_table(table.iloc[test]), table["duration_s"].to_numpy()[test])
    heldout.update(fraction=heldout_fraction, seed=seed)
    meta = dict(metadata or {})
    meta["heldout"] = heldout
    model = CalibratedCostModel.fit(table, knee_candidates=knee_candidates, metadata=meta)
    model.metadata["train_error_all_rows"] = error_stats(model.predict_table(table), table["duration_s"].to_numpy())
    return model, {"heldout": heldout, "train": model.metadata["train_error_all_rows"]}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m experiments.calibrate", description=__doc__.split("\n")[0])
    ap.add_argument("tables", nargs="+", help="step tables (CSV or parquet) with STEP_TABLE_COLUMNS")
    ap.add_argument("--out", required=True, help="output JSON (written atomically)")
    ap.add_argument("--hardware", default=None, help="hardware name to record (default: the profile's device)")
    ap.add_argument("--model", default=None, help="model name to record (default: the profile's model path)")
    ap.add_argument("--heldout", type=float, default=0.2, help="fraction of rows held out (default 0.2)")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args(argv)

    frames, sources = [], []
    for t in args.tables:
        df = read_table(t)
        frames.append(df)
        meta_path = Path(str(t) + ".meta.json")
        src = {"table": str(t), "rows": int(len(df))}
        if meta_path.is_file():
            src["profile"] = json.loads(meta_path.read_text())
        sources.append(src)
    table = pd.concat(frames, ignore_index=True)
    prof = next((s["profile"] for s in sources if "profile" in s), {})
    meta = {
        "hardware": args.hardware or prof.get("device", "unknown"),
        "device": prof.get("device"),
        "model": args.model or prof.get("model_path", "unknown"),
        "model_dims": prof.get("model"),
        "dtype": prof.get("dtype"),
        "attention_backend": prof.get("attention_backend"),
        "cuda_graphs": prof.get("cuda_graphs"),
        "command": "python -m experiments.calibrate " + " ".join(shlex.quote(a) for a in (argv or sys.argv[1:])),
        "profile_command": prof.get("command"),
        "profile_date": prof.get("date"),
        "sources": [{k: v for k, v in s.items() if k != "profile"} for s in sources],
    }
    model, report = calibrate(table, heldout_fraction=args.heldout, seed=args.seed, metadata=meta)
    model.save(args.out)
    h, tr = report["heldout"], report["train"]
    print(f"{model!r}")
    print(f"held-out ({h['num_rows']} rows): median |rel err| {100 * h['median_rel_err']:.1f}%, "
          f"p90 {100 * h['p90_rel_err']:.1f}%; all rows after refit: median {100 * tr['median_rel_err']:.1f}%, "
          f"p90 {100 * tr['p90_rel_err']:.1f}%")
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
