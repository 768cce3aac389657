"""Why one policy's decode steps run faster than another's at the same shape: replays a workload under each of
--policies (overlap scheduling, as the generalization suite runs them), keeps every step's batch (each entry's new
tokens, context and KV block table), then times a sample of those batches again on the idle runner, one at a
time, in several variants (decode_gap.parquet: one row per policy, step and variant, the re-timed step's median
device seconds and the live run's own). With --chain, each replay's kept batches are also launched again in their
order, one ahead of the previous one's collection as the overlap loop runs them, but without the scheduler: all of
them, the pure decode batches alone, and those with the device spinning in place of each step that has prefill
entries, for that step's live device seconds (decode_gap_chain.parquet, a row per step and chain).

  own         the batch as it ran: its entries, contexts and block tables
  contiguous  the same contexts on KV blocks 0, 1, 2, ... (each entry's blocks consecutive, in batch order)
  sorted      the entries reordered longest context first, their own block tables
  chunk_only  (steps with a prefill entry and riding decodes) the prefill entries alone, their own tables
  decodes_only  (the same steps) the riding decodes alone, as a pure decode step (a CUDA graph)

If the own variant reproduces the live gap between the policies at matched shapes, the gap is in the batches
(their contexts' spread, order or block layout, which the other variants separate); if not, it is in what runs
around a step in the live loop; the chains tell the loop's host side (scheduler, placeholders) from the device's
sequence of steps. The mixed rows price a chunk's riding decodes: own - chunk_only is what they add to a step,
against decodes_only, what they cost alone.

    python benchmarks/decode_gap.py --model CKPT --out DIR [--policies vllm,sarathi] [--sample 400] [--one-engine]
        [--chain] [workload flags of experiments.validate; default busy_chunked's]
    python benchmarks/decode_gap.py --summarize DIR --profile FIT.json      # CPU: the figures, against a fit

Not part of the suite: a diagnostic for the device model's decode and mixed-step terms
(docs/validation.md, benchmarks/results/generalize/).
"""
from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np

T0 = time.perf_counter()
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))     # the repository root, where servelab is not installed

# gpu_generalize.sh's busy_chunked family: tens of requests decoding at once, chunks carrying tens of decodes
BUSY_CHUNKED = ["--num-requests", "200", "--arrival", "poisson", "--rate-rps", "25", "--prompt-len", "200:2000",
                "--output-len", "100:500", "--num-kvcache-blocks", "4096", "--max-model-len", "8192"]
SMOKE = ["--num-requests", "12", "--arrival", "poisson", "--rate-rps", "40", "--prompt-len", "16:128",
         "--output-len", "8:24", "--num-kvcache-blocks", "64", "--max-model-len", "512"]


class Capture:
    """Wraps ModelRunner.launch: keeps each launched batch's entries (new tokens, context, token count, block
    table), in launch order, which is the recorder's step order."""

    def __init__(self):
        self.batches: list[dict] = []
        self.runners: list = []
        self.active = True          # off once the replays are done: the re-timed launches are not kept

    def install(self):
        from engine.model_runner import ModelRunner
        orig = ModelRunner.launch
        cap = self

        def launch(runner, batch):
            if not cap.active:
                return orig(runner, batch)
            if runner not in cap.runners:
                cap.runners.append(runner)
            if batch.seqs and not (batch.swap_out or batch.swap_in or batch.offload or batch.load):
                # numpy arrays, not lists: a few objects a batch for the garbage collector to walk while the live
                # loop keeps thousands of them
                cap.batches.append(dict(
                    num_prefill_seqs=batch.num_prefill_seqs, new=np.asarray(batch.num_new_tokens, np.int64),
                    ctx=np.asarray(batch.context_lens, np.int64),
                    ntok=np.fromiter((len(s.token_ids) for s in batch.seqs), np.int64, len(batch.seqs)),
                    blocks=np.fromiter((x for s in batch.seqs for x in s.block_table), np.int32),
                    ends=np.cumsum([len(s.block_table) for s in batch.seqs])))
            else:
                cap.batches.append(None)
            return orig(runner, batch)

        ModelRunner.launch = launch


def entries_of(b: dict) -> list[tuple[int, int, int, list[int]]]:
    """A kept batch's (new tokens, context, token count, block table) entries."""
    tables = np.split(b["blocks"], b["ends"][:-1]) if "blocks" in b else b["tables"]
    return [(int(n), int(c), int(t), [int(x) for x in tab]) for n, c, t, tab in zip(b["new"], b["ctx"], b["ntok"],
                                                                                    tables)]


