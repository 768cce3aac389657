"""The envelope a fitted cost model was fitted on, and the share of a run's steps that fall outside it.

    env = envelope_of(table)                 # {"max_prefill_tokens": 8192, ...}: the largest step the fit saw
    cov = coverage(steps_df, env)            # steps and simulated seconds outside it

A fitted model (sim.cost_model.calibrated) is a sum of linear terms; inside the
shapes it was fitted on it interpolates, outside it extrapolates, and a few
percent of bias per step compounds through the queue. The envelope is, per
dimension of a step, the largest value any fitted row had:

    max_prefill_tokens           num_prefill_tokens (prefill tokens computed in one step)
    max_prefill_context_tokens   the longest context of one prefill entry (cached prefix + new tokens)
    max_decode_context_tokens    the longest context of one decode entry
    max_batch_size               num_prefill_seqs + num_decode_seqs
    max_num_batched_tokens       num_prefill_tokens + num_decode_seqs (tokens in the pass)
    max_decode_context_sum       decode_context_sum (keys decode attention reads in one step)
    max_prefill_attention_pairs  prefill_attention_pairs (causal query-key pairs in one step)
    max_swap_blocks              num_swap_blocks

A step is outside when any of its values exceeds the envelope's. The two
longest-context columns come from engine.recorder's `max_prefill_context_tokens`
and `max_decode_context_tokens`; a table without them (made before they
existed) gives the mean context of the row's entries, rounded up, which is exact
for a profile's uniform rows and otherwise below the longest (so the envelope
is never wider than the data). Everything here is vectorized over the steps
table, after the run: the simulator's hot path pays nothing.
"""
from __future__ import annotations

from typing import Mapping

import numpy as np

ENVELOPE_KEYS = ("max_prefill_tokens", "max_prefill_context_tokens", "max_decode_context_tokens", "max_batch_size",
                 "max_num_batched_tokens", "max_decode_context_sum", "max_prefill_attention_pairs", "max_swap_blocks")
WARN_OUTSIDE_SHARE = 0.05     # a run with more of its steps or its time outside gets a WARNING line


def _col(steps, name: str) -> np.ndarray:
    return np.asarray(steps[name], dtype=np.float64)


def _longest(steps, column: str, sum_column: str, count_column: str) -> np.ndarray:
    if column in steps:
        x = _col(steps, column)
        if np.isfinite(x).all():
            return x
    else:
        x = np.full(len(_col(steps, count_column)), np.nan)
    count = _col(steps, count_column)
    mean_up = np.ceil(_col(steps, sum_column) / np.where(count > 0, count, 1.0))
    return np.where(np.isfinite(x), x, np.where(count > 0, mean_up, 0.0))


def step_extents(steps) -> dict[str, np.ndarray]:
    """Per row of a steps table (DataFrame or mapping of columns): its value of every ENVELOPE_KEYS dimension."""
    p_tok, d_seqs = _col(steps, "num_prefill_tokens"), _col(steps, "num_decode_seqs")
    return {
        "max_prefill_tokens": p_tok,
        "max_prefill_context_tokens": _longest(steps, "max_prefill_context_tokens", "prefill_context_sum",
                                               "num_prefill_seqs"),
        "max_decode_context_tokens": _longest(steps, "max_decode_context_tokens", "decode_context_sum",
                                              "num_decode_seqs"),
        "max_batch_size": _col(steps, "num_prefill_seqs") + d_seqs,
        "max_num_batched_tokens": p_tok + d_seqs,
        "max_decode_context_sum": _col(steps, "decode_context_sum"),
        "max_prefill_attention_pairs": _col(steps, "prefill_attention_pairs"),
        "max_swap_blocks": _col(steps, "num_swap_blocks"),
    }


def envelope_of(steps) -> dict[str, int]:
    """The largest value of every ENVELOPE_KEYS dimension over the rows of a steps table (0 for an empty one)."""
    return {k: int(v.max(initial=0.0)) for k, v in step_extents(steps).items()}


def check_envelope(envelope: Mapping, source) -> dict[str, int]:
    """An envelope read from a file: the ENVELOPE_KEYS, each an integer >= 0 (one line naming the field otherwise)."""
    if not isinstance(envelope, Mapping):
        raise ValueError(f"{source}: field 'envelope' must be a mapping of {list(ENVELOPE_KEYS)} to integers")
    missing = [k for k in ENVELOPE_KEYS if k not in envelope]
    if missing:
        raise ValueError(f"{source}: envelope lacks {missing}; refit the file with `python -m experiments.calibrate`")
    bad = {k: envelope[k] for k in ENVELOPE_KEYS if not (isinstance(envelope[k], (int, float)) and envelope[k] >= 0)}
    if bad:
        raise ValueError(f"{source}: envelope values must be integers >= 0, got {bad}")
    return {k: int(envelope[k]) for k in ENVELOPE_KEYS}


def outside_mask(steps, envelope: Mapping) -> tuple[np.ndarray, dict[str, int]]:
    """(bool [rows]: the step exceeds the envelope in some dimension, {dimension: rows exceeding it})."""
    ext = step_extents(steps)
    out = np.zeros(len(ext["max_prefill_tokens"]), dtype=bool)
    by = {}
    for k, v in ext.items():
        over = v > envelope[k]
        by[k] = int(over.sum())
        out |= over
    return out, by


def coverage(steps, envelope: Mapping | None) -> dict | None:
    """Steps and step seconds outside `envelope` (None when there is no envelope to compare with).

    Keys: num_steps, num_steps_outside, share_steps_outside, time_s (sum of duration_s),
    time_outside_s, share_time_outside (0 for an empty table), outside_by (rows exceeding each
    dimension, only the dimensions some row exceeds), envelope (the one compared with).
    """
    if envelope is None:
        return None
    out, by = outside_mask(steps, envelope)
    dur = _col(steps, "duration_s") if len(out) else np.zeros(0)
    n, t = int(len(out)), float(dur.sum())
    n_out, t_out = int(out.sum()), float(dur[out].sum())
    return {"num_steps": n, "num_steps_outside": n_out, "share_steps_outside": n_out / n if n else 0.0,
            "time_s": t, "time_outside_s": t_out, "share_time_outside": t_out / t if t > 0 else 0.0,
            "outside_by": {k: v for k, v in by.items() if v}, "envelope": dict(envelope)}


def coverage_warning(cov: dict | None, what: str = "the cost model") -> str | None:
    """One WARNING line when more than WARN_OUTSIDE_SHARE of the steps or of their time is outside, else None."""
    if cov is None or max(cov["share_steps_outside"], cov["share_time_outside"]) <= WARN_OUTSIDE_SHARE:
        return None
    dims = ", ".join(f"{k} {v}" for k, v in sorted(cov["outside_by"].items(), key=lambda kv: -kv[1]))
    return (f"WARNING: {100 * cov['share_steps_outside']:.1f}% of the steps ({100 * cov['share_time_outside']:.1f}% "
            f"of the simulated step time) are outside the envelope {what} was fitted on (steps beyond it: {dims}); "
            f"its times there are extrapolated: profile a grid that covers them (python -m experiments.profile "
            f"--max-model-len ...) and refit")


def format_coverage(cov: dict | None) -> str:
    """A short line for printed summaries."""
    if cov is None:
        return "-"
    return (f"{100 * cov['share_steps_outside']:.1f}% of steps, {100 * cov['share_time_outside']:.1f}% of step time "
            f"outside the fitted envelope")
