"""The WARNING and NOTE lines a sweep job prints, named by the job: `[job scheduler=srpt,...] WARNING: 8.0% of ...`.

A sweep's jobs print into one terminal (the joblib workers, the basic launcher) or into the logs of a cluster
scheduler; a warning line that does not say its job cannot be told apart from its neighbours'. While a job runs,
`named_warnings(job)` puts a writer in front of sys.stderr that prefixes every line beginning with `WARNING` or
`NOTE` (the lines experiments.runner_sim, runner_http and workloads.changes print: a loss, or a change to the
input such as spread arrivals) and passes everything else (progress bars, errors) through unchanged.
"""
from __future__ import annotations

import os
import sys
from contextlib import contextmanager


class _PrefixWarnings:
    """A text stream that writes through to `stream`, prefixing the lines that begin with WARNING or NOTE."""

    def __init__(self, stream, prefix: str):
        self._stream, self._prefix, self._line_start, self._after_cr = stream, prefix, True, False

    def write(self, text: str) -> int:
        out = []
        for piece in text.splitlines(keepends=True):
            if self._line_start and piece.startswith(("WARNING", "NOTE")):
                # after a progress bar's "\r" the line would overwrite the bar on a terminal and follow it in a log
                out.append(("\n" if self._after_cr else "") + self._prefix)
            out.append(piece)
            self._line_start = piece.endswith(("\n", "\r"))
            self._after_cr = piece.endswith("\r")
        self._stream.write("".join(out))
        return len(text)

    def __getattr__(self, name):        # flush, isatty, fileno, encoding: the stream's own
        return getattr(self._stream, name)


def job_label(output_dir, sweep_dir, overrides) -> str:
    """The job's folder relative to its sweep (its overrides' name), with the overrides when the folder does not
    name them (hydra.sweep.subdir set to something else, e.g. the job number)."""
    rel = os.path.relpath(os.path.abspath(output_dir), os.path.abspath(sweep_dir))
    return rel if "=" in rel or not overrides else f"{rel}: {' '.join(map(str, overrides))}"


@contextmanager
def named_warnings(job: str):
    """sys.stderr's WARNING and NOTE lines prefixed with `[job JOB] ` inside the block."""
    stream = sys.stderr
    sys.stderr = _PrefixWarnings(stream, f"[job {job}] ")
    try:
        yield
    finally:
        sys.stderr = stream
