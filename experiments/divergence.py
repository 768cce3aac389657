"""Where a simulated and a real run first part ways, decision by decision.

    report = first_divergence(real.decisions, sim.decisions, arrivals_s={request_id: arrival_time_s})

Both runs are recorded with `Recorder(record_decisions=True)` (experiments.validate --record-decisions): one
row per step that holds a scheduler decision -- requests given prefill work, preempted, swapped out, swapped
in (engine.core.recorder.DECISION_COLUMNS). Pure decode steps carry no decision. The two decision sequences are
walked in order; row i of one run matches row i of the other when all four id lists are equal. Up to the
first mismatch the runs made the same decisions, possibly at shifted times (`drift_s`: sim start - real
start). At the first mismatch the cause is one of:

  * "arrival boundary" (time drift): some request arrived between the two runs' step starts, so one
    scheduler saw it in its queue and the other did not: the same policy, different queues, because the
    clocks had drifted (the request need not be the one that differs: a later, more important arrival
    changes whom a priority policy admits or preempts).
  * "step count" (time drift): the runs took a different number of steps since the last matching decision
    (e.g. a preemption when the KV cache fills up, which depends on how many decode steps ran): the same
    rule met a different state.
  * "different decision": same step count since the last match and no arrival explains it.
  * "length": one run has no more decision rows (the other made more decisions; no mismatch before).
"""
from __future__ import annotations

import numpy as np
import pandas as pd

ID_COLUMNS = ("prefill_ids", "preempted_ids", "swapped_out_ids", "swapped_in_ids")


def _ids(text) -> list[str]:
    return str(text).split() if isinstance(text, str) and text else []


def _row(df: pd.DataFrame, i: int) -> dict:
    r = df.iloc[i]
    return {"step": int(r["step"]), "start_time_s": float(r["start_time_s"]),
            **{c: _ids(r[c]) for c in ID_COLUMNS}}


def first_divergence(real: pd.DataFrame, sim: pd.DataFrame, arrivals_s: dict) -> dict:
    """The first decision row where `real` and `sim` differ, and why (module docstring). arrivals_s maps
    request ids (as strings or as recorded) to arrival times in seconds."""
    if real is None or sim is None:
        raise ValueError("both runs need decision rows: record them with --record-decisions "
                         "(Recorder(record_decisions=True))")
    arrivals = {str(k): float(v) for k, v in arrivals_s.items()}
    n = min(len(real), len(sim))
    last_real = last_sim = None
    drifts = []
    for i in range(n):
        r, s = _row(real, i), _row(sim, i)
        if all(r[c] == s[c] for c in ID_COLUMNS):
            drifts.append(s["start_time_s"] - r["start_time_s"])
            last_real, last_sim = r, s
            continue
        out = _mismatch(i, r, s, last_real, last_sim, arrivals)
        out.update(num_matched=i, num_real_rows=len(real), num_sim_rows=len(sim),
                   drift_s_at_last_match=drifts[-1] if drifts else 0.0,
                   max_abs_drift_s_before=float(np.max(np.abs(drifts))) if drifts else 0.0)
        return out
    if len(real) == len(sim):
        return {"diverged": False, "num_matched": n, "num_real_rows": len(real), "num_sim_rows": len(sim),
                "drift_s_at_last_match": drifts[-1] if drifts else 0.0,
                "max_abs_drift_s_before": float(np.max(np.abs(drifts))) if drifts else 0.0}
    return {"diverged": True, "index": n, "cause": "length", "num_matched": n, "num_real_rows": len(real),
            "num_sim_rows": len(sim), "drift_s_at_last_match": drifts[-1] if drifts else 0.0,
            "max_abs_drift_s_before": float(np.max(np.abs(drifts))) if drifts else 0.0,
            "explanation": f"one run has {abs(len(real) - len(sim))} more decision rows after {n} equal ones"}


def _mismatch(i: int, r: dict, s: dict, last_r: dict | None, last_s: dict | None, arrivals: dict) -> dict:
    only_r = [x for x in r["prefill_ids"] if x not in s["prefill_ids"]]
    only_s = [x for x in s["prefill_ids"] if x not in r["prefill_ids"]]
    t_r, t_s = r["start_time_s"], s["start_time_s"]
    lo, hi = min(t_r, t_s), max(t_r, t_s)
    # Requests one run's scheduler could see at this step and the other's could not.
    between = sorted((x for x, a in arrivals.items() if lo < a <= hi), key=arrivals.get)
    steps_r = r["step"] - (last_r["step"] if last_r else -1)
    steps_s = s["step"] - (last_s["step"] if last_s else -1)
    if between:
        cause = "arrival boundary"
        why = (f"request(s) {between} arrived between the two runs' step starts (real {t_r:.4f} s, sim "
               f"{t_s:.4f} s), so the two schedulers saw different queues: time drift")
    elif steps_r != steps_s:
        cause = "step count"
        why = (f"{steps_r} real vs {steps_s} simulated steps since the last matching decision: the same rule "
               f"met a different state (time drift)")
    else:
        cause = "different decision"
        why = "same step count since the last match, and no arrival between the step starts explains it"
    return {"diverged": True, "index": i, "cause": cause, "explanation": why,
            "real": r, "sim": s, "drift_s": t_s - t_r, "steps_since_match_real": int(steps_r),
            "steps_since_match_sim": int(steps_s), "prefill_only_real": only_r, "prefill_only_sim": only_s,
            "arrived_between": between}
