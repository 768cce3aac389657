"""Calibrated cost model: a non-negative linear model of step time, fitted to times the engine measured.

    cm = CalibratedCostModel("benchmarks/results/profile_h200_qwen3_0p6b.json")   # or get_cost_model("calibrated", profile=...)
    cm.step_time_s(batch)

Step time in seconds is a sum of physically meaningful terms, every
coefficient >= 0 (fitted by non-negative least squares on relative error):

    step                     per-step overhead of a forward pass (launches, host work), paid by every step with sequences
    prefill_step             extra fixed cost of a step with prefill work (no CUDA graph: eager launches, prefill
                             attention setup), paid once per step with >= 1 prefill entry
    num_seqs                 per scheduled sequence (metadata, per-sequence kernel work, decode's linear FLOPs)
    prefill_tokens           per prefill token (linear-layer FLOPs)
    prefill_attention_pairs  per causal query-key pair of prefill entries: sum_j n_j*c_j - n_j*(n_j-1)/2
                             (n_j new tokens, c_j context after the step)
    decode_context_sum       per key read by decode attention (sum of decode context lengths)
    lm_head_rows             per sampled row (finished prefills + decodes): LM head and sampler
    swap_step                fixed cost of a step's block copies (index tensors, host sync), paid when it swaps
    swap_blocks              per KV block copied between host and device (scaled by block_size / fitted block size)
    tokens_over_knee         per batched token beyond `knee_tokens` (prefill tokens + decodes): the extra slope once
                             the linear layers turn compute-bound (absent when knee_tokens is None)

The hinge gives the roofline's shape (flat while weight reads dominate, then
linear in tokens) with one extra coefficient; the knee is chosen from a
candidate list by training error. Outside the fitted range the model
extrapolates linearly (the rule is the formula); `fitted_range` in the saved
file records the range of every table column it was fitted on.

Evaluating a step is a handful of multiply-adds; `decode_step_times_s` is the
vectorized form for runs of pure-decode steps.
"""
from __future__ import annotations

import datetime as _dt
import json
import os
from operator import mul
from pathlib import Path
from typing import Any, Mapping, Sequence

import numpy as np

from sim.cost_model import register_cost_model
from sim.cost_model.base import STEP_TABLE_COLUMNS, CostModelError, FittedCostModel

FORMAT = "servelab.calibrated_cost_model/v1"
FEATURES = ("step", "prefill_step", "num_seqs", "prefill_tokens", "prefill_attention_pairs", "decode_context_sum", "lm_head_rows",
            "swap_step", "swap_blocks", "tokens_over_knee")
KNEE_CANDIDATES = (None, 32, 64, 128, 256, 512, 1024, 2048)


def nnls(a: np.ndarray, b: np.ndarray, max_iter: int | None = None, tol: float = 1e-12) -> np.ndarray:
    """argmin_x ||a x - b||_2 subject to x >= 0 (Lawson-Hanson active set).

    a: [m, n], b: [m]. Columns should be of comparable scale (the caller normalizes).
    """
    a = np.asarray(a, dtype=np.float64)
    b = np.asarray(b, dtype=np.float64)
    m, n = a.shape
    x = np.zeros(n)
    passive = np.zeros(n, dtype=bool)
    w = a.T @ (b - a @ x)
    max_iter = max_iter or 3 * n + 30
    for _ in range(max_iter):
        if passive.all() or w[~passive].max(initial=-np.inf) <= tol:
            break
        j = int(np.argmax(np.where(passive, -np.inf, w)))
        passive[j] = True
        while True:
            z = np.zeros(n)
            if not passive.any():
                break
            z[passive] = np.linalg.lstsq(a[:, passive], b, rcond=None)[0]
            if z[passive].min() > 0:
                break
            # Step from x toward z until the first passive coefficient hits 0; drop it from the set.
            neg = passive & (z <= 0)
            alpha = np.min(x[neg] / (x[neg] - z[neg]))
            x = x + alpha * (z - x)
            passive &= x > tol
            x[~passive] = 0.0
        x = z
        w = a.T @ (b - a @ x)
    return x


def design_matrix(steps, knee_tokens: int | None, block_size: int | None = None) -> np.ndarray:
    """[rows, len(FEATURES)] features of a step table (DataFrame or mapping of STEP_TABLE_COLUMNS columns)."""
    missing = [c for c in STEP_TABLE_COLUMNS if c != "duration_s" and c not in steps]
    if missing:
        raise ValueError(f"step table lacks column(s) {missing}; a table needs {list(STEP_TABLE_COLUMNS)} "
                         f"(as experiments.profile and engine.recorder write them)")
    col = (lambda c: np.asarray(steps[c], dtype=np.float64))
    p_seqs, d_seqs = col("num_prefill_seqs"), col("num_decode_seqs")
    p_tok, swaps = col("num_prefill_tokens"), col("num_swap_blocks")
    forward = ((p_seqs + d_seqs) > 0).astype(np.float64)
    swap_step = (swaps > 0).astype(np.float64)
    tokens = p_tok + d_seqs
    over = np.maximum(tokens - knee_tokens, 0.0) if knee_tokens is not None else np.zeros_like(tokens)
    if block_size is not None and "block_size" in steps:
        swaps = swaps * col("block_size") / block_size
    return np.column_stack([forward, (p_seqs > 0).astype(np.float64), p_seqs + d_seqs, p_tok, col("prefill_attention_pairs"),
                            col("decode_context_sum"), col("num_prefill_samples") + d_seqs, swap_step, swaps, over])


