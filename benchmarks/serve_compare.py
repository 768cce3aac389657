"""The HTTP path against the in-process replay of the same workload: TTFT and throughput ratios, checked against goals.

    python benchmarks/serve_compare.py --inproc RUN_DIR [RUN_DIR ...] --http RUN_DIR [RUN_DIR ...] \
        [--loadgen loadgen.json] --out compare.json

RUN_DIR is a servelab run folder (summary.json): `backend=engine` for --inproc, `backend=http` against a server on
the same checkpoint and limits for --http (benchmarks/gpu_serve.sh makes both). Ratios are HTTP over in-process;
the goals: TTFT p50 at most GOALS["ttft_p50_ratio_max"], output throughput within GOALS["output_tps_rel_tol"].
With repeats (several folders a side) the ratios compare the first run of each side, and `repeats` gives every
run's numbers and each side's own spread (max / min over its runs): the noise a ratio is read against.
Prints one line per number and writes them all (with both runs' metrics) to --out. Exit status 0 whether or not
the goals are met (the report says which), 1 when a run is missing.
"""
from __future__ import annotations

import argparse
import datetime as _dt
import json
import sys
from pathlib import Path

GOALS = {"ttft_p50_ratio_max": 1.05, "output_tps_rel_tol": 0.02}
RATIOS = ("ttft_s_p50", "ttft_s_p90", "ttft_s_p99", "tpot_s_p50", "e2e_s_p50", "output_throughput_tps",
          "request_throughput_rps", "makespan_s")


def _ratio(a, b):
    return a / b if a is not None and b not in (None, 0) and a == a and b == b else None


def compare(inproc: dict, http: dict) -> dict:
    """inproc, http: summary.json contents. Ratios (HTTP / in-process) and whether each goal is met."""
    mi, mh = inproc["metrics"], http["metrics"]
    ratios = {k: _ratio(mh.get(k), mi.get(k)) for k in RATIOS}
    ttft, tps = ratios["ttft_s_p50"], ratios["output_throughput_tps"]
    same = mi.get("num_requests") == mh.get("num_requests") and mi.get("num_output_tokens") == mh.get(
        "num_output_tokens")
    return {"ratios_http_over_inproc": ratios, "goals": GOALS,
            "ttft_p50_goal_met": ttft is not None and ttft <= GOALS["ttft_p50_ratio_max"],
            "output_tps_goal_met": tps is not None and abs(tps - 1) <= GOALS["output_tps_rel_tol"],
            "same_requests_and_output_tokens": bool(same),
            "http_failed": http["meta"].get("num_failed"),
            "http_client_send_lateness_s_max": http["meta"].get("client_send_lateness_s_max"),
            "inproc": {k: mi.get(k) for k in ("num_requests", "num_finished", "num_output_tokens", *RATIOS)},
            "http": {k: mh.get(k) for k in ("num_requests", "num_finished", "num_output_tokens", *RATIOS)}}


def repeats(runs: dict) -> dict:
    """Every run's RATIOS metrics, per side, and each side's spread (max / min over its runs) of each."""
    out = {}
    for side, summaries in runs.items():
        values = {k: [s["metrics"].get(k) for s in summaries] for k in RATIOS}
        spread = {k: (max(v) / min(v) if all(x is not None and x > 0 for x in v) else None)
                  for k, v in values.items()}
        out[side] = {"runs": values, "max_over_min": spread}
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python benchmarks/serve_compare.py", description=__doc__.split("\n\n")[0])
    ap.add_argument("--inproc", required=True, nargs="+")
    ap.add_argument("--http", required=True, nargs="+")
    ap.add_argument("--loadgen", default=None, help="benchmarks/loadgen.py's loadgen.json, added to the report")
    ap.add_argument("--out", required=True)
    ap.add_argument("--device", default=None)
    ap.add_argument("--command", default=None, help="the command that made the runs (recorded)")
    args = ap.parse_args(argv)
    runs = {}
    for name in ("inproc", "http"):
        runs[name] = []
        for folder in getattr(args, name):
            path = Path(folder) / "summary.json"
            if not path.is_file():
                print(f"error: --{name} {path.parent}: no summary.json (did that run fail?)", file=sys.stderr)
                return 1
            runs[name].append(json.loads(path.read_text()))
    report = {"date": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"), "device": args.device,
              "command": args.command, **compare(runs["inproc"][0], runs["http"][0])}
    if len(runs["inproc"]) > 1 or len(runs["http"]) > 1:
        report["repeats"] = repeats(runs)
    if args.loadgen and Path(args.loadgen).is_file():
        lg = json.loads(Path(args.loadgen).read_text())
        report["loadgen"] = {k: v for k, v in lg.items() if k != "command"} | {"command": " ".join(lg["command"])}
    Path(args.out).write_text(json.dumps(report, indent=2) + "\n")
    r = report["ratios_http_over_inproc"]
    fmt = lambda x: "n/a" if x is None else f"{x:.4f}"  # noqa: E731
    print(f"TTFT p50: http {fmt(report['http']['ttft_s_p50'])} s, in-process {fmt(report['inproc']['ttft_s_p50'])} s, "
          f"ratio {fmt(r['ttft_s_p50'])} (goal <= {GOALS['ttft_p50_ratio_max']}: "
          f"{'met' if report['ttft_p50_goal_met'] else 'NOT met'})")
    print(f"output throughput: http {fmt(report['http']['output_throughput_tps'])} tok/s, in-process "
          f"{fmt(report['inproc']['output_throughput_tps'])} tok/s, ratio {fmt(r['output_throughput_tps'])} "
          f"(goal within {GOALS['output_tps_rel_tol']:.0%}: {'met' if report['output_tps_goal_met'] else 'NOT met'})")
    for side, rep in (report.get("repeats") or {}).items():
        print(f"{side}: TTFT p50 over {len(rep['runs']['ttft_s_p50'])} runs "
              + ", ".join(fmt(x) for x in rep["runs"]["ttft_s_p50"])
              + f" s (max / min {fmt(rep['max_over_min']['ttft_s_p50'])}); output tok/s "
              + ", ".join(fmt(x) for x in rep["runs"]["output_throughput_tps"]))
    print(f"same requests and output tokens: {report['same_requests_and_output_tokens']}; HTTP failures: "
          f"{report['http_failed']}; wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
