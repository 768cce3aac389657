"""What the HTTP side needs to know of the engine it serves (picklable: the engine process sends it at start)."""
from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class EngineInfo:
    model_path: str
    max_model_len: int              # tokens, prompt + output
    block_size: int                 # tokens per KV block
    num_kv_blocks: int              # GPU KV blocks
    vocab_size: int
    eos_token_id: int | None
    policy_name: str                # the scheduling policy's name

    @classmethod
    def of(cls, llm) -> "EngineInfo":
        return cls(str(llm.config.model_path), int(llm.runner.max_model_len), int(llm.config.block_size),
                   int(llm.scheduler.config.num_kvcache_blocks), int(llm.vocab_size), llm.eos_token_id,
                   str(llm.scheduler.policy.name))
