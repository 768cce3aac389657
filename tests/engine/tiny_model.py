"""Tiny random checkpoints (Qwen3, Qwen2, Llama) for CPU tests of the engine: experiments/tiny_checkpoint.py's
builders (also a command: python -m experiments.tiny_checkpoint DIR), under the names the tests import."""
from __future__ import annotations

from experiments.tiny_checkpoint import (  # noqa: F401
    ARCHITECTURES,
    LLAMA3_ROPE,
    TINY,
    make_tiny_checkpoint,
    make_tiny_qwen3,
    make_tiny_tokenizer,
)
