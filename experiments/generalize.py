"""The generalization suite's CPU side: from saved real runs of several workload families, re-make every
simulated side with one fit and write one table.

    python -m experiments.generalize --real-root real --profile profile.json --out benchmarks/results/generalize \\
        [--traces-dir DIR] [--workloads prefill_heavy,bursty] [--divergence prefill_heavy:vllm]

`--real-root` holds one folder per workload, as benchmarks/gpu_generalize.sh keeps them: REAL/<w>/ with the
runs of `python -m experiments.validate --real-dir REAL/<w> --name <w> --repeats N` (experiments.saved_runs;
repeat k in REAL/<w>/repeat<k>/). For each workload the validate command stored with the runs is run again
with `--from-real` and the fit (the workload flags as on the GPU; trace paths re-rooted at --traces-dir).
Written into --out:

  generalize.{parquet,md,json}   workload x policy: per-request TTFT / TPOT / E2E median and p90 |error|
                                 (`*_median_err`, `*_p90_err`), the errors of the TTFT and E2E distributions'
                                 p50 / p90 / p99 (`*_q50_err` ..., signed), throughput error, step-sum ratio
                                 (the fit pricing the real run's own steps: sum predicted / sum real), preemptions
                                 real / sim, and the real-vs-real floor (per-request E2E / TTFT median |diff|
                                 between the repeats, mean over pairs); `*_all_runs`: the same simulated run
                                 scored against every real run (repeats too), averaged; `e2e_gain`: how many %
                                 the simulated E2E moves per 1% of step price (the queue's amplification of any
                                 price error; cells above FRAGILE_GAIN are listed in the summary as fragile);
                                 `ttft_q50_err_away_from_stalls`: the TTFT p50 error over the requests whose
                                 prefill met no host launch stall (experiments/launch_stalls.py; overlapped runs)
  step_kinds.{parquet,md}        the step-sum ratio by step kind (decode / prefill / mixed / swap) and, for steps
                                 with prefill work, by prefill tokens: which cost term the error sits in
  policy_diff.{parquet,md}       experiments.policy_diff for every pair of policies of every workload, with the
                                 simulator's own band: each policy simulated again with every price 1 +- PRICE_BIAS
  divergence.json                experiments.divergence for each --divergence WORKLOAD:POLICY
  generalize.png                 each cell's E2E median |error| against its goal and floor, its step-sum ratio,
                                 and per workload the policy pairs' verdicts (experiments.plots.generalization);
                                 generalize.json's `summary` counts the cells within each goal
  reports/validation_<w>.json    the full validate reports
"""
from __future__ import annotations

import argparse
import datetime as _dt
import json
import shlex
import sys
from pathlib import Path

import numpy as np
import pandas as pd

from experiments import plots, policy_diff
from experiments.launch_stalls import near_launch_stalls, run_ttft_by_stall
from experiments.results import atomic_write_text, write_json, write_parquet
from experiments.saved_runs import saved_argv
from experiments.sim_band import band_section
from experiments.step_tables import run_was_overlapped
from sim.cost_model.calibrated import PRICE_BAND
from sim.cost_model.fit_trust import fit_concerns

PREFILL_BINS = (0, 1024, 2048, 4096, 8192, 1 << 30)
RIDING_BINS = (1, 3, 9, 1 << 30)       # mixed steps by the decodes riding their chunk: the mixed terms' reach
PRICE_BIAS = PRICE_BAND   # the uniform step-price bias (+-) e2e_gain and the simulator band simulate
RANK_PTS = 1.0         # a quantile miss whose simulated value sits within this many percentile points of the real one
FRAGILE_GAIN = 3.0     # a cell whose E2E moves more than this many % per 1% of step price: its ranking is fragile
GOALS = dict(e2e_median_err=0.03, quantile_err=0.03, step_sum_err=0.015, size_tolerance=policy_diff.SIZE_TOLERANCE)


def find_workloads(real_root: Path, only=None) -> dict[str, Path]:
    found = {p.parent.name: p.parent for p in sorted(real_root.glob("*/*_real.json"))
             if p.name == f"{p.parent.name}_real.json"}
    if not found:
        raise FileNotFoundError(f"--real-root {real_root}: no <workload>/<workload>_real.json (untar the archive "
                                f"benchmarks/gpu_generalize.sh wrote, and give its real/ folder)")
    if only:
        missing = sorted(set(only) - set(found))
        if missing:
            raise ValueError(f"--workloads: {missing} not in {real_root} (found: {sorted(found)})")
        found = {w: found[w] for w in only}
    return found