def relative_errors(pred: np.ndarray, true: np.ndarray) -> np.ndarray:
    return np.abs(np.asarray(pred) - np.asarray(true)) / np.asarray(true)


@register_cost_model("calibrated")
class CalibratedCostModel(FittedCostModel):
    name = "calibrated"

    def __init__(self, profile: str | Path | Mapping | None = None, *, coefficients: Mapping[str, float] | None = None,
                 knee_tokens: int | None = None, block_size: int = 16, metadata: Mapping | None = None,
                 fitted_range: Mapping | None = None, max_model_len: int | None = None):
        if profile is not None:
            if coefficients is not None:
                raise ValueError("give either profile (a saved JSON path or dict) or coefficients, not both")
            data = json.loads(Path(profile).read_text()) if isinstance(profile, (str, Path)) else dict(profile)
            _check_format(data, profile)
            coefficients, knee_tokens = data["coefficients"], data.get("knee_tokens")
            block_size, metadata = data.get("block_size", 16), data.get("metadata")
            fitted_range = data.get("fitted_range")
            max_model_len = max_model_len if max_model_len is not None else data.get("max_model_len")
        if coefficients is None:
            raise ValueError("CalibratedCostModel needs profile=<path to a calibrated JSON> or coefficients={...}; "
                             "make one with `python -m experiments.calibrate table.csv --out profile.json`")
        unknown = sorted(set(coefficients) - set(FEATURES))
        if unknown:
            raise ValueError(f"unknown coefficient(s) {unknown}; allowed: {list(FEATURES)}")
        c = {f: float(coefficients.get(f, 0.0)) for f in FEATURES}
        bad = {f: v for f, v in c.items() if not (v >= 0 and np.isfinite(v))}
        if bad:
            raise ValueError(f"coefficients must be finite and >= 0 (seconds per unit), got {bad}")
        if knee_tokens is not None and knee_tokens < 0:
            raise ValueError(f"knee_tokens must be >= 0 or None, got {knee_tokens}")
        if block_size < 1:
            raise ValueError(f"block_size must be >= 1, got {block_size}")
        self.coefficients = c
        self.knee_tokens = None if knee_tokens is None else int(knee_tokens)
        self.block_size = int(block_size)
        self.metadata = dict(metadata or {})
        self.fitted_range = dict(fitted_range or {})
        self.max_model_len = max_model_len
        (self._step, self._prefill_step, self._seq, self._ptok, self._pairs, self._dctx, self._lm, self._swap_step, self._swap,
         self._knee_slope) = (c[f] for f in FEATURES)
        self._knee = self.knee_tokens if self.knee_tokens is not None else 0
        if self.knee_tokens is None:
            self._knee_slope = 0.0

    def __repr__(self) -> str:
        terms = ", ".join(f"{f}={v:.3g}" for f, v in self.coefficients.items() if v)
        return f"CalibratedCostModel({terms}, knee_tokens={self.knee_tokens})"

    # -- pricing ----------------------------------------------------------------------
    def _fixed(self, num_seqs, prefill_tokens, pairs, lm_rows, tokens) -> float:
        """Every term but decode KV reads and swaps, for a non-empty step."""
        t = self._step + self._seq * num_seqs + self._ptok * prefill_tokens + self._pairs * pairs + self._lm * lm_rows
        if tokens > self._knee:
            t += self._knee_slope * (tokens - self._knee)
        return t

    def step_time_from_shape(self, prefill_new_tokens: Sequence[int], prefill_context_lens: Sequence[int],
                             num_decode_seqs: int, decode_context_sum: int, num_swap_blocks: int = 0,
                             num_prefill_samples: int | None = None, block_size: int = 16) -> float:
        self.check_shape(prefill_new_tokens, prefill_context_lens, num_decode_seqs, decode_context_sum,
                         num_swap_blocks, num_prefill_samples)
        n_pre = len(prefill_new_tokens)
        t_swap = (self._swap_step + self._swap * num_swap_blocks * (block_size / self.block_size)
                  if num_swap_blocks else 0.0)
        if n_pre == 0 and num_decode_seqs == 0:
            return t_swap
        pre_tokens = pairs = 0
        if n_pre:
            pre_tokens = sum(prefill_new_tokens)
            pairs = sum(map(mul, prefill_new_tokens, prefill_context_lens)) \
                - (sum(map(mul, prefill_new_tokens, prefill_new_tokens)) - pre_tokens) // 2
        samples = n_pre if num_prefill_samples is None else num_prefill_samples
        t = self._fixed(n_pre + num_decode_seqs, pre_tokens, pairs, samples + num_decode_seqs,
                        pre_tokens + num_decode_seqs)
        if n_pre:
            t += self._prefill_step
        return t + self._dctx * decode_context_sum + t_swap

    def decode_step_times_s(self, num_seqs: int, start_context_sum: int, k: int) -> np.ndarray:
        k = int(k)
        if k < 0 or num_seqs < 0:
            raise ValueError(f"decode_step_times_s needs k >= 0 and num_seqs >= 0, got k={k}, num_seqs={num_seqs}")
        if k == 0 or num_seqs == 0:
            return np.zeros(k)
        self.check_shape((), (), num_seqs, start_context_sum, 0, None)
        self.check_shape((), (), num_seqs, start_context_sum + (k - 1) * num_seqs, 0, None)
        ctx = start_context_sum + num_seqs * np.arange(k, dtype=np.float64)            # [k]
        return self._fixed(num_seqs, 0, 0, num_seqs, num_seqs) + self._dctx * ctx

    def predict_table(self, steps) -> np.ndarray:
        """Predicted seconds for every row of a step table (vectorized; same formula as step_time_from_shape)."""
        x = design_matrix(steps, self.knee_tokens, self.block_size)
        coef = np.array([self.coefficients[f] for f in FEATURES])
        if self.knee_tokens is None:
            coef[-1] = 0.0
        return x @ coef

    # -- fitting and files ---------------------------------------------------------------
    @classmethod
    def fit(cls, steps: Any, knee_candidates: Sequence[int | None] = KNEE_CANDIDATES, block_size: int | None = None,
            metadata: Mapping | None = None, **options) -> "CalibratedCostModel":
        """NNLS on relative error (rows weighted by 1 / measured duration); the knee with the least error wins.

        steps: a table with STEP_TABLE_COLUMNS (rows with duration_s <= 0 or NaN are dropped).
        """
        if options:
            raise TypeError(f"unknown fit option(s) {sorted(options)}; allowed: knee_candidates, block_size, metadata")
        if "duration_s" not in steps:
            raise ValueError("step table lacks the target column 'duration_s'")
        y = np.asarray(steps["duration_s"], dtype=np.float64)
        keep = np.isfinite(y) & (y > 0)
        if keep.sum() < len(FEATURES):
            raise ValueError(f"need at least {len(FEATURES)} steps with duration_s > 0 to fit, got {int(keep.sum())}")
        table = {c: np.asarray(steps[c])[keep] for c in steps.keys()} if hasattr(steps, "keys") else steps
        y = y[keep]
        if block_size is None:
            bs = np.asarray(table["block_size"]) if "block_size" in table else np.array([16])
            block_size = int(bs[0])
        tokens = np.asarray(table["num_prefill_tokens"], dtype=np.float64) + np.asarray(table["num_decode_seqs"])
        best = None
        for knee in knee_candidates:
            if knee is not None and knee >= tokens.max():
                continue
            x = design_matrix(table, knee, block_size)
            xw = x / y[:, None]                              # relative residuals: (x c - y) / y
            scale = np.linalg.norm(xw, axis=0)
            scale[scale == 0] = 1.0
            coef = nnls(xw / scale, np.ones_like(y)) / scale
            err = float(np.sum((xw @ coef - 1.0) ** 2))
            if best is None or err < best[0] - 1e-12:
                best = (err, knee, coef)
        _, knee, coef = best
        if knee is None:
            coef[-1] = 0.0
        rng = {c: [float(np.min(table[c])), float(np.max(table[c]))] for c in STEP_TABLE_COLUMNS if c in table}
        meta = dict(metadata or {})
        meta.setdefault("fit_date", _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"))
        meta["num_fit_rows"] = int(len(y))
        return cls(coefficients=dict(zip(FEATURES, map(float, coef))), knee_tokens=knee, block_size=block_size,
                   metadata=meta, fitted_range=rng)

    def to_dict(self) -> dict:
        return {"format": FORMAT, "name": self.name, "coefficients": dict(self.coefficients),
                "knee_tokens": self.knee_tokens, "block_size": self.block_size, "max_model_len": self.max_model_len,
                "units": "seconds per unit of each feature (see sim/cost_model/calibrated.py)",
                "fitted_range": self.fitted_range, "metadata": self.metadata}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> "CalibratedCostModel":
        return cls(profile=dict(data))

    @classmethod
    def load(cls, path: str | Path) -> "CalibratedCostModel":
        return cls(profile=path)

    def save(self, path: str | Path) -> Path:
        """Writes the JSON atomically (temporary file + rename)."""
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
        tmp.write_text(json.dumps(self.to_dict(), indent=2, sort_keys=False) + "\n")
        os.replace(tmp, path)
        return path


def _check_format(data: Mapping, source) -> None:
    if data.get("format") != FORMAT:
        raise CostModelError(f"{source}: not a calibrated cost model file (format {data.get('format')!r}, "
                             f"expected {FORMAT!r}); make one with `python -m experiments.calibrate`")
    if not isinstance(data.get("coefficients"), Mapping):
        raise CostModelError(f"{source}: field 'coefficients' must be a mapping of {list(FEATURES)} to seconds")
