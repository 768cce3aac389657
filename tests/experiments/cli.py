"""Run the `servelab` command in this process (as the console script does) and capture what it says."""
import sys

import pytest

from experiments import output_dirs, run
from tests.helpers import exit_code_and_output

QUIET = ["progress=false", "print_summary=false", "plots=false"]
SMALL = ["experiment=smoke", "workload.num_requests=6", *QUIET]


def servelab(monkeypatch, capsys, *args, full_error: bool = False):
    """(exit status, stdout, stderr) of `servelab ARGS` run in-process from the current directory.

    Each call stands for a new process: the folders created and remembered by earlier calls are forgotten.
    """
    monkeypatch.setattr(sys, "argv", ["servelab", *args])
    monkeypatch.setenv("HYDRA_FULL_ERROR", "1" if full_error else "0")     # restored after the test
    monkeypatch.setenv("SERVELAB_FULL_ERROR", "0")
    monkeypatch.setattr(output_dirs, "_created", {})
    monkeypatch.setattr(output_dirs, "_last_output", {})
    monkeypatch.setattr(output_dirs, "_created_sweep", [])
    monkeypatch.setattr(output_dirs, "_created_run", [])
    monkeypatch.setattr(output_dirs, "_made_by_unique_dir", {})
    return exit_code_and_output(capsys, run.main)


def error_line(monkeypatch, capsys, *args) -> str:
    """The one line a user's mistake prints (asserting exit status 2 and nothing else on stderr)."""
    code, _, err = servelab(monkeypatch, capsys, *args)
    lines = [ln for ln in err.splitlines() if ln.strip()]
    assert code == 2 and len(lines) == 1 and lines[0].startswith("error: "), (code, err)
    return lines[0]


@pytest.fixture
def in_tmp(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    return tmp_path