def step_kinds(steps: pd.DataFrame, cost_model, overlapped: bool = False) -> pd.DataFrame:
    """Sum of predicted / sum of real cycle times of a real run's steps, by kind, by prefill size, for mixed
    steps by the number of decodes riding the chunk and, for an overlapped run with launch stalls, by whether a
    step is near one (near_launch_stalls) (overlapped: priced as overlap scheduling runs them)."""
    from experiments.step_tables import priced_steps
    from sim.cost_model.calibrated_fit import STEP_KINDS, step_kind_codes
    st, pred = priced_steps(steps, cost_model, overlapped)
    true = st["duration_s"].to_numpy()
    pf = st["num_prefill_seqs"].to_numpy() > 0
    swap = st["num_swap_blocks"].to_numpy() > 0
    # the fit's step kinds (decode, prefill, chunk, mixed), a chunk alone counted with the prefills, swaps apart
    kind = np.where(swap, "swap", np.array([{"chunk": "prefill"}.get(k, k) for k in STEP_KINDS])[step_kind_codes(st)])
    tokens = st["num_prefill_tokens"].to_numpy()
    riding = np.where(kind == "mixed", st["num_decode_seqs"].to_numpy(), 0)
    stalls = []
    if overlapped and "launch_host_s" in st:
        near = near_launch_stalls(st, cost_model.overlap_parts_table(st)[0])
        if near.any():
            stalls = [("near a launch stall", near), ("away from launch stalls", ~near)]
    rows = []
    for name, mask in [(k, kind == k) for k in ("decode", "prefill", "mixed", "swap")] + [
            (f"prefill tokens {lo}-{hi if hi < 1 << 30 else 'max'}", pf & (tokens >= lo) & (tokens < hi))
            for lo, hi in zip(PREFILL_BINS[:-1], PREFILL_BINS[1:])] + [
            (f"mixed, {lo}-{hi - 1 if hi < 1 << 30 else 'max'} decodes riding", (riding >= lo) & (riding < hi))
            for lo, hi in zip(RIDING_BINS[:-1], RIDING_BINS[1:])] + stalls + [("all", np.ones(len(st), bool))]:
        if mask.any():
            rows.append(dict(kind=name, num_steps=int(mask.sum()), real_s=float(true[mask].sum()),
                             pred_s=float(pred[mask].sum()), sum_ratio=float(pred[mask].sum() / true[mask].sum()),
                             share_of_real=float(true[mask].sum() / true.sum())))
    return pd.DataFrame(rows)


def floors(wl_dir: Path, name: str) -> tuple[dict, dict]:
    """({policy: floor metrics}, {policy: [real summaries of every repeat]}) from the repeats."""
    from experiments.real_vs_real import real_vs_real
    from experiments.saved_runs import SavedReplays
    from experiments.validate import run_summary
    dirs = [wl_dir] + sorted(p for p in wl_dir.glob("repeat*") if (p / f"{name}_real.json").is_file())
    saved = [SavedReplays(d, name) for d in dirs]
    summaries = {p: [run_summary(s.run(p)) for s in saved if p in s.policies] for p in saved[0].policies}
    if len(dirs) < 2:
        return {}, summaries
    result = real_vs_real(dirs, name)
    out = {}
    for p in result["pairs"]:
        f = out.setdefault(p["policy"], {"e2e": [], "ttft": [], "tpot": [],
                                         **{f"{m}_q{q}": [] for m in ("ttft", "e2e") for q in ("50", "90", "99")}})
        f["e2e"].append(p["e2e_s"]["median_rel_err"])
        f["ttft"].append(p["ttft_s"]["median_rel_err"])
        f["tpot"].append(p["tpot_s"]["median_rel_err"])
        for m in ("ttft", "e2e"):       # how far one real run's quantiles sit from another's
            for q in ("50", "90", "99"):
                f[f"{m}_q{q}"].append(abs(p[f"{m}_s"]["quantile_rel_err"][f"p{q}"] or 0.0))
    result = {pol: {(f"floor_{k}" if "_q" in k else f"floor_{k}_median"):
                    float(np.mean([x for x in v if x is not None])) if v else float("nan")
                    for k, v in f.items()} for pol, f in out.items()}
    for f in result.values():           # the older name of the E2E p50 floor
        f["floor_e2e_p50_median"] = f["floor_e2e_q50"]
    return result, summaries


def _q(s: dict, m: str, q: str, key: str = "quantile_rel_err") -> float:
    v = (s.get(m) or {}).get(key, {}).get(q)
    return float("nan") if v is None else float(v)


