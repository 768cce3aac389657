"""Qwen3 dense decoder (Qwen3ForCausalLM): the shared decoder (engine/models/decoder.py) with per-head
RMSNorm on q and k, no projection biases (unless config.json sets attention_bias)."""
from __future__ import annotations

from engine.models.decoder import DecoderConfig, DecoderForCausalLM


class Qwen3Config:
    @staticmethod
    def from_hf(hf: dict) -> DecoderConfig:
        bias = bool(hf.get("attention_bias", False))
        return DecoderConfig.from_hf(hf, "Qwen3", qk_norm=True, qkv_bias=bias, o_bias=bias, mlp_bias=False,
                                     default_max_positions=32768)


class Qwen3ForCausalLM(DecoderForCausalLM):
    config_class = Qwen3Config
