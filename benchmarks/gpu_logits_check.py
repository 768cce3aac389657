"""Engine logits against transformers on the same random weights, teacher-forced.

A batch of sequences (prompt + a given continuation) runs through the engine: a paged
prefill of the prompt, then one decode step per continuation token, where the token fed
back is the *given* one rather than the sampled one (teacher forcing), so both models see
identical inputs at every position. transformers computes the logits of the whole
sequences in one forward pass. Reported per run: the relative error
||engine - hf|| / ||hf|| of each position's logits (max and median over positions and
sequences) and how often the two argmax tokens agree.

    python benchmarks/gpu_logits_check.py --out benchmarks/results/logits_check_h200.json        # H200, bf16
    python benchmarks/gpu_logits_check.py --preset tiny --device cpu --dtype float32 --decode-steps 20  # smoke run
"""
from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

from engine_throughput import QWEN3_0P6B, TINY, emit, environment, make_checkpoint  # noqa: E402


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--preset", choices=["qwen3-0.6b", "tiny"], default="qwen3-0.6b")
    p.add_argument("--device", default="cuda")
    p.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float16", "float32"])
    p.add_argument("--attention-backend", default="auto")
    p.add_argument("--num-seqs", type=int, default=4)
    p.add_argument("--prompt-len", type=int, default=300, help="prompt tokens of the first sequence (others vary)")
    p.add_argument("--decode-steps", type=int, default=300)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--enforce-eager", action="store_true")
    p.add_argument("--out", type=Path, default=None)
    return p.parse_args(argv)


def main(argv=None):
    args = parse_args(argv)
    import numpy as np
    import torch
    from transformers import AutoModelForCausalLM

    from engine.core.sequence import SamplingParams, Sequence
    from engine.llm import LLM

    vocab = (QWEN3_0P6B if args.preset == "qwen3-0.6b" else TINY)["vocab_size"]
    rng = np.random.default_rng(args.seed)
    lens = [max(2, args.prompt_len - 37 * i) for i in range(args.num_seqs)]          # ragged prompts
    seqs_ids = [rng.integers(0, min(vocab, 10000), n + args.decode_steps).tolist() for n in lens]
    dtype = getattr(torch, args.dtype)
    with tempfile.TemporaryDirectory() as tmp:
        make_checkpoint(args.preset, Path(tmp), args.device, dtype)
        hf = AutoModelForCausalLM.from_pretrained(tmp, dtype=dtype).to(args.device).eval()
        with torch.no_grad():
            ref = [hf(torch.tensor([ids], device=args.device)).logits[0].float().cpu() for ids in seqs_ids]
        del hf
        max_len = max(lens) + args.decode_steps + 8
        llm = LLM(tmp, device=args.device, dtype=args.dtype, attention_backend=args.attention_backend,
                  max_model_len=max_len, max_num_batched_tokens=max(4096, max_len), enforce_eager=args.enforce_eager)
        sched, runner = llm.scheduler, llm.runner
        captured = []
        sample = runner.sampler.__call__

        def capture(logits, params):                       # logits [S, V] of the sampling rows, in order
            captured.append(logits.float().cpu())
            return sample(logits, params)
        runner.sampler = capture
        seqs = [Sequence(i, ids[:n], SamplingParams(temperature=0.0, max_tokens=args.decode_steps, ignore_eos=True))
                for i, (ids, n) in enumerate(zip(seqs_ids, lens))]
        for s in seqs:
            sched.add(s)
        got = {s.request_id: [] for s in seqs}             # logits predicting token at position p+1
        t = 0.0
        while sched.has_unfinished():
            batch = sched.schedule(t)
            captured.clear()
            runner.execute(batch)
            rows = [i for i in range(batch.num_seqs) if batch.samples(i)]
            logits = captured[0] if captured else None
            forced = [None] * batch.num_seqs
            for r, i in enumerate(rows):
                seq = batch.seqs[i]
                got[seq.request_id].append(logits[r])
                forced[i] = seqs_ids[seq.request_id][len(seq.token_ids)]   # teacher forcing
            sched.postprocess(batch, forced, t)
            t += 1.0
    errs, agree, total = [], 0, 0
    for s in seqs:
        n = lens[s.request_id]
        eng = torch.stack(got[s.request_id])                # positions n-1 .. n+decode_steps-2
        hf_rows = ref[s.request_id][n - 1: n - 1 + len(eng)]
        errs.extend(((eng - hf_rows).norm(dim=-1) / hf_rows.norm(dim=-1)).tolist())
        agree += int((eng.argmax(-1) == hf_rows.argmax(-1)).sum())
        total += len(eng)
    errs_np = np.array(errs)
    result = dict(preset=args.preset, dtype=args.dtype, attention_backend=runner.attn_backend.name,
                  cuda_graphs=bool(runner.graphs), num_seqs=args.num_seqs, prompt_lens=lens,
                  decode_steps=args.decode_steps, positions_compared=total,
                  max_rel_error=float(errs_np.max()), median_rel_error=float(np.median(errs_np)),
                  p99_rel_error=float(np.quantile(errs_np, 0.99)), argmax_agreement=agree / total)
    result.update(environment(args.device))
    emit(result, args.out)


if __name__ == "__main__":
    main()