def table_row(workload: str, policy: str, s: dict, floor: dict) -> dict:
    g = lambda *k: _get(s, *k)   # noqa: E731
    row = dict(workload=workload, policy=policy,
               ttft_median_err=g("ttft_s", "median_rel_err"), ttft_p90_err=g("ttft_s", "p90_rel_err"),
               tpot_median_err=g("tpot_s", "median_rel_err"), tpot_p90_err=g("tpot_s", "p90_rel_err"),
               e2e_median_err=g("e2e_s", "median_rel_err"), e2e_p90_err=g("e2e_s", "p90_rel_err"),
               **{f"{m}_q{q[1:]}_err": _q(s, f"{m}_s", q) for m in ("ttft", "e2e") for q in ("p50", "p90", "p99")},
               # where the simulated quantile sits in the real distribution: percentile points off
               **{f"{m}_q{q[1:]}_rank_pts": _q(s, f"{m}_s", q, "quantile_rank_pts")
                  for m in ("ttft", "e2e") for q in ("p50", "p90", "p99")},
               throughput_err=g("throughput", "rel_err"), step_sum_ratio=g("step_time", "sum_pred_over_real"),
               step_median_err=g("step_time", "median_rel_err"),
               preemptions_real=g("preemptions", "real"), preemptions_sim=g("preemptions", "sim"),
               swaps_real=g("preemptions", "real_swaps"), swaps_sim=g("preemptions", "sim_swaps"),
               # the real run's step time outside the fit's envelope (its profiled ranges): extrapolated
               real_time_outside_envelope=g("coverage", "real", "share_time_outside"),
               **{k: floor.get(k, float("nan")) for k in ("floor_e2e_median", "floor_ttft_median",
                                                           "floor_tpot_median", "floor_e2e_p50_median")},
               **{f"floor_{m}_q{q}": floor.get(f"floor_{m}_q{q}", float("nan"))
                  for m in ("ttft", "e2e") for q in ("50", "90", "99")})
    row["meets_e2e_goal"] = bool(row["e2e_median_err"] <= GOALS["e2e_median_err"]
                                 and not row["e2e_median_err"] > row["floor_e2e_median"])
    row["meets_quantile_goal"] = bool(all(abs(row[f"{m}_q{q}_err"]) <= GOALS["quantile_err"]
                                          for m in ("ttft", "e2e") for q in ("50", "90", "99")))
    row["meets_step_sum_goal"] = bool(abs(row["step_sum_ratio"] - 1) <= GOALS["step_sum_err"])
    # each quantile within the goal or within how far the real runs' own quantiles sit apart (NaN floor: no)
    row["quantiles_within_goal_or_floor"] = bool(all(
        abs(row[f"{m}_q{q}_err"]) <= max(GOALS["quantile_err"], np.nan_to_num(row[f"floor_{m}_q{q}"]))
        for m in ("ttft", "e2e") for q in ("50", "90", "99")))
    return row


def with_quantile_bands(row: dict, sim: dict, perturbed: list[dict]) -> dict:
    """row plus the simulator's own band on each TTFT / E2E quantile (`sim_band_<m>_q<q>`: the largest relative move
    of the simulated quantile with every step price 1 +- PRICE_BIAS; NaN without perturbed simulations) and
    `quantiles_within_goal_floor_or_band`: every quantile error within the goal, the real-vs-real floor or that
    band. A quantile error inside the band is one a fit 1% closer cannot be trusted to remove: the quantile turns
    on which request a step a fraction of a millisecond earlier admits (divergence.json)."""
    moved = band_section(PRICE_BIAS, sim, [(1 + sign * PRICE_BIAS, p) for sign, p in zip((1, -1), perturbed)])
    row = dict(row)
    ok = True
    for m in ("ttft", "e2e"):
        for q in ("50", "90", "99"):
            band = moved["relative"].get(f"{m}_s_p{q}", float("nan"))
            row[f"sim_band_{m}_q{q}"] = band
            limit = max(GOALS["quantile_err"], np.nan_to_num(row.get(f"floor_{m}_q{q}", np.nan)), np.nan_to_num(band))
            ok = ok and abs(row[f"{m}_q{q}_err"]) <= limit
    row["quantiles_within_goal_floor_or_band"] = bool(ok)
    return row


def _get(d, *keys):
    for k in keys:
        if not isinstance(d, dict) or d.get(k) is None:
            return float("nan")
        d = d[k]
    return float(d)


def _pct(x, signed=False) -> str:
    return "n/a" if x is None or not np.isfinite(x) else (f"{100 * x:+.1f}%" if signed else f"{100 * x:.1f}%")


