"""Model architectures, looked up by the `architectures` field of a checkpoint's config.json.

The registry maps each architecture name to "module:Class" and imports the module only when a
checkpoint asks for it, so importing `engine.models` pulls in no model code (and no import cycle
through the layers). Adding an architecture: one file under engine/models/ (usually a config
mapping onto engine/models/decoder.py's shared blocks) plus one line here.
"""
from __future__ import annotations

import importlib

from engine.hf_config import load_hf_config

MODEL_REGISTRY = {
    "Qwen3ForCausalLM": "engine.models.qwen3:Qwen3ForCausalLM",
    "Qwen2ForCausalLM": "engine.models.qwen2:Qwen2ForCausalLM",
    "LlamaForCausalLM": "engine.models.llama:LlamaForCausalLM",
}


def get_model_class(hf_config: dict):
    """The model class for config.json's `architectures`; ValueError listing the supported ones."""
    archs = hf_config.get("architectures") or []
    for arch in archs:
        if arch in MODEL_REGISTRY:
            module, name = MODEL_REGISTRY[arch].split(":")
            return getattr(importlib.import_module(module), name)
    raise ValueError(f"unsupported architecture {archs or '(config.json has no architectures field)'}; "
                     f"supported: {', '.join(sorted(MODEL_REGISTRY))}")


__all__ = ["MODEL_REGISTRY", "get_model_class", "load_hf_config"]
