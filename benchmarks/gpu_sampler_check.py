"""Check and time the sampler's Triton kernel on a CUDA GPU; writes one JSON file.

    python benchmarks/gpu_sampler_check.py --out benchmarks/results/gpu_sampler_check_h200.json

Check: engine/kernels/sample.py's race_sample against the torch expression it implements
(engine/layers/sampler.py race_sample_reference) on bf16 logits of Qwen3's vocabulary (151,936),
rows mixing greedy and temperature sampling, same noise: tokens must agree (a row may differ only if
its top two scores are within float32 rounding, reported as near_ties).

Timing (CUDA events, median): per step of B rows, the kernel against the previous sampler
(bf16 -> f32 cast, torch.compile'd softmax exponential race, greedy argmax), both without the
noise draw, and the noise draw (exponential_) itself.
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import torch  # noqa: E402
from gpu_attention_check import cuda_time_ms  # noqa: E402

VOCAB = 151_936


def softmax_race(logits, temps, noise):
    """The sampler before the kernel: softmax, divide by noise, argmax; greedy rows argmax the logits."""
    logits = logits.float()
    greedy = temps == 0
    probs = (logits / torch.where(greedy, 1.0, temps)[:, None]).softmax(dim=-1)
    sampled = (probs / noise.clamp_min(1e-10)).argmax(dim=-1)
    return torch.where(greedy, logits.argmax(dim=-1), sampled)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", type=Path, default=Path("benchmarks/results/gpu_sampler_check.json"))
    ap.add_argument("--iters", type=int, default=50)
    args = ap.parse_args(argv)
    from engine.kernels.sample import race_sample
    from engine.layers.sampler import race_sample_reference

    dev = torch.device("cuda")
    gen = torch.Generator(dev).manual_seed(0)
    report = {"command": "python benchmarks/gpu_sampler_check.py " + " ".join(argv or sys.argv[1:]),
              "device": torch.cuda.get_device_name(), "torch": torch.__version__, "checks": [], "timing": []}
    ok = True
    for rows in (1, 7, 256):
        logits = (torch.randn(rows, VOCAB, device=dev, generator=gen) * 4).to(torch.bfloat16)
        noise = torch.empty(rows, VOCAB, device=dev).exponential_(generator=gen)
        temps = torch.where(torch.arange(rows, device=dev) % 3 == 0, 0.0, 0.6)
        got, want = race_sample(logits, temps, noise), race_sample_reference(logits, temps, noise)
        differ = (got != want).nonzero().flatten().tolist()
        scores = logits.float() / torch.where(temps == 0, 1.0, temps)[:, None] - torch.where(
            temps[:, None] == 0, 0.0, noise.clamp_min(1e-10).log())
        top2 = scores.topk(2, dim=-1).values
        near = [r for r in differ if (top2[r, 0] - top2[r, 1]).abs() <= 1e-5 * top2[r, 0].abs()]
        check = dict(rows=rows, mismatched_rows=len(differ), near_ties=len(near), ok=len(differ) == len(near))
        ok &= check["ok"]
        report["checks"].append(check)
        print(check, flush=True)
    compiled = torch.compile(softmax_race, dynamic=True)
    for rows in (1, 64, 256):
        logits = (torch.randn(rows, VOCAB, device=dev, generator=gen) * 4).to(torch.bfloat16)
        noise = torch.empty(rows, VOCAB, device=dev).exponential_(generator=gen)
        temps = torch.full((rows,), 0.6, device=dev)
        kernel_ms = cuda_time_ms(lambda: race_sample(logits, temps, noise), 5, args.iters)
        before_ms = cuda_time_ms(lambda: compiled(logits, temps, noise), 5, args.iters)
        noise_ms = cuda_time_ms(lambda: noise.exponential_(generator=gen), 5, args.iters)
        t = dict(rows=rows, kernel_ms=kernel_ms, softmax_race_compiled_ms=before_ms, noise_draw_ms=noise_ms,
                 speedup=before_ms / kernel_ms,
                 kernel_gbps=rows * VOCAB * (2 + 4) / kernel_ms / 1e6)
        report["timing"].append(t)
        print(t, flush=True)
    report["ok"] = ok
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(report, indent=2) + "\n")
    print(f"wrote {args.out}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
