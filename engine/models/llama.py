"""Llama 2 / 3.x dense decoder (LlamaForCausalLM): the shared decoder with no q/k norm, optional
biases (config.json `attention_bias` on q/k/v/o, `mlp_bias` on the MLP) and default or Llama 3
("llama3") RoPE frequency scaling."""
from __future__ import annotations

from engine.models.decoder import DecoderConfig, DecoderForCausalLM


class LlamaConfig:
    @staticmethod
    def from_hf(hf: dict) -> DecoderConfig:
        if hf.get("pretraining_tp", 1) not in (None, 1):
            raise ValueError(f"config.json sets pretraining_tp={hf['pretraining_tp']}; only 1 is supported")
        bias = bool(hf.get("attention_bias", False))
        return DecoderConfig.from_hf(hf, "Llama", qk_norm=False, qkv_bias=bias, o_bias=bias,
                                     mlp_bias=bool(hf.get("mlp_bias", False)), rope_types=("default", "llama3"),
                                     default_max_positions=2048)


class LlamaForCausalLM(DecoderForCausalLM):
    config_class = LlamaConfig
