"""Requests the run's limits rejected (not the scheduling policy), as counts in summary.json and a WARNING line.

    meta.update(rejection_meta(requests))     # summary.json meta: num_rejected_by_limits, reject_reasons, ...
    warn_if_rejected(meta)                    # one WARNING line on stderr above changes.LOSS_WARN_FRACTION

The scheduler rejects a request on arrival that can never run with the run's settings (engine/core/scheduler.py:
prompt + output longer than max_model_len, or more KV blocks at completion than the cache has); the reason is in
requests.parquet `reject_reason`. A rejection by the policy (`reject_reason` "policy <name>: ...", e.g.
edf_reject) is the policy's decision, counted as num_rejected_by_policy, and is not counted here.
"""
from __future__ import annotations

import re
import sys

import pandas as pd

from experiments.workloads.changes import LOSS_WARN_FRACTION

MAX_LISTED_REASONS = 3          # kinds of reasons the WARNING line names (summary.json lists them all)
_KV = re.compile(r"needs (\d+) KV blocks at completion, the cache has (\d+)")
_LEN = re.compile(r"exceeds max_model_len \((\d+)\)")


def _kind(reason: str) -> str:
    """The reason with its per-request numbers taken out, so that requests rejected for one cause group; read
    after a count ("43 need more KV blocks ...")."""
    if _KV.search(reason):
        return "need more KV blocks at completion than the cache has"
    if _LEN.search(reason):
        return "are longer than max_model_len (prompt + max_tokens)"
    return "rejected: " + re.sub(r"\d+", "N", reason)


def rejection_meta(requests: pd.DataFrame) -> dict:
    """summary.json meta (JSON-able): num_rejected_by_limits, rejected_by_limits_fraction (of all requests) and
    reject_reasons (one entry per kind of reason, most common first: reason, num_requests, example, and for a KV
    shortage max_kv_blocks_needed / num_kvcache_blocks, for a length max_model_len)."""
    n = len(requests)
    if not n or "reject_reason" not in requests:
        return {"num_rejected_by_limits": 0, "rejected_by_limits_fraction": 0.0, "reject_reasons": []}
    rejected = requests[(requests["status"] == "rejected").to_numpy()]
    reasons = rejected["reject_reason"].fillna("").astype(str)
    reasons = reasons[~reasons.str.startswith("policy ")]
    groups = []
    for kind, rs in reasons.groupby(reasons.map(_kind), sort=False):
        entry = {"reason": kind, "num_requests": int(len(rs)), "example": rs.iloc[0]}
        kv = rs.str.extract(_KV).dropna().astype(int)
        if len(kv):
            entry["max_kv_blocks_needed"], entry["num_kvcache_blocks"] = int(kv[0].max()), int(kv[1].iloc[0])
        length = rs.str.extract(_LEN).dropna().astype(int)
        if len(length):
            entry["max_model_len"] = int(length[0].iloc[0])
        groups.append(entry)
    groups.sort(key=lambda g: -g["num_requests"])
    return {"num_rejected_by_limits": int(len(reasons)), "rejected_by_limits_fraction": len(reasons) / n,
            "reject_reasons": groups}


def _fix(group: dict, model_max_len: int | None) -> str:
    if "max_kv_blocks_needed" in group:
        return (f"raise num_kvcache_blocks to at least {group['max_kv_blocks_needed']} (null: the blocks that fit "
                "the GPU)")
    if "max_model_len" in group:
        return ("raise max_model_len" + (f" (up to {model_max_len}, the model's limit)" if model_max_len else "")
                + ", or set workload.too_long=drop to leave the long requests out")
    return "see requests.parquet reject_reason"


def rejection_warning(meta: dict, num_requests: int, model_max_len: int | None = None) -> str | None:
    """The WARNING line when the limits rejected more than LOSS_WARN_FRACTION of the requests, else None."""
    frac = meta.get("rejected_by_limits_fraction", 0.0)
    if frac <= LOSS_WARN_FRACTION:
        return None
    groups = meta["reject_reasons"][:MAX_LISTED_REASONS]
    why = "; ".join(f"{g['num_requests']} {g['reason']} (e.g. {g['example']})" for g in groups)
    fixes = ", ".join(dict.fromkeys(_fix(g, model_max_len) for g in groups))
    return (f"WARNING: {meta['num_rejected_by_limits']} of {num_requests} requests ({100 * frac:.3g}%) were rejected "
            f"on arrival by the run's limits, not run: {why}; to run them: {fixes} (per request: requests.parquet "
            "reject_reason)")


def warn_if_rejected(meta: dict, num_requests: int, model_max_len: int | None = None, file=None) -> str | None:
    """Prints rejection_warning (if any) on stderr and returns it."""
    text = rejection_warning(meta, num_requests, model_max_len)
    if text:
        print(text, file=file or sys.stderr, flush=True)
    return text