def to_markdown(df: pd.DataFrame) -> str:
    head = ["workload", "policy", "E2E med / p90", "E2E med, all runs", "floor E2E", "TTFT med / p90", "TPOT med",
            "TTFT p50/p90/p99", "its sim band", "TTFT p50 without stalls (requests near one)",
            "E2E p50/p90/p99", "throughput", "step sum", "E2E gain",
            "preempt real/sim", "goals E2E/quant/steps/quant or floor"]
    lines = ["| " + " | ".join(head) + " |", "|" + " --- |" * len(head)]
    yn = lambda b: "y" if b else "n"   # noqa: E731
    for r in df.itertuples(index=False):
        lines.append(" | ".join([
            f"| {r.workload}", r.policy, f"{_pct(r.e2e_median_err)} / {_pct(r.e2e_p90_err)}",
            _pct(getattr(r, "e2e_median_err_all_runs", float("nan"))), _pct(r.floor_e2e_median),
            f"{_pct(r.ttft_median_err)} / {_pct(r.ttft_p90_err)}", _pct(r.tpot_median_err),
            " / ".join(_pct(getattr(r, f"ttft_q{q}_err"), True) for q in ("50", "90", "99")),
            " / ".join(_pct(getattr(r, f"sim_band_ttft_q{q}", float("nan"))) for q in ("50", "90", "99")),
            _stalls(r),
            " / ".join(_pct(getattr(r, f"e2e_q{q}_err"), True) for q in ("50", "90", "99")),
            _pct(r.throughput_err, True), f"{r.step_sum_ratio:.3f}", _gain(getattr(r, "e2e_gain", float("nan"))),
            f"{r.preemptions_real:g} / {r.preemptions_sim:g}",
            f"{yn(r.meets_e2e_goal)}/{yn(r.meets_quantile_goal)}/{yn(r.meets_step_sum_goal)}/"
            f"{yn(getattr(r, 'quantiles_within_goal_or_floor', False))} |"]))
    return "\n".join(lines)


def _stalls(r) -> str:
    near = getattr(r, "requests_near_stalls", float("nan"))
    return "" if not np.isfinite(near) else \
        f"{_pct(getattr(r, 'ttft_q50_err_away_from_stalls', float('nan')), True)} ({near:g})"


def _gain(g: float) -> str:
    return "n/a" if not np.isfinite(g) else (f"**{g:.1f}x**" if g > FRAGILE_GAIN else f"{g:.1f}x")


def kinds_markdown(df: pd.DataFrame) -> str:
    lines = ["| workload | policy | step kind | steps | real s | sum pred / real | share of real time |",
             "| --- | --- | --- | --- | --- | --- | --- |"]
    for r in df.itertuples(index=False):
        lines.append(f"| {r.workload} | {r.policy} | {r.kind} | {r.num_steps} | {r.real_s:.3f} | {r.sum_ratio:.3f} | "
                     f"{100 * r.share_of_real:.1f}% |")
    return "\n".join(lines)


def simulate_saved(wl_dir: Path, name: str, policy: str, argv: list[str], cost_model, record_decisions=False):
    """(workload specs, SavedReplays, the simulated RunResult) of `policy` on a kept workload."""
    from experiments.policy_conf import swaps
    from experiments.saved_runs import SavedReplays
    from experiments.validate import build_workload, parse_args, policy_scheduler_config, simulate, split_overrides
    args = parse_args(["--from-real", str(wl_dir), "--out-dir", "/nonexistent", *argv])
    specs = build_workload(args).specs()
    saved = SavedReplays(wl_dir, name)
    cpu = saved.num_cpu_blocks if args.num_cpu_blocks is None else args.num_cpu_blocks
    overrides, _ = split_overrides(args)       # the --override of the run that kept these replays
    sched_cfg = policy_scheduler_config(saved.scheduler_config(num_cpu_blocks=cpu if swaps(policy, overrides) else 0),
                                        policy)
    sim = simulate(specs, policy, cost_model, sched_cfg, saved.vocab_size, temperature=saved.config.temperature,
                   rng_seed=saved.config.seed, record_decisions=record_decisions, overrides=overrides,
                   overlap_scheduling=saved.config.overlap_scheduling)
    return specs, saved, sim


def e2e_gain(sim, biased, bias: float = PRICE_BIAS) -> float:
    """Per-request E2E median |relative change| from sim to biased (the same run simulated with every step
    priced 1 + bias times as long), per unit of bias: ~1 where requests only pay their own steps, more where a
    queue compounds a price error (then a cell's E2E error is about this many times its step-price error)."""
    a = sim.requests.set_index("request_id")["e2e_s"]
    b = biased.requests.set_index("request_id")["e2e_s"].reindex(a.index)
    ok = np.isfinite(a) & np.isfinite(b) & (a > 0)
    return float(np.median(np.abs(b[ok] / a[ok] - 1)) / bias) if ok.any() else float("nan")


