"""Token sampler: greedy, temperature, top-k, top-p, and per-request seeds, batched over sequences.

Sampling uses the exponential-race form of the Gumbel-max trick: argmax(p_i / E_i) with E_i ~ Exp(1)
draws index i with probability p_i, and needs no cumulative sum or host sync. Without top-k/top-p
it is argmax(l_i / T - log E_i) on the raw logits (the softmax normaliser drops out): one Triton
pass over the logits on CUDA (engine/kernels/sample.py), the same expression in torch elsewhere.
Unseeded rows share one batched noise draw from the sampler's generator; a seeded row draws its
noise from its own torch.Generator, so its tokens depend only on its seed and never on which other
requests share the batch.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

NOISE_FLOOR = 1e-10         # Exp(1) draws are clamped here (also in the kernel) so log() stays finite


@dataclass
class SamplingTensors:
    """Per-row sampling parameters of one step, on the logits' device. S = rows being sampled."""
    temperatures: Tensor               # [S] float32; 0 = greedy
    top_ks: Tensor | None              # [S] int64, 0 = off; None when no row uses top-k
    top_ps: Tensor | None              # [S] float32, 1 = off; None when no row uses top-p
    generators: list[torch.Generator | None]   # per row: the request's own generator, or None
    all_greedy: bool


def apply_top_k_top_p(logits: Tensor, top_ks: Tensor | None, top_ps: Tensor | None) -> Tensor:
    """Sets logits outside each row's top-k / top-p nucleus to -inf. logits [S, V] float32 -> [S, V].

    top-p keeps the smallest set of highest-probability tokens whose mass reaches top_p (the most
    likely token is always kept); ties at the boundary are resolved by sort order.
    """
    if top_ks is None and top_ps is None:
        return logits
    sorted_logits, order = logits.sort(dim=-1, descending=True)           # [S, V]
    V = logits.shape[-1]
    remove = torch.zeros_like(sorted_logits, dtype=torch.bool)
    if top_ks is not None:
        k = torch.where(top_ks > 0, top_ks.clamp(max=V), V)                 # [S]; 0 = keep all
        ranks = torch.arange(V, device=logits.device)
        remove |= ranks[None, :] >= k[:, None]
    if top_ps is not None:
        probs = sorted_logits.masked_fill(remove, float("-inf")).softmax(dim=-1)
        mass_before = probs.cumsum(dim=-1) - probs                           # mass of strictly better tokens
        remove |= mass_before >= top_ps[:, None]
    sorted_logits = sorted_logits.masked_fill(remove, float("-inf"))
    return torch.empty_like(logits).scatter_(-1, order, sorted_logits)


class Sampler:
    """logits [S, V] + SamplingTensors -> token ids [S] int64."""

    def __init__(self, generator: torch.Generator | None = None):
        self.generator = generator      # for unseeded rows; None = torch's default generator

    def __call__(self, logits: Tensor, params: SamplingTensors) -> Tensor:
        if params.all_greedy:
            return logits.argmax(dim=-1)        # bf16 -> f32 is exact: no cast needed for the argmax
        temps = params.temperatures
        if params.top_ks is None and params.top_ps is None:
            return _race_sample(logits, temps, self._noise(logits, params))
        logits = logits.float()
        is_greedy = temps == 0
        scaled = logits / torch.where(is_greedy, 1.0, temps)[:, None]
        scaled = apply_top_k_top_p(scaled, params.top_ks, params.top_ps)
        probs = scaled.softmax(dim=-1)
        sampled = (probs / self._noise(logits, params).clamp_min_(NOISE_FLOOR)).argmax(dim=-1)
        return torch.where(is_greedy, logits.argmax(dim=-1), sampled)

    def _noise(self, logits: Tensor, params: SamplingTensors) -> Tensor:
        """[S, V] float32 Exp(1) draws: the sampler's generator, then each seeded row's own."""
        noise = torch.empty(logits.shape, dtype=torch.float32, device=logits.device)
        noise.exponential_(1.0, generator=self.generator)
        for row, gen in enumerate(params.generators):
            if gen is not None:
                noise[row].exponential_(1.0, generator=gen)
        return noise


def race_sample_reference(logits: Tensor, temperatures: Tensor, noise: Tensor) -> Tensor:
    """argmax(logits / T - log noise) per row, argmax(logits) where T == 0: [S, V], [S], [S, V] -> [S] int64."""
    logits = logits.float()
    sampled = temperatures != 0
    scores = logits / torch.where(sampled, temperatures, 1.0)[:, None] - noise.clamp_min(NOISE_FLOOR).log()
    return torch.where(sampled, scores.argmax(dim=-1), logits.argmax(dim=-1))


def _race_sample(logits: Tensor, temps: Tensor, noise: Tensor) -> Tensor:
    if logits.is_cuda:
        from engine.kernels.sample import race_sample  # triton: imported only where it runs
        return race_sample(logits, temps, noise)
    return race_sample_reference(logits, temps, noise)
