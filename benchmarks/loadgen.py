"""A bounded guidellm run against an OpenAI-compatible server, its JSON report parsed and checked.

    python benchmarks/loadgen.py --url http://127.0.0.1:8000 --tokenizer CKPT_OR_TOKENIZER_DIR \
        --rate-rps 6 --num-requests 300 --prompt-tokens 256 --output-tokens 128 --out DIR

guidellm (`pip install guidellm`; the standard load generator of the vLLM project) sends --num-requests synthetic
text completions (/v1/completions, streamed, ignore_eos) at a constant --rate-rps, with prompts made and counted by
the local tokenizer (no hub access: HF_HUB_OFFLINE is set). The run stops after --num-requests, --max-seconds or
--max-errors, whichever comes first; guidellm runs in DIR, so nothing lands elsewhere. DIR/guidellm.json is
guidellm's own report; the summary (requests completed, errored, incomplete; TTFT, ITL, output throughput) is printed
as one JSON line and written to DIR/loadgen.json. Exit status 1 when a request errored or did not complete.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path


def guidellm_command(url: str, tokenizer: str, out_json: Path, *, rate_rps: float, num_requests: int,
                     prompt_tokens: int, output_tokens: int, max_seconds: float, max_errors: int,
                     model: str | None = None) -> list[str]:
    """The guidellm command line of one bounded constant-rate run (guidellm 0.8's `run` syntax), as `python -m
    guidellm`: a package installed with --target (the GPU machine's carried wheels) has no console script on PATH."""
    backend = f"kind=openai_http,target={url},request_format=/v1/completions"
    if model:
        backend += f",model={model}"
    return [sys.executable, "-m", "guidellm", "run", "--backend", backend,
            "--profile", f"kind=constant,rate={rate_rps}",
            "--constraint", f"kind=max_requests,count={num_requests}",
            "--constraint", f"kind=max_duration,seconds={max_seconds}",
            "--constraint", f"kind=max_errors,count={max_errors}",
            "--data", f"kind=synthetic_text,prompt_tokens={prompt_tokens},output_tokens={output_tokens}",
            "--tokenizer", f"kind=huggingface_auto,model={tokenizer}",
            "--output", f"kind=json,path={out_json}", "--disable-console-interactive"]


def _stat(metric: dict, key: str):
    s = (metric or {}).get("successful") or {}
    return s.get("percentiles", {}).get(key) if key.startswith("p") else s.get(key)


def parse_report(path: Path) -> dict:
    """The numbers of guidellm's JSON report (its first benchmark) this project checks."""
    report = json.loads(Path(path).read_text())
    bench = report["benchmarks"][0]
    m = bench["metrics"]
    totals = m["request_totals"]
    return {"successful": int(totals["successful"]), "errored": int(totals["errored"]),
            "incomplete": int(totals["incomplete"]), "total": int(totals["total"]),
            "duration_s": bench.get("duration"),
            "request_rate_rps": _stat(m["requests_per_second"], "mean"),
            "ttft_ms_p50": _stat(m["time_to_first_token_ms"], "p50"),
            "ttft_ms_p99": _stat(m["time_to_first_token_ms"], "p99"),
            "itl_ms_p50": _stat(m["inter_token_latency_ms"], "p50"),
            "output_tokens_mean": _stat(m["output_token_count"], "mean"),
            "output_throughput_tps": _stat(m["output_tokens_per_second"], "mean")}


SAMPLE_TEXT = "The quick brown fox jumps over the lazy dog while the old man reads his morning paper."


def unknown_token_share(tokenizer_dir: str) -> float:
    """Share of SAMPLE_TEXT's tokens that the tokenizer maps to its unknown token (1 when it keeps none). guidellm
    builds its synthetic prompts from English text cut to --prompt-tokens by this tokenizer; one that knows no English
    (the tiny checkpoint's w0..w509 words) gives it prompts of unknown tokens only, and guidellm then sends no request
    at all (it fails in its report: "No measurement start or end times available")."""
    from transformers import AutoTokenizer
    tok = AutoTokenizer.from_pretrained(tokenizer_dir)
    ids = tok(SAMPLE_TEXT, add_special_tokens=False).input_ids
    if not ids:                   # the text drops out entirely: as useless to guidellm as unknown tokens
        return 1.0
    return 0.0 if tok.unk_token_id is None else sum(i == tok.unk_token_id for i in ids) / len(ids)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python benchmarks/loadgen.py", description=__doc__.split("\n\n")[0])
    ap.add_argument("--url", required=True)
    ap.add_argument("--tokenizer", required=True, help="local tokenizer folder (the served checkpoint's)")
    ap.add_argument("--model", default=None, help="served model name (default: the server's first)")
    ap.add_argument("--rate-rps", type=float, default=10.0)
    ap.add_argument("--num-requests", type=int, default=20)
    ap.add_argument("--prompt-tokens", type=int, default=64)
    ap.add_argument("--output-tokens", type=int, default=16)
    ap.add_argument("--max-seconds", type=float, default=120.0)
    ap.add_argument("--max-errors", type=int, default=10)
    ap.add_argument("--workers", type=int, default=None, help="guidellm's worker processes (each imports torch: "
                    "1 on a small machine; default: guidellm's own)")
    ap.add_argument("--timeout-s", type=float, default=None, help="kill guidellm after this long (default: "
                    "max-seconds + 120 s for its start-up and report)")
    ap.add_argument("--out", required=True, help="folder for guidellm.json, guidellm.log and loadgen.json")
    args = ap.parse_args(argv)
    if not Path(args.tokenizer).is_dir():
        raise SystemExit(f"error: --tokenizer {args.tokenizer}: no such folder (a local tokenizer; nothing is "
                         "downloaded)")
    if unknown_token_share(args.tokenizer) > 0.5:
        raise SystemExit(f"error: --tokenizer {args.tokenizer} maps most English words to its unknown token, so "
                         "guidellm can build no prompts from its English source text and would send no request; give "
                         "a tokenizer that reads English (any real checkpoint's: the server tokenizes the text "
                         "itself, this one only counts guidellm's prompt tokens)")
    out = Path(args.out).resolve()
    out.mkdir(parents=True, exist_ok=True)
    report = out / "guidellm.json"
    report.unlink(missing_ok=True)
    cmd = guidellm_command(args.url, str(Path(args.tokenizer).resolve()), report, rate_rps=args.rate_rps,
                           num_requests=args.num_requests,
                           prompt_tokens=args.prompt_tokens, output_tokens=args.output_tokens,
                           max_seconds=args.max_seconds, max_errors=args.max_errors, model=args.model)
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1",
           "GUIDELLM__LOGGING__LOG_FILE": str((out / "guidellm_debug.log").resolve())}
    if args.workers is not None:
        env["GUIDELLM__MAX_WORKER_PROCESSES"] = str(args.workers)
    with open(out / "guidellm.log", "w") as log:
        proc = subprocess.run(cmd, stdout=log, stderr=subprocess.STDOUT, env=env, cwd=out,
                              timeout=args.timeout_s or args.max_seconds + 120)
    if proc.returncode != 0 or not report.is_file():
        tail = (out / "guidellm.log").read_text().strip().splitlines()[-5:]
        print(f"error: guidellm exited with status {proc.returncode} and "
              f"{'a' if report.is_file() else 'no'} report; its log ends: " + " | ".join(tail), file=sys.stderr)
        return 1
    summary = {"command": cmd, **parse_report(report)}
    (out / "loadgen.json").write_text(json.dumps(summary, indent=2) + "\n")
    print(json.dumps({k: v for k, v in summary.items() if k != "command"}), flush=True)
    ok = summary["errored"] == 0 and summary["incomplete"] == 0 and summary["successful"] == args.num_requests
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