def perturbed_sims(wl_dir: Path, name: str, policy: str, argv: list[str], cost_model,
                   bias: float = PRICE_BIAS) -> list:
    """`policy` simulated again with every step price 1 + bias and 1 - bias times as long (the fit's own
    uncertainty): e2e_gain reads the first, policy_diff's simulator band both. [] for a model without `scaled`."""
    if not hasattr(cost_model, "scaled"):
        return []
    return [simulate_saved(wl_dir, name, policy, argv, cost_model.scaled(1 + sign * bias))[2] for sign in (1, -1)]


def errors_vs_repeats(wl_dir: Path, name: str, policy: str, argv: list[str], cost_model,
                      perturbed: list = ()) -> dict:
    """The simulated run scored against every real run of the policy (repeat 0 and each repeat<k>): per-request
    E2E / TTFT median |error| (mean over the runs, and the smallest), and the step-sum ratio on each run; given
    perturbed_sims, `e2e_gain` (the first of them: every price PRICE_BIAS longer); for an overlapped run 0 with
    its decisions recorded, its TTFT p50 error over the requests whose prefill met no launch stall
    (`ttft_q50_err_away_from_stalls`, experiments/launch_stalls.py) and how many did (`requests_near_stalls`)."""
    from experiments.saved_runs import SavedReplays
    from experiments.validate import compare
    _, saved0, sim = simulate_saved(wl_dir, name, policy, argv, cost_model)
    run0 = saved0.run(policy)
    gain = e2e_gain(sim, perturbed[0]) if perturbed else float("nan")
    repeats = sorted(p for p in wl_dir.glob("repeat*") if (p / f"{name}_real.json").is_file())
    runs = [run0] + [saved.run(policy) for saved in (SavedReplays(d, name) for d in repeats)
                     if policy in saved.policies]
    e2e, ttft, sums = [], [], []
    for run in runs:
        c = compare(run, sim, cost_model)
        e2e.append(c["e2e_s"]["median_rel_err"])
        ttft.append(c["ttft_s"]["median_rel_err"])
        sums.append(c["step_time"]["sum_pred_over_real"])
    return dict(e2e_median_err_all_runs=float(np.mean(e2e)), e2e_median_err_best_run=float(np.min(e2e)),
                **ttft_away_from_stalls(run0, wl_dir / f"{name}_{policy}_decisions.parquet", sim, cost_model),
                ttft_median_err_all_runs=float(np.mean(ttft)), step_sum_ratio_all_runs=float(np.mean(sums)),
                step_sum_ratio_min=float(np.min(sums)), step_sum_ratio_max=float(np.max(sums)), num_real_runs=len(e2e),
                e2e_gain=gain)


def ttft_away_from_stalls(run, decisions: Path, sim, cost_model) -> dict:
    """errors_vs_repeats' stall columns for the kept run 0 and its decisions file (NaN where it was not overlapped
    or kept no decisions)."""
    if not decisions.is_file() or not run_was_overlapped(run.info) or "launch_host_s" not in run.steps:
        return dict(ttft_q50_err_away_from_stalls=float("nan"), requests_near_stalls=float("nan"))
    table, _, _ = run_ttft_by_stall(run, sim, cost_model, pd.read_parquet(decisions))
    by = table.set_index("group")
    away = by["p50_rel_err"].get("away from stalls", float("nan"))
    return dict(ttft_q50_err_away_from_stalls=float(away),
                requests_near_stalls=int(by["requests"].get("near a stall", 0)))