def rebuild(entries: list[tuple[int, int, int, list[int]]], num_prefill: int, block_size: int, vocab: int, rng):
    """A Batch of (new tokens, context, token count, block table) entries, prefill entries first."""
    from engine.core.batch import Batch
    from engine.core.sequence import SamplingParams, Sequence
    params = SamplingParams(temperature=0.6, max_tokens=1, ignore_eos=True)
    seqs = []
    for i, (_, _, ntok, table) in enumerate(entries):
        s = Sequence(f"g{i}", [int(rng.integers(0, vocab))] * ntok, params)    # ids do not change the time
        s.block_table = list(table)
        seqs.append(s)
    return Batch(seqs=seqs, num_new_tokens=[e[0] for e in entries], num_prefill_seqs=num_prefill,
                 block_size=block_size, context_lens=[e[1] for e in entries])


def gpu_cycles_per_s() -> float:
    """The current device's clock as torch.cuda._sleep counts it (cycles a second), timed once with events."""
    import torch
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    torch.cuda._sleep(20_000_000)
    end.record()
    end.synchronize()
    return 20_000_000 / (start.elapsed_time(end) / 1e3)


def chain(runner, caps: list, block_size: int, vocab: int, window: int = 256, sleeps_s=None) -> np.ndarray:
    """[steps] device seconds of a replay's kept batches launched again in their order, each one ahead of the
    previous one's collection as the overlap loop runs them (no scheduler, no placeholders): windows of `window`
    batches built first, so the host keeps ahead; a window's first step (behind an idle device) and steps with block
    copies (not kept) are NaN. sleeps_s: [steps] seconds the device spins (torch.cuda._sleep: busy, no memory
    traffic) in place of a step's batch where > 0 (on CUDA only), its row NaN."""
    out = np.full(len(caps), np.nan)
    rng = np.random.default_rng(0)
    spin = sleeps_s is not None and getattr(runner, "is_cuda", False)
    hz = gpu_cycles_per_s() if spin else 0.0
    if spin:
        import torch
    for lo in range(0, len(caps), window):
        built = [(i, float(sleeps_s[i]) if spin and sleeps_s[i] > 0 else
                  rebuild(entries_of(b), b["num_prefill_seqs"], block_size, vocab, rng))
                 for i, b in enumerate(caps[lo:lo + window], lo) if b]
        prev = None
        k = 0
        for i, batch in built:
            if isinstance(batch, float):
                torch.cuda._sleep(int(batch * hz))
                continue
            cur = (i, runner.launch(batch))
            if prev is not None:
                runner.collect(prev[1])
                if k > 1:
                    out[prev[0]] = runner.last_device_time_s if runner.last_device_time_s is not None else np.nan
            prev = cur
            k += 1
        if prev is not None:
            runner.collect(prev[1])
            out[prev[0]] = runner.last_device_time_s if runner.last_device_time_s is not None else np.nan
    return out


def variants(b: dict, block_size: int) -> dict[str, tuple[list, int]]:
    """{variant: (entries, num_prefill_seqs)} of one captured batch (module docstring)."""
    entries = entries_of(b)
    P = b["num_prefill_seqs"]
    out = {"own": (entries, P)}
    if P == 0:
        cursor, contig = 0, []
        for n, c, t, tab in entries:
            nb = len(tab)
            contig.append((n, c, t, list(range(cursor, cursor + nb))))
            cursor += nb
        out["contiguous"] = (contig, 0)
        out["sorted"] = (sorted(entries, key=lambda e: -e[1]), 0)
    elif len(entries) > P:
        out["chunk_only"] = (entries[:P], P)
        out["decodes_only"] = (entries[P:], 0)
    return out


