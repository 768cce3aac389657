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
    # what GET /v1/models tells a client of the server's scheduler (model_card's "servelab" object); None: unknown
    eviction_name: str | None = None
    max_num_batched_tokens: int | None = None   # tokens a step, as the scheduler resolved it
    max_num_seqs: int | None = None
    num_cpu_blocks: int | None = None           # swap space, blocks
    cpu_cache_num_blocks: int | None = None     # the prefix cache's CPU tier, blocks

    @classmethod
    def of(cls, llm) -> "EngineInfo":
        s = llm.scheduler
        c = s.config
        return cls(str(llm.config.model_path), int(llm.runner.max_model_len), int(llm.config.block_size),
                   int(c.num_kvcache_blocks), int(llm.vocab_size), llm.eos_token_id, str(s.policy.name),
                   eviction_name=str(s.block_manager.eviction.name), max_num_batched_tokens=int(s.token_budget),
                   max_num_seqs=int(c.max_num_seqs), num_cpu_blocks=int(c.num_cpu_blocks),
                   cpu_cache_num_blocks=int(c.cpu_cache_num_blocks))

    def scheduler_facts(self) -> dict:
        """The server's scheduler as servelab's config keys name it (None where unknown)."""
        return {"scheduler": self.policy_name, "eviction": self.eviction_name, "vocab_size": self.vocab_size,
                "block_size": self.block_size, "num_kvcache_blocks": self.num_kv_blocks,
                "num_cpu_blocks": self.num_cpu_blocks, "cpu_cache_num_blocks": self.cpu_cache_num_blocks,
                "max_num_batched_tokens": self.max_num_batched_tokens, "max_num_seqs": self.max_num_seqs,
                "max_model_len": self.max_model_len}