def run_divergence(wl_dir: Path, name: str, policy: str, argv: list[str], cost_model) -> dict:
    """Simulate `policy` on the workload with decisions recorded and align it with the saved real run."""
    from experiments.divergence import first_divergence
    specs, saved, sim = simulate_saved(wl_dir, name, policy, argv, cost_model, record_decisions=True)
    real = saved.replay(specs, policy)
    if real.decisions is None:
        raise ValueError(f"{wl_dir}: the {policy} run has no decisions (replay with --record-decisions)")
    out = first_divergence(real.decisions, sim.decisions, {s.request_id: s.arrival_time_s for s in specs})
    return {"workload": name, "policy": policy, **out}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m experiments.generalize", description=__doc__.split("\n\n")[0])
    ap.add_argument("--real-root", required=True, help="folder with one <workload>/ folder of saved real runs each")
    ap.add_argument("--profile", required=True, help="the calibrated fit (experiments.calibrate JSON)")
    ap.add_argument("--out", required=True, help="output folder")
    ap.add_argument("--traces-dir", default=None, help="where the traces the GPU run read are here (their paths "
                    "are re-rooted at this folder)")
    ap.add_argument("--workloads", default=None, help="comma-separated (default: every folder in --real-root)")
    ap.add_argument("--divergence", action="append", default=[], metavar="WORKLOAD:POLICY",
                    help="align this simulated run with the real one decision by decision (repeatable)")
    args = ap.parse_args(argv)
    from experiments import validate
    from sim.cost_model.calibrated import CalibratedCostModel

    root, out = Path(args.real_root), Path(args.out)
    if not Path(args.profile).is_file():
        raise FileNotFoundError(f"--profile {args.profile}: no such file (the fit experiments.calibrate wrote)")
    cm = CalibratedCostModel.load(args.profile)
    workloads = find_workloads(root, args.workloads.split(",") if args.workloads else None)
    rows, kinds, diffs, commands, argvs, overlapped = [], [], [], {}, {}, []
    for name, wl_dir in workloads.items():
        wl_argv = saved_argv(wl_dir, name, args.traces_dir)
        if not wl_argv:
            raise ValueError(f"{wl_dir}: {name}_real.json keeps no validate argv (saved before argv was recorded)")
        argvs[name] = wl_argv
        cmd = ["--from-real", str(wl_dir), "--name", name, "--profile", args.profile, "--no-roofline", "--no-plot",
               "--out-dir", str(out / "reports"), *wl_argv]
        commands[name] = "python -m experiments.validate " + " ".join(shlex.quote(a) for a in cmd)
        print(f"[{name}] {commands[name]}", flush=True)
        validate.main(cmd)
        report = json.loads((out / "reports" / f"validation_{name}.json").read_text())
        floor, real_summaries = floors(wl_dir, name)
        sims, perturbed = {}, {}
        from experiments.saved_runs import SavedReplays
        saved = SavedReplays(wl_dir, name)
        for policy, entry in report["policies"].items():
            s = entry.get("sims", {}).get("calibrated")
            if not s or "error" in s:
                continue
            sims[policy] = s["summary_sim"]
            pert = perturbed_sims(wl_dir, name, policy, wl_argv, cm)
            perturbed[policy] = [validate.run_summary(p) for p in pert]
            rows.append(with_quantile_bands({**table_row(name, policy, s, floor.get(policy, {})),
                                             **errors_vs_repeats(wl_dir, name, policy, wl_argv, cm, pert)},
                                            sims[policy], perturbed[policy]))
            run = saved.run(policy)
            overlapped.append(run_was_overlapped(run.info))
            kinds.append(step_kinds(run.steps, cm, overlapped[-1]).assign(workload=name, policy=policy))
        diffs.append(policy_diff.policy_differences(real_summaries, sims, perturbed=perturbed).assign(workload=name))
    table = pd.DataFrame(rows)
    kinds_df = pd.concat(kinds, ignore_index=True) if kinds else pd.DataFrame()
    diff_df = pd.concat(diffs, ignore_index=True) if diffs else pd.DataFrame()
    divergences = []
    for item in args.divergence:
        wl, _, pol = item.partition(":")
        if wl not in workloads or not pol:
            raise ValueError(f"--divergence {item!r}: give WORKLOAD:POLICY with a workload of {sorted(workloads)}")
        divergences.append(run_divergence(workloads[wl], wl, pol, argvs[wl], cm))
        print(f"[divergence {item}] {divergences[-1].get('cause', 'none')}: "
              f"{divergences[-1].get('explanation', 'no divergence')}", flush=True)
    out.mkdir(parents=True, exist_ok=True)
    write_parquet(table, out / "generalize.parquet")
    write_parquet(kinds_df, out / "step_kinds.parquet")
    write_parquet(diff_df, out / "policy_diff.parquet")
    atomic_write_text(out / "generalize.md", to_markdown(table) + "\n")
    atomic_write_text(out / "step_kinds.md", kinds_markdown(kinds_df) + "\n")
    atomic_write_text(out / "policy_diff.md", policy_diff.to_markdown(diff_df) + "\n")
    write_json(out / "divergence.json", divergences)
    summary = suite_summary(table)
    # what the fit's own metadata says against it (sim/cost_model/fit_trust.py); host drift only where a run is
    # synchronous
    summary["fit_concerns"] = fit_concerns(cm.metadata, overlapped=bool(overlapped) and all(overlapped))
    plots.generalization(table, diff_df, out / "generalize.png", GOALS,
                         title=f"{Path(args.profile).name}: {len(table)} cells, "
                               f"{table['workload'].nunique()} workloads")
    write_json(out / "generalize.json", {
        "format": "servelab.generalize/v1", "profile": args.profile, "goals": GOALS,
        "command": "python -m experiments.generalize " + " ".join(shlex.quote(a) for a in (argv or sys.argv[1:])),
        "date": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"), "validate_commands": commands,
        "rows": table.to_dict(orient="records"),
        "summary": summary, "policy_diff_summary": _diff_summary(diff_df), "divergence": divergences})
    with pd.option_context("display.width", 250, "display.max_columns", None, "display.precision", 3):
        print(to_markdown(table))
        print(_diff_summary(diff_df))
    print(summary_line(summary))
    print(f"wrote {out}/generalize.{{parquet,md,json,png}}, step_kinds, policy_diff, divergence.json")
    return 0


