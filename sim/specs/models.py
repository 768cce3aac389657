"""Transformer dimensions of the models the simulator prices (dense decoder-only, GQA).

Numbers are copied from each model's published Hugging Face `config.json`
(https://huggingface.co/<repo>/blob/main/config.json, the repo named in
`source`): num_hidden_layers, hidden_size, num_attention_heads,
num_key_value_heads, head_dim, intermediate_size, vocab_size,
tie_word_embeddings, torch_dtype and max_position_embeddings. Derived sizes
(parameter count, weight bytes, KV bytes per token) are computed, never typed in;
tests check the parameter counts against the sizes the model cards publish.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping

from engine.core.kv_layout import kv_block_bytes

_DTYPE_BYTES = {"bfloat16": 2, "float16": 2, "half": 2, "float32": 4, "float": 4, "fp8": 1, "float8_e4m3fn": 1}


@dataclass(frozen=True, slots=True)
class ModelSpec:
    name: str
    num_layers: int
    hidden_size: int
    num_q_heads: int
    num_kv_heads: int
    head_dim: int
    intermediate_size: int          # SwiGLU MLP width (gate, up: hidden -> inter; down: inter -> hidden)
    vocab_size: int
    tie_word_embeddings: bool       # LM head shares the embedding matrix (counted once in params)
    dtype_bytes: int = 2            # weights and KV cache (bf16)
    max_model_len: int = 4096       # longest sequence (prompt + output) the model accepts
    qk_norm: bool = False           # Qwen3: RMSNorm on q and k per head (head_dim params each)
    attention_bias: bool = False    # Qwen2: bias on q, k, v projections
    source: str = ""

    def __post_init__(self):
        for f in ("num_layers", "hidden_size", "num_q_heads", "num_kv_heads", "head_dim",
                  "intermediate_size", "vocab_size", "dtype_bytes", "max_model_len"):
            v = getattr(self, f)
            if not isinstance(v, int) or isinstance(v, bool) or v <= 0:
                raise ValueError(f"ModelSpec {self.name!r}: {f} must be a positive int, got {v!r}")
        if self.num_q_heads % self.num_kv_heads:
            raise ValueError(f"ModelSpec {self.name!r}: num_q_heads ({self.num_q_heads}) must be a multiple of "
                             f"num_kv_heads ({self.num_kv_heads}) for grouped-query attention")

    # -- derived sizes --------------------------------------------------------------
    @property
    def q_size(self) -> int:
        return self.num_q_heads * self.head_dim

    @property
    def kv_size(self) -> int:
        return self.num_kv_heads * self.head_dim

    @property
    def linear_params_per_layer(self) -> int:
        """Matmul weights of one decoder layer: q, k, v, o projections and the SwiGLU MLP."""
        h = self.hidden_size
        attn = h * self.q_size + 2 * h * self.kv_size + self.q_size * h
        mlp = 3 * h * self.intermediate_size
        return attn + mlp

    @property
    def num_linear_params(self) -> int:
        """Matmul weights of all decoder layers (excludes embedding and LM head): 2 FLOPs each per token."""
        return self.num_layers * self.linear_params_per_layer

    @property
    def lm_head_params(self) -> int:
        return self.vocab_size * self.hidden_size

    @property
    def num_params(self) -> int:
        """All parameters, as a checkpoint counts them (tied embeddings once)."""
        h = self.hidden_size
        per_layer = self.linear_params_per_layer + 2 * h                 # + input and post-attention RMSNorm
        if self.qk_norm:
            per_layer += 2 * self.head_dim
        if self.attention_bias:
            per_layer += self.q_size + 2 * self.kv_size
        embed = self.vocab_size * h
        lm_head = 0 if self.tie_word_embeddings else self.lm_head_params
        return self.num_layers * per_layer + embed + lm_head + h          # + final norm

    @property
    def weight_bytes(self) -> int:
        return self.num_params * self.dtype_bytes

    @property
    def kv_bytes_per_token(self) -> int:
        """K and V of one token across all layers, all KV heads (engine.core.kv_layout.kv_block_bytes)."""
        return kv_block_bytes(1, self.num_layers, self.num_kv_heads, self.head_dim, self.dtype_bytes)

    # -- construction from a user's config.json --------------------------------------
    @classmethod
    def from_hf_config(cls, config: Mapping[str, Any], name: str | None = None,
                       max_model_len: int | None = None) -> "ModelSpec":
        """Build a spec from a Hugging Face config dict (the parsed `config.json`)."""
        cfg = dict(config)
        if "text_config" in cfg and "hidden_size" not in cfg:      # multimodal wrappers nest the LM config
            cfg = dict(cfg["text_config"])
        required = ("num_hidden_layers", "hidden_size", "num_attention_heads", "intermediate_size", "vocab_size")
        missing = [k for k in required if k not in cfg]
        if missing:
            raise ValueError(f"HF config lacks {missing}; a dense decoder config needs all of {list(required)}")
        dtype = str(cfg.get("torch_dtype") or cfg.get("dtype") or "bfloat16").replace("torch.", "")
        if dtype not in _DTYPE_BYTES:
            raise ValueError(f"HF config torch_dtype {dtype!r} is not one of {sorted(_DTYPE_BYTES)}")
        heads = int(cfg["num_attention_heads"])
        model_type = cfg.get("model_type", "")
        if name is None:
            name = cfg.get("_name_or_path") or (cfg.get("architectures") or [model_type or "hf-model"])[0]
        return cls(
            name=str(name),
            num_layers=int(cfg["num_hidden_layers"]),
            hidden_size=int(cfg["hidden_size"]),
            num_q_heads=heads,
            num_kv_heads=int(cfg.get("num_key_value_heads") or heads),
            head_dim=int(cfg.get("head_dim") or cfg["hidden_size"] // heads),
            intermediate_size=int(cfg["intermediate_size"]),
            vocab_size=int(cfg["vocab_size"]),
            tie_word_embeddings=bool(cfg.get("tie_word_embeddings", False)),
            dtype_bytes=_DTYPE_BYTES[dtype],
            max_model_len=int(max_model_len or cfg.get("max_position_embeddings") or 4096),
            qk_norm=model_type == "qwen3",
            attention_bias=bool(cfg.get("attention_bias", model_type == "qwen2")),
            source="config.json",
        )

    # Dimensions that decide a model's cost and KV footprint (what a checkpoint must agree on).
    SHAPE_FIELDS = ("num_layers", "hidden_size", "num_q_heads", "num_kv_heads", "head_dim", "intermediate_size",
                    "vocab_size")

    def shape_mismatches(self, other: "ModelSpec") -> list[str]:
        """'field: self vs other' for every SHAPE_FIELDS dimension the two specs disagree on."""
        return [f"{f}: {getattr(self, f)} vs {getattr(other, f)}" for f in self.SHAPE_FIELDS
                if getattr(self, f) != getattr(other, f)]


def _qwen3(size: str, layers: int, hidden: int, q_heads: int, inter: int, tied: bool) -> ModelSpec:
    # All Qwen3 dense models: 8 KV heads, head_dim 128, vocab 151936, bf16, 40960 positions, q/k norm.
    return ModelSpec(name=f"Qwen3-{size}", num_layers=layers, hidden_size=hidden, num_q_heads=q_heads,
                     num_kv_heads=8, head_dim=128, intermediate_size=inter, vocab_size=151936,
                     tie_word_embeddings=tied, dtype_bytes=2, max_model_len=40960, qk_norm=True,
                     source=f"huggingface.co/Qwen/Qwen3-{size}/blob/main/config.json")


def _llama31(size: str, layers: int, hidden: int, q_heads: int, inter: int) -> ModelSpec:
    # Llama 3.1: 8 KV heads, head_dim 128, vocab 128256, bf16, 131072 positions, untied LM head.
    return ModelSpec(name=f"Llama-3.1-{size}", num_layers=layers, hidden_size=hidden, num_q_heads=q_heads,
                     num_kv_heads=8, head_dim=128, intermediate_size=inter, vocab_size=128256,
                     tie_word_embeddings=False, dtype_bytes=2, max_model_len=131072,
                     source=f"huggingface.co/meta-llama/Llama-3.1-{size}/blob/main/config.json")


MODEL_SPECS: dict[str, ModelSpec] = {s.name: s for s in (
    #      size    layers hidden heads  inter  tied        published size
    _qwen3("0.6B", 28, 1024, 16, 3072, True),             # 0.6B (0.44B non-embedding)
    _qwen3("1.7B", 28, 2048, 16, 6144, True),             # 1.7B
    _qwen3("4B", 36, 2560, 32, 9728, True),               # 4.0B
    _qwen3("8B", 36, 4096, 32, 12288, False),             # 8.2B
    _qwen3("14B", 40, 5120, 40, 17408, False),            # 14.8B
    _qwen3("32B", 64, 5120, 64, 25600, False),            # 32.8B
    _llama31("8B", 32, 4096, 32, 14336),                  # 8.03B
    _llama31("70B", 80, 8192, 64, 28672),                 # 70.6B
)}


def _key(name: str) -> str:
    # "Qwen/Qwen3-0.6B", "qwen3-0.6b" and the conf-file style "qwen3_0p6b" all map to "qwen3_0p6b".
    return name.rsplit("/", 1)[-1].lower().replace(".", "p").replace("-", "_")


_ALIASES = {_key(n): n for n in MODEL_SPECS}
_ALIASES.update({"llama3_8b": "Llama-3.1-8B", "llama3_70b": "Llama-3.1-70B",
                 "llama_3_8b": "Llama-3.1-8B", "llama_3_70b": "Llama-3.1-70B"})


def get_model_spec(name: str) -> ModelSpec:
    """Spec by name (case-insensitive; `Qwen/Qwen3-8B`, `qwen3_8b` and `Qwen3-8B` all work)."""
    full = _ALIASES.get(_key(str(name)))
    if full is None:
        raise ValueError(f"unknown model {name!r}; known models: {sorted(MODEL_SPECS)} "
                         f"(or build one from a config.json with ModelSpec.from_hf_config)")
    return MODEL_SPECS[full]
