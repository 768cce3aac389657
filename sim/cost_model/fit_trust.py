"""What a calibrated file says about its own trustworthiness, read from the metadata experiments.calibrate saved.

    concerns = fit_concerns(cm.metadata, overlapped=True)     # [] or one line per concern

The envelope (sim/cost_model/envelope.py) says where a run's steps leave the fitted shapes; these say when the fit
itself is doubtful inside them, from two numbers the fit recorded about its own data:

* `device_heldout.sum_pred_over_real`: the device model on its held-out rows (the profile grid's and the overlapped
  replays'). Its sum sits within 0.3% of 1 where the grid and the live replays agree. On an H100 whose grid matched
  three others' within 0.4% but whose live decode steps ran 1-2% slower than theirs (2026-12-07, `h100_1207z/`: its
  own replay's decodes priced 0.962) it was 0.974, and the fit priced that machine's own unseen families 3-7% off
  (1 of 12 cells within 3%), where the fits of three other machines (0.999-1.000) gave 6-7 of 12 on the same runs.
* `replay_drift`: per synchronous calibration replay, the range of the fit's median residual over the tenths of the
  run. A steady host keeps it within ~1%; a host whose step times moved leaves its state in the host terms, which
  synchronous steps pay in full and overlapped ones mostly hide (R, Y and Z drifted 7-10% on 2026-12-07, X 1%).
"""
from __future__ import annotations

import math
from typing import Mapping

DEVICE_BIAS_WARN = 0.015      # |device_heldout sum - 1| above this: the grid and the live replays disagree
REPLAY_DRIFT_WARN = 0.03      # a synchronous replay's residual medians by tenth spread wider: its host was not steady


def fit_concerns(metadata: Mapping | None, overlapped: bool = False) -> list[str]:
    """One sentence per concern the file's metadata raises ([] for a file without them, e.g. typed in by hand).

    overlapped: the run uses overlap scheduling, where the host terms of a drifting replay mostly hide behind the
    device: the drift concern is then left out."""
    meta = metadata or {}
    out = []
    dev = (meta.get("device_heldout") or {}).get("sum_pred_over_real")
    if dev is not None and math.isfinite(dev) and abs(dev - 1.0) > DEVICE_BIAS_WARN:
        out.append(f"its device model prices its own held-out steps at {dev:.3f} of their seconds in sum (the "
                   f"profile grid and the live calibration replays disagree on that machine): expect its step "
                   f"times {100 * abs(dev - 1):.1f}% {'short' if dev < 1 else 'long'} and E2E errors a queue "
                   f"multiplies from there; profile and replay again on a steady machine")
    if not overlapped:
        drift = {name: d["range"] for name, d in (meta.get("replay_drift") or {}).items()
                 if isinstance(d, Mapping) and math.isfinite(d.get("range", math.nan))}
        worst = max(drift.items(), key=lambda kv: kv[1], default=None)
        if worst and worst[1] > REPLAY_DRIFT_WARN:
            out.append(f"the host's step times moved by {100 * worst[1]:.1f}% within its calibration replay "
                       f"{worst[0]}: its host terms, which synchronous steps pay in full, carry that host's state")
    return out


def fit_warning(concerns: list[str], what: str = "the calibrated cost model") -> str | None:
    """One WARNING line with every concern of fit_concerns' list, or None for none."""
    return f"WARNING: {what}: " + "; ".join(concerns) if concerns else None