def suite_summary(table: pd.DataFrame) -> dict:
    """The suite's goals counted over its cells: E2E median |error| (median and max cell, by workload), cells
    within the E2E goal, at or below their floor, with step sums within their band, with TTFT p50 and with all of
    the TTFT and of the E2E quantiles within their goal."""
    e2e = table["e2e_median_err"].abs()
    ttft_q = table[["ttft_q50_err", "ttft_q90_err", "ttft_q99_err"]].abs().max(axis=1)
    e2e_q = table[["e2e_q50_err", "e2e_q90_err", "e2e_q99_err"]].abs().max(axis=1)
    return {
        "num_cells": int(len(table)),
        "e2e_median_err_median": float(e2e.median()), "e2e_median_err_max": float(e2e.max()),
        "e2e_median_err_by_workload": {w: float(v) for w, v in e2e.groupby(table["workload"]).median().items()},
        "cells_e2e_goal": int((e2e <= GOALS["e2e_median_err"]).sum()),
        "cells_at_or_below_floor": int((e2e <= table["floor_e2e_median"]).sum()),
        "cells_step_sum_goal": int(((table["step_sum_ratio"] - 1).abs() <= GOALS["step_sum_err"]).sum()),
        "cells_ttft_p50_goal": int((table["ttft_q50_err"].abs() <= GOALS["quantile_err"]).sum()),
        "cells_ttft_quantiles_goal": int((ttft_q <= GOALS["quantile_err"]).sum()),
        "cells_ttft_p50_goal_away_from_stalls": _within(table, "ttft_q50_err_away_from_stalls"),
        "cells_e2e_quantiles_goal": int((e2e_q <= GOALS["quantile_err"]).sum()),
        "cells_quantiles_goal_or_floor": int(table["quantiles_within_goal_or_floor"].sum())
        if "quantiles_within_goal_or_floor" in table else None,
        "cells_quantiles_goal_floor_or_band": int(table["quantiles_within_goal_floor_or_band"].sum())
        if "quantiles_within_goal_floor_or_band" in table else None,
        "ttft_quantile_misses_inside_sim_band": _misses_inside_band(table, "ttft"),
        "e2e_quantile_misses_inside_sim_band": _misses_inside_band(table, "e2e"),
        "cells_real_ttft_quantiles_repeat": int((table[[f"floor_ttft_q{q}" for q in ("50", "90", "99")]].max(axis=1)
                                                 <= GOALS["quantile_err"]).sum())
        if "floor_ttft_q50" in table else None,
        "quantile_misses_rank_pts": _misses_rank(table),
        "fragile_cells": [f"{r.workload}:{r.policy}" for r in table.itertuples(index=False)
                          if getattr(r, "e2e_gain", 0.0) > FRAGILE_GAIN],
    }


def _within(table: pd.DataFrame, col: str) -> list[int] | None:
    """[cells whose `col` is within the quantile goal, cells that have it]; None where no cell has it."""
    if col not in table or table[col].isna().all():
        return None
    v = table[col].dropna().abs()
    return [int((v <= GOALS["quantile_err"]).sum()), int(len(v))]


def _misses_inside_band(table: pd.DataFrame, m: str) -> list[int] | None:
    """[quantile errors of metric m (p50, p90, p99 over the cells) beyond the goal, how many of them within the
    simulator's own band on that quantile]; None for a table without bands."""
    if f"sim_band_{m}_q50" not in table:
        return None
    err = table[[f"{m}_q{q}_err" for q in ("50", "90", "99")]].abs().to_numpy()
    band = table[[f"sim_band_{m}_q{q}" for q in ("50", "90", "99")]].to_numpy()
    miss = err > GOALS["quantile_err"]
    return [int(miss.sum()), int((miss & (err <= np.nan_to_num(band))).sum())]