def summarize(folder: Path, profile: str) -> None:
    """Prints, against a fit's device model: by policy, its sampled decode steps' predicted over re-timed and over
    live device seconds, and the whole replay's decode steps (steps 30% or more above their price left out: first
    replays of a graph, collections); each variant over own; the mixed steps' parts, priced and measured."""
    import pandas as pd

    from sim.cost_model.calibrated import CalibratedCostModel
    cm = CalibratedCostModel.load(profile)
    dev = cm.device_model or cm
    df = pd.read_parquet(folder / "decode_gap.parquet")
    print(f"{folder} against {profile} (device model)")
    for p in df.policy.unique():
        path = next((f for f in (folder / f"gap_{p}_steps.parquet", folder / "real" / f"gap_{p}_steps.parquet")
                     if f.is_file()), None)
        if path is None:
            continue
        st = pd.read_parquet(path)
        own = df[(df.policy == p) & (df.variant == "own") & (df.num_prefill_seqs == 0)]
        pred = dev.predict_table(st.loc[own.step])
        d = st[(st.num_prefill_seqs == 0) & (st.batch_size >= 4) & (st.num_swap_blocks == 0)]
        whole = dev.predict_table(d)
        ok = d.device_time_s.to_numpy() < 1.3 * whole
        live = whole[ok].sum() / d.device_time_s.to_numpy()[ok].sum()
        print(f"  {p:14s} decode steps: priced / re-timed {pred.sum() / own.device_time_s.sum():.4f}, priced / live "
              f"{pred.sum() / own.live_device_time_s.sum():.4f} ({len(own)} sampled); whole replay priced / live "
              f"{live:.4f} ({ok.sum()} steps, {(~ok).sum()} left out)")
        mixed = df[(df.policy == p) & (df.variant == "own") & (df.num_prefill_seqs > 0)].step
        piv = df[(df.policy == p) & df.step.isin(mixed)].pivot_table(index="step", columns="variant",
                                                                      values="device_time_s")
        if piv.empty or "chunk_only" not in piv:
            continue
        rows = st.loc[piv.index]
        chunk = rows.copy()
        chunk[["num_decode_seqs", "decode_context_sum", "max_decode_context_tokens"]] = 0
        chunk["batch_size"], chunk["num_batched_tokens"] = chunk.num_prefill_seqs, chunk.num_prefill_tokens
        chunk["max_context_tokens"] = chunk.max_prefill_context_tokens
        dec = rows.copy()
        dec[["num_prefill_tokens", "num_prefill_seqs", "prefill_context_sum", "prefill_attention_pairs",
             "num_prefill_samples", "max_prefill_context_tokens"]] = 0
        dec["batch_size"] = dec["num_batched_tokens"] = dec.num_decode_seqs
        dec["max_context_tokens"] = dec.max_decode_context_tokens
        p_own, p_chunk, p_dec = dev.predict_table(rows), dev.predict_table(chunk), dev.predict_table(dec)
        inc = piv["own"] - piv["chunk_only"]
        x = np.c_[np.ones(len(rows)), rows.num_decode_seqs, rows.decode_context_sum]
        a, b, c = np.linalg.lstsq(x, inc.to_numpy(), rcond=None)[0]
        print(f"  {p:14s} mixed steps ({len(rows)}): priced / re-timed: whole {p_own.sum() / piv['own'].sum():.4f}, "
              f"chunk alone {p_chunk.sum() / piv['chunk_only'].sum():.4f}, decodes alone "
              f"{p_dec.sum() / piv['decodes_only'].sum():.4f}, what the decodes add "
              f"{(p_own - p_chunk).sum() / inc.sum():.4f}; measured, that increment = {a * 1e3:.3f} ms + "
              f"{b * 1e6:.1f} us a decode + {c:.3g} s a key")
    piv = df.pivot_table(index=["policy", "step"], columns="variant", values="device_time_s")
    for v in [c for c in piv.columns if c != "own"]:
        r = (piv[v] / piv["own"]).groupby(level=0).median().dropna()
        print(f"  {v} / own, median by policy: " + ", ".join(f"{k} {x:.4f}" for k, x in r.items()))
    chain_file = folder / "decode_gap_chain.parquet"
    if chain_file.is_file():
        ch = pd.read_parquet(chain_file)
        if "chain" not in ch:
            ch["chain"] = "full"
        for (p, name), g in ch.groupby(["policy", "chain"], sort=False):
            path = next((f for f in (folder / f"gap_{p}_steps.parquet", folder / "real" / f"gap_{p}_steps.parquet")
                         if f.is_file()), None)
            if path is None:
                continue
            st = pd.read_parquet(path)
            g = g.set_index("step")
            for kind, m in (("decode", st.num_prefill_seqs == 0), ("with prefill", st.num_prefill_seqs > 0)):
                rows = st[m & (st.batch_size >= 4) & (st.num_swap_blocks == 0)]
                rows = rows[np.isfinite(g.device_time_s.reindex(rows.index).to_numpy())]
                pred = dev.predict_table(rows)
                chained, live = g.device_time_s.loc[rows.index].to_numpy(), rows.device_time_s.to_numpy()
                ok = (live < 1.3 * pred) & (chained < 1.3 * pred)
                if not ok.any():
                    continue
                print(f"  {p:14s} chained ({name}), {kind} steps ({ok.sum()}): priced / chained "
                      f"{pred[ok].sum() / chained[ok].sum():.4f}, priced / live {pred[ok].sum() / live[ok].sum():.4f}")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--summarize", type=Path, help="a folder this script wrote (decode_gap.parquet, the replays' "
                    "gap_<policy>_steps.parquet beside it or in real/): print its figures against --profile, on CPU")
    ap.add_argument("--profile", help="with --summarize: a calibrated fit (its device model prices the steps)")
    ap.add_argument("--model")
    ap.add_argument("--out", help="output folder (decode_gap.parquet, the replays' real/ tables)")
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--policies", default="vllm,sarathi")
    ap.add_argument("--sample", type=int, default=400, help="decode steps re-timed a policy (and as many mixed)")
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--min-batch", type=int, default=4,
                    help="the smallest batch (decodes riding, in a mixed step) re-timed")
    ap.add_argument("--deadline-s", type=float, default=None, help="stop re-timing after this many seconds of the "
                    "script (what was timed is kept)")
    ap.add_argument("--one-engine", action="store_true", help="every policy on one engine, in turn (as the "
                    "generalization suite replays them); default: a freshly loaded engine a policy")
    ap.add_argument("--chain", action="store_true", help="also launch each replay's kept batches again in their order "
                    "(decode_gap_chain.parquet): the live loop's device work without its scheduler")
    ap.add_argument("--smoke", action="store_true", help="the tiny model on CPU, small workload (the path only)")
    args, workload = ap.parse_known_args(argv)
    if args.summarize:
        if not args.profile:
            ap.error("--summarize needs --profile FIT.json")
        summarize(args.summarize, args.profile)
        return 0
    if not (args.model and args.out):
        ap.error("--model and --out are required (or --summarize DIR --profile FIT.json)")
    workload = workload or (SMOKE if args.smoke else BUSY_CHUNKED)

    import pandas as pd

    from experiments import validate
    from experiments.profile import time_step
    from experiments.runner_engine import _device_sync
    out = Path(args.out)
    real = out / "real"
    cap = Capture()
    cap.install()
    policies = [p for p in args.policies.split(",") if p]
    flags = ["--model", args.model, "--device", args.device, *workload, "--no-roofline", "--no-plot",
             "--overlap-scheduling", "--real-dir", str(real), "--name", "gap"]
    kept = {}       # policy -> its replay's kept batches, in step order
    if args.one_engine:
        validate.main([*flags, "--policies", ",".join(policies), "--out-dir", str(out / "validate")])
        # the replays' launches close the capture, in policy order, after the warm-up's: split from the end
        end = len(cap.batches)
        for p in reversed(policies):
            n = len(pd.read_parquet(real / f"gap_{p}_steps.parquet"))
            kept[p], end = cap.batches[end - n:end], end - n
    else:
        for p in policies:      # a validate run each (a freshly loaded engine); its launches end with its replay's
            start = len(cap.batches)
            validate.main([*flags, "--policies", p, "--out-dir", str(out / f"validate_{p}")])
            n = len(pd.read_parquet(real / f"gap_{p}_steps.parquet"))
            kept[p] = cap.batches[start:][-n:]
    cap.active = False
    runner = cap.runners[-1]
    runner.time_device = bool(getattr(runner, "is_cuda", False))
    sync = _device_sync(runner)
    bs, vocab = runner.block_size, runner.model.config.vocab_size
    rows = []
    t_start = time.perf_counter()
    out.mkdir(parents=True, exist_ok=True)
    chained = []
    for p in policies:
        steps = pd.read_parquet(real / f"gap_{p}_steps.parquet")
        caps = kept[p]
        sizes = [len(b["ctx"]) if b else 0 for b in caps]
        if len(caps) != len(steps) or any(n and n != m for n, m in zip(sizes, steps.batch_size)):
            print(f"[{p}] {len(caps)} kept batches do not line up with its {len(steps)} step rows: skipped", flush=True)
            continue
        if args.chain:
            # full: every kept batch; decodes: the pure decode batches alone, in their order; spin: those, the steps
            # with prefill entries replaced by the device spinning for their live device seconds (busy, no memory
            # traffic: the pause without the work)
            with_prefill = np.array([bool(b) and b["num_prefill_seqs"] > 0 for b in caps])
            live = steps.get("device_time_s", pd.Series(0.0, index=steps.index)).to_numpy()
            for name in ("full", "decodes", "spin"):
                sub = caps if name != "decodes" else [b if b and b["num_prefill_seqs"] == 0 else None for b in caps]
                dev = chain(runner, sub, bs, vocab,
                            sleeps_s=np.where(with_prefill, np.nan_to_num(live), 0.0) if name == "spin" else None)
                chained.append(pd.DataFrame(dict(policy=p, chain=name, step=np.arange(len(steps)), device_time_s=dev,
                                                 live_device_time_s=steps.get("device_time_s", np.nan))))
                print(f"[{p}] {np.isfinite(dev).sum()} steps chained ({name}, {time.perf_counter() - t_start:.0f} s)",
                      flush=True)
            pd.concat(chained).to_parquet(out / "decode_gap_chain.parquet", index=False)
        idx_dec = [i for i, b in enumerate(caps)
                   if b and b["num_prefill_seqs"] == 0 and len(b["ctx"]) >= args.min_batch]
        idx_mix = [i for i, b in enumerate(caps) if b and b["num_prefill_seqs"] > 0 and len(b["ctx"]) - b[
            "num_prefill_seqs"] >= args.min_batch]
        rng = np.random.default_rng(0)
        pick = sorted(rng.choice(idx_dec, min(args.sample, len(idx_dec)), replace=False).tolist()) if idx_dec else []
        pick += sorted(rng.choice(idx_mix, min(args.sample, len(idx_mix)), replace=False).tolist()) if idx_mix else []
        for i in pick:
            if args.deadline_s is not None and time.perf_counter() - T0 > args.deadline_s:
                print(f"[{p}] deadline: stopped re-timing", flush=True)
                break
            b, st = caps[i], steps.iloc[i]
            for name, (entries, P) in variants(b, bs).items():
                batch = rebuild(entries, P, bs, vocab, np.random.default_rng(i))
                dev = time_step(runner, batch, 1, args.repeats, sync)[1]
                dec = [c for n, c, _, _ in entries[P:]]
                rows.append(dict(policy=p, step=i, variant=name, num_prefill_seqs=P,
                                 num_prefill_tokens=sum(n for n, _, _, _ in entries[:P]),
                                 prefill_context=sum(c for _, c, _, _ in entries[:P]),
                                 batch_size=len(entries), decode_context_sum=sum(dec),
                                 max_decode_context=max(dec, default=0),
                                 blocks=sum(len(e[3]) for e in entries),
                                 runs=sum(1 + int(np.count_nonzero(np.diff(e[3]) != 1)) for e in entries if e[3]),
                                 device_time_s=float(np.nanmedian(dev)),
                                 live_device_time_s=float(st["device_time_s"]) if "device_time_s" in st else np.nan,
                                 live_duration_s=float(st["duration_s"])))
        print(f"[{p}] {len(pick)} steps re-timed ({time.perf_counter() - t_start:.0f} s)", flush=True)
        pd.DataFrame(rows).to_parquet(out / "decode_gap.parquet", index=False)      # kept policy by policy
    df = pd.DataFrame(rows)
    df.to_parquet(out / "decode_gap.parquet", index=False)
    if df.empty:
        print("decode_gap: no rows")
        return 1
    own = df[df.variant == "own"]
    print("re-timed own / live device seconds, by policy and kind:")
    print(own.assign(kind=np.where(own.num_prefill_seqs > 0, "mixed", "decode")).groupby(["policy", "kind"]).apply(
        lambda g: pd.Series(dict(n=len(g), own_over_live=g.device_time_s.sum() / g.live_device_time_s.sum())))
        .round(4).to_string())
    piv = df.pivot_table(index=["policy", "step"], columns="variant", values="device_time_s")
    for v in [c for c in piv.columns if c != "own"]:
        r = (piv[v] / piv["own"]).groupby(level=0).median()
        print(f"{v} / own, median by policy:", r.round(4).to_dict())
    print(f"decode_gap: {len(df)} rows -> {out / 'decode_gap.parquet'}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
