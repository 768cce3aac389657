"""Qwen2 / Qwen2.5 dense decoder (Qwen2ForCausalLM): the shared decoder with biases on the q, k and v
projections (not on o_proj or the MLP) and no q/k norm."""
from __future__ import annotations

from engine.models.decoder import DecoderConfig, DecoderForCausalLM


class Qwen2Config:
    @staticmethod
    def from_hf(hf: dict) -> DecoderConfig:
        return DecoderConfig.from_hf(hf, "Qwen2", qk_norm=False, qkv_bias=True, o_bias=False, mlp_bias=False,
                                     default_max_positions=32768)


class Qwen2ForCausalLM(DecoderForCausalLM):
    config_class = Qwen2Config
