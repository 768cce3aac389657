"""Fits from several machines on several machines' kept runs, one row each: how far one calibration carries.

    python benchmarks/fit_matrix.py FIT_NAME:RUNS_NAME:GENERALIZE_DIR ... [--out fit_matrix.md]

Each GENERALIZE_DIR is an `experiments.generalize --out` folder (its generalize.json names the fit it used). A row
gives the fit's own doubts (sim/cost_model/fit_trust.py: its device model's held-out sum, its synchronous replays'
largest drift), the suite's E2E median |error| (cells within 3%, median, max), step sums within 1.5%, and the
policy pairs whose real difference exceeds twice its noise band: sign and size agreeing, sign right, sign wrong.
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import pandas as pd

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from sim.cost_model.fit_trust import fit_concerns  # noqa: E402


def matrix_row(fit: str, runs: str, folder: Path) -> dict:
    g = json.loads((folder / "generalize.json").read_text())
    s, d = g["summary"], g["policy_diff_summary"]
    meta = json.loads(Path(g["profile"]).read_text()).get("metadata", {})
    drift = [v["range"] for v in (meta.get("replay_drift") or {}).values()]
    n = s["num_cells"]
    dev = (meta.get("device_heldout") or {}).get("sum_pred_over_real", float("nan"))
    pairs = (f"{d['num_significant_agree']} / {d['num_significant_sign_right']} / "
             f"{d['verdicts'].get('wrong sign', 0)} of {d['num_significant']}")
    return {"fit": fit, "runs": runs, "fit's device held-out sum": f"{dev:.3f}",
            "fit's replay drift": f"{100 * max(drift):.1f}%" if drift else "-",
            "E2E within 3%": f"{s['cells_e2e_goal']} / {n}",
            "E2E error median / max": f"{100 * s['e2e_median_err_median']:.1f}% / {100 * s['e2e_median_err_max']:.1f}%",
            "step sums within 1.5%": f"{s['cells_step_sum_goal']} / {n}",
            "significant pairs: agree / sign / wrong": pairs,
            "concerns": len(fit_concerns(meta, overlapped=True))}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("cells", nargs="+", metavar="FIT:RUNS:DIR")
    ap.add_argument("--out", default=None, help="also write the table here (markdown)")
    args = ap.parse_args(argv)
    rows = []
    for cell in args.cells:
        fit, runs, folder = cell.split(":", 2)
        if not (Path(folder) / "generalize.json").is_file():
            raise SystemExit(f"{cell}: no generalize.json in {folder} (give an experiments.generalize --out folder)")
        rows.append(matrix_row(fit, runs, Path(folder)))
    text = pd.DataFrame(rows).to_markdown(index=False, disable_numparse=True)
    print(text)
    if args.out:
        Path(args.out).write_text(text + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
