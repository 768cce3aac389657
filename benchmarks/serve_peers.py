"""Several OpenAI-compatible servers replayed by the same client: one table and one JSON of their latencies.

    python benchmarks/serve_peers.py --http servelab=RUN_DIR --http vllm=RUN_DIR [--loadgen NAME=loadgen.json ...] \
        [--skipped NAME=REASON ...] [--setting KEY=VALUE ...] [--reference servelab] --out serve_peers.json

RUN_DIR is a `servelab backend=http` run folder (summary.json) of the same workload against server NAME on the same
checkpoint and limits (benchmarks/gpu_vllm_serve.sh makes them); --loadgen adds benchmarks/loadgen.py's guidellm
summary of that server. Every latency is the client's (send to first token, between tokens, send to last token), so
the servers are measured alike. Ratios are each server over --reference (default: the first --http). A server named
by --skipped (not run, and why) or whose run folder lacks summary.json is kept in the report with its reason.
Prints one line per server and writes everything to --out. Exit status 0 when every --http run not --skipped is there,
1 otherwise (the report is written either way), 2 for a malformed argument.
"""
from __future__ import annotations

import argparse
import datetime as _dt
import json
import sys
from pathlib import Path

METRICS = ("ttft_s_p50", "ttft_s_p90", "tpot_s_p50", "tpot_s_p90", "e2e_s_p50", "e2e_s_p90", "output_throughput_tps",
           "request_throughput_rps", "makespan_s")
COUNTS = ("num_requests", "num_finished", "num_output_tokens")


def _pairs(values: list[str], flag: str) -> dict[str, str]:
    """NAME=VALUE arguments as a dict, in order; a malformed or repeated one is a one-line error (exit 2)."""
    out = {}
    for v in values or []:
        name, sep, rest = v.partition("=")
        if not sep or not name:
            raise SystemExit(f"error: {flag} {v!r}: give NAME=VALUE, e.g. {flag} vllm=...")
        if name in out:
            raise SystemExit(f"error: {flag} {name} given twice: give each server once")
        out[name] = rest
    return out


def server_row(summary: dict | None, loadgen: dict | None) -> dict:
    """One server's entry: its METRICS and COUNTS from summary.json, its failures, and guidellm's summary if any."""
    if summary is None:
        return {"metrics": None, "loadgen": loadgen}
    m = summary["metrics"]
    return {"metrics": {k: m.get(k) for k in (*COUNTS, *METRICS)}, "http_failed": summary["meta"].get("num_failed"),
            "client_send_lateness_s_max": summary["meta"].get("client_send_lateness_s_max"), "loadgen": loadgen}


def ratios(servers: dict, reference: str) -> dict:
    """{server: {metric: its value / the reference's}} for every measured server but the reference."""
    ref = (servers.get(reference) or {}).get("metrics")
    out = {}
    for name, row in servers.items():
        if name == reference or not row.get("metrics") or not ref:
            continue
        out[name] = {k: (row["metrics"][k] / ref[k] if row["metrics"].get(k) is not None and ref.get(k) else None)
                     for k in METRICS}
    return out


def same_work(servers: dict) -> bool | None:
    """Whether every measured server finished the same requests with the same output tokens (None: fewer than 2)."""
    seen = {tuple(row["metrics"].get(k) for k in COUNTS) for row in servers.values() if row.get("metrics")}
    measured = sum(1 for row in servers.values() if row.get("metrics"))
    return None if measured < 2 else len(seen) == 1


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python benchmarks/serve_peers.py", description=__doc__.split("\n\n")[0])
    ap.add_argument("--http", action="append", required=True, help="NAME=RUN_DIR (servelab backend=http's folder)")
    ap.add_argument("--loadgen", action="append", default=[], help="NAME=loadgen.json (benchmarks/loadgen.py)")
    ap.add_argument("--skipped", action="append", default=[], help="NAME=REASON: a server that was not run")
    ap.add_argument("--setting", action="append", default=[], help="KEY=VALUE recorded under settings")
    ap.add_argument("--reference", default=None, help="the server the ratios divide by (default: the first --http)")
    ap.add_argument("--out", required=True)
    ap.add_argument("--device", default=None)
    ap.add_argument("--command", default=None, help="the command that made the runs (recorded)")
    args = ap.parse_args(argv)
    runs, loadgens = _pairs(args.http, "--http"), _pairs(args.loadgen, "--loadgen")
    skipped, settings = _pairs(args.skipped, "--skipped"), _pairs(args.setting, "--setting")
    reference = args.reference or next(iter(runs))
    if reference not in runs:
        raise SystemExit(f"error: --reference {reference}: not one of the --http servers ({', '.join(runs)})")
    servers, missing = {}, {}
    for name, folder in runs.items():
        lg_path = loadgens.get(name)
        loadgen = json.loads(Path(lg_path).read_text()) if lg_path and Path(lg_path).is_file() else None
        if loadgen and isinstance(loadgen.get("command"), list):
            loadgen["command"] = " ".join(loadgen["command"])
        path = Path(folder) / "summary.json"
        summary = json.loads(path.read_text()) if path.is_file() else None
        servers[name] = server_row(summary, loadgen)
        if name in skipped:
            servers[name]["skipped"] = skipped[name]
            missing[name] = f"skipped: {skipped[name]}"
        elif summary is None:
            missing[name] = f"no {path} (did that server or its replay fail? see the log)"
            servers[name]["missing"] = missing[name]
    report = {"date": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"), "device": args.device,
              "command": args.command, "settings": settings, "reference": reference,
              "same_requests_and_output_tokens": same_work(servers), "servers": servers,
              "ratios_over_reference": ratios(servers, reference)}
    Path(args.out).write_text(json.dumps(report, indent=2) + "\n")
    ms = lambda x: "n/a" if x is None else f"{x * 1e3:.1f}"  # noqa: E731
    for name, row in servers.items():
        m = row.get("metrics")
        if not m:
            print(f"{name}: {missing[name]}")
            continue
        print(f"{name}: TTFT p50/p90 {ms(m['ttft_s_p50'])}/{ms(m['ttft_s_p90'])} ms, TPOT p50/p90 "
              f"{ms(m['tpot_s_p50'])}/{ms(m['tpot_s_p90'])} ms, E2E p50/p90 {ms(m['e2e_s_p50'])}/{ms(m['e2e_s_p90'])} "
              f"ms, output {m['output_throughput_tps'] or 0:,.0f} tok/s, {m['num_finished']}/{m['num_requests']} "
              f"finished, HTTP failures {row['http_failed']}")
    print(f"same requests and output tokens: {report['same_requests_and_output_tokens']}; wrote {args.out}")
    return 1 if any(n not in skipped for n in missing) else 0


if __name__ == "__main__":
    sys.exit(main())
