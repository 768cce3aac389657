"""The per-step token budget (max_num_batched_tokens) when none is given, and why it is that.

One rule for every entry point (Hydra config, SchedulerConfig, EngineConfig,
experiments.validate): max_num_batched_tokens = None means derived from
max_model_len and the step shape.

- chunked prefill off: max(max_model_len, 8192). A prompt is prefilled in one
  step, so the budget must hold the longest prompt max_model_len allows (vLLM
  sets max(max_model_len, 2048) in this mode); the floor 8192 batches several
  short prompts per prefill step.
- chunked prefill on: 8192, vLLM V1's default for its API server on
  H100/H200-class GPUs; longer prompts are split into chunks across steps.

Torch-free.
"""
from __future__ import annotations

DEFAULT_MAX_NUM_BATCHED_TOKENS = 8192


def resolve_max_num_batched_tokens(given: int | None, max_model_len: int, chunked_prefill: bool) -> tuple[int, str]:
    """(tokens per step, why): `given` when not None, else the rule in the module docstring."""
    if given is not None:
        return int(given), "given"
    if chunked_prefill:
        return DEFAULT_MAX_NUM_BATCHED_TOKENS, (f"derived: {DEFAULT_MAX_NUM_BATCHED_TOKENS} with chunked prefill on "
                                                "(longer prompts are split across steps)")
    value = max(int(max_model_len), DEFAULT_MAX_NUM_BATCHED_TOKENS)
    return value, (f"derived: max(max_model_len={max_model_len}, {DEFAULT_MAX_NUM_BATCHED_TOKENS}) with chunked "
                   "prefill off, so the longest allowed prompt fits one prefill step")