def _misses_rank(table: pd.DataFrame) -> list[float] | None:
    """[TTFT and E2E quantile errors beyond the goal, how many sit within RANK_PTS percentile points of the real
    quantile, the largest shift in points]; None for a table without rank columns (saved before them)."""
    cols = [f"{m}_q{q}" for m in ("ttft", "e2e") for q in ("50", "90", "99")]
    if f"{cols[0]}_rank_pts" not in table or table[[f"{c}_rank_pts" for c in cols]].isna().all(axis=None):
        return None
    err = table[[f"{c}_err" for c in cols]].abs().to_numpy()
    pts = np.nan_to_num(table[[f"{c}_rank_pts" for c in cols]].abs().to_numpy(), nan=np.inf)
    miss = err > GOALS["quantile_err"]
    return [int(miss.sum()), int((miss & (pts <= RANK_PTS)).sum()), float(pts[miss].max()) if miss.any() else 0.0]


def summary_line(s: dict) -> str:
    by = ", ".join(f"{w} {100 * v:.1f}%" for w, v in s["e2e_median_err_by_workload"].items())
    n = s["num_cells"]
    return (f"{n} cells: E2E median |error| median {100 * s['e2e_median_err_median']:.1f}%, max "
            f"{100 * s['e2e_median_err_max']:.1f}% (by workload: {by}); within goals: E2E {s['cells_e2e_goal']}/{n}, "
            f"step sums {s['cells_step_sum_goal']}/{n}, TTFT p50 {s['cells_ttft_p50_goal']}/{n}"
            + (f" (over the requests whose prefill met no launch stall "
               f"{s['cells_ttft_p50_goal_away_from_stalls'][0]}/{s['cells_ttft_p50_goal_away_from_stalls'][1]})"
               if s.get("cells_ttft_p50_goal_away_from_stalls") else "")
            + f", TTFT quantiles "
            f"{s['cells_ttft_quantiles_goal']}/{n}, E2E quantiles {s['cells_e2e_quantiles_goal']}/{n}"
            + (f" (all six quantiles within 3% or their real-vs-real floor {s['cells_quantiles_goal_or_floor']}/{n}; "
               f"real TTFT quantiles repeat within 3% in {s['cells_real_ttft_quantiles_repeat']}/{n})"
               if s.get("cells_quantiles_goal_or_floor") is not None else "")
            + (f"; quantile misses inside the simulator's own band: TTFT {s['ttft_quantile_misses_inside_sim_band'][1]}"
               f" of {s['ttft_quantile_misses_inside_sim_band'][0]}, E2E {s['e2e_quantile_misses_inside_sim_band'][1]} "
               f"of {s['e2e_quantile_misses_inside_sim_band'][0]} (all six within goal, floor or band "
               f"{s['cells_quantiles_goal_floor_or_band']}/{n})"
               if s.get("ttft_quantile_misses_inside_sim_band") is not None else "")
            + (f"; of the {s['quantile_misses_rank_pts'][0]} quantiles beyond 3%, {s['quantile_misses_rank_pts'][1]} "
               f"sit within {RANK_PTS:g} percentile point(s) of the real one (largest shift "
               f"{s['quantile_misses_rank_pts'][2]:.1f} points)" if s.get("quantile_misses_rank_pts") else "")
            + f"; at or below "
            f"the floor {s['cells_at_or_below_floor']}/{n}"
            + (f"; fragile (E2E moves > {FRAGILE_GAIN:g}% per 1% of step price: a ranking there rests on the fit's "
               f"last percent): {', '.join(s['fragile_cells'])}" if s.get("fragile_cells") else "")
            + (f"; the fit's own concerns: {'; '.join(s['fit_concerns'])}" if s.get("fit_concerns") else ""))


def _diff_summary(df: pd.DataFrame) -> dict:
    """Counts of verdicts; among pairs whose real difference exceeds twice its band, how many agree."""
    if df.empty:
        return {}
    sig = df[df["real_significant"]]
    return {"num_pairs_metrics": int(len(df)), "verdicts": df["verdict"].value_counts().to_dict(),
            "num_significant": int(len(sig)), "num_significant_agree": int((sig["verdict"] == "agree").sum()),
            "num_significant_sign_right": int(sig["sign_agrees"].sum()),
            "num_significant_within_sim_band": int(sig["sim_within_own_band"].sum())
            if "sim_within_own_band" in sig else 0}


if __name__ == "__main__":
    from experiments.user_errors import run_main
    sys.exit(run_main(main))
