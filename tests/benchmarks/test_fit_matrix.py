"""benchmarks/fit_matrix.py: one row per fit and machine's runs, read from experiments.generalize's outputs."""
import importlib.util
import json
from pathlib import Path

import pytest

_SPEC = importlib.util.spec_from_file_location(
    "fit_matrix", Path(__file__).resolve().parents[2] / "benchmarks" / "fit_matrix.py")
fit_matrix = importlib.util.module_from_spec(_SPEC)
_SPEC.loader.exec_module(fit_matrix)
main, matrix_row = fit_matrix.main, fit_matrix.matrix_row


def suite(tmp_path, name, dev_sum, drift, within):
    profile = tmp_path / f"{name}.json"
    profile.write_text(json.dumps({"metadata": {
        "device_heldout": {"sum_pred_over_real": dev_sum},
        "replay_drift": {"a.parquet": {"range": 0.01}, "b.parquet": {"range": drift}}}}))
    folder = tmp_path / f"{name}_out"
    folder.mkdir()
    (folder / "generalize.json").write_text(json.dumps({
        "profile": str(profile),
        "summary": {"num_cells": 12, "cells_e2e_goal": within, "e2e_median_err_median": 0.014,
                    "e2e_median_err_max": 0.057, "cells_step_sum_goal": 11},
        "policy_diff_summary": {"num_significant_agree": 60, "num_significant_sign_right": 70,
                                "num_significant": 90, "verdicts": {"agree": 60, "wrong sign": 4}}}))
    return folder


def test_a_row_reads_the_suite_and_the_fit_it_names(tmp_path):
    row = matrix_row("Z", "X", suite(tmp_path, "z", 0.974, 0.087, 6))
    assert row["fit's device held-out sum"] == "0.974" and row["fit's replay drift"] == "8.7%"
    assert row["E2E within 3%"] == "6 / 12" and row["E2E error median / max"] == "1.4% / 5.7%"
    assert row["significant pairs: agree / sign / wrong"] == "60 / 70 / 4 of 90" and row["concerns"] == 1
    assert matrix_row("X", "X", suite(tmp_path, "x", 1.0, 0.01, 12))["concerns"] == 0


def test_the_table_keeps_three_decimals_and_refuses_a_folder_without_a_suite(tmp_path, capsys):
    out = tmp_path / "m.md"
    main([f"X:R:{suite(tmp_path, 'x', 1.0, 0.01, 12)}", "--out", str(out)])
    assert "| 1.000 " in out.read_text() and "12 / 12" in capsys.readouterr().out
    with pytest.raises(SystemExit, match="no generalize.json"):
        main([f"X:R:{tmp_path}"])
