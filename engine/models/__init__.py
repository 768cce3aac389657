"""Model architectures, looked up by the `architectures` field of a checkpoint's config.json."""
from __future__ import annotations

from engine.hf_config import load_hf_config
from engine.models.qwen3 import Qwen3ForCausalLM

MODEL_REGISTRY = {
    "Qwen3ForCausalLM": Qwen3ForCausalLM,
}


def get_model_class(hf_config: dict):
    """The model class for config.json's `architectures`; ValueError listing the supported ones."""
    archs = hf_config.get("architectures") or []
    for arch in archs:
        if arch in MODEL_REGISTRY:
            return MODEL_REGISTRY[arch]
    raise ValueError(f"unsupported architecture {archs or '(config.json has no architectures field)'}; "
                     f"supported: {', '.join(sorted(MODEL_REGISTRY))}")


__all__ = ["MODEL_REGISTRY", "get_model_class", "load_hf_config", "Qwen3ForCausalLM"]
