"""The dense pre-norm decoder that Qwen3, Qwen2 and Llama share, over a paged KV cache.

Per layer: RMSNorm -> attention (packed qkv, optional per-head RMSNorm on q and k, RoPE, GQA,
paged attention backend) -> residual -> RMSNorm -> SwiGLU MLP (packed gate/up) -> residual.
An architecture file (qwen3.py, llama.py, ...) only maps its config.json onto `DecoderConfig`;
the checkpoint tensor names (`model.layers.N.self_attn.q_proj.weight`, ...) are the same for all.
Shapes: T = tokens this step (flat, all sequences), H = hidden_size, Hq/Hkv = query/KV heads,
D = head_dim, I = intermediate_size, V = vocab_size.

Tensor parallel (tp_size > 1, rank tp_rank): every rank holds Hq/tp query heads, its share of the
KV heads (engine/layers/linear.py), I/tp of the MLP and V/tp rows of the embedding and head; the
shapes above then hold per rank (Hq, Hkv, I local). The residual stream [T, H] is the same on all
ranks: o_proj and down_proj all-reduce their partial sums, and the embedding all-reduces its rows.

fused_qk_norm_rope_store (EngineConfig's switch of that name): with a backend that has `attend`
(triton; flash_attn, whose paged paths read the cache too), one kernel (engine/kernels/qk_norm_rope_store.py)
takes the qkv projection to q and the stored k, v, in place of the q/k norm, RoPE and KV-store kernels; the
torch backend ignores it.
"""
from __future__ import annotations

from dataclasses import dataclass

from torch import Tensor, nn

from engine.layers import fused
from engine.layers.activation import SiluAndMul
from engine.layers.attention_metadata import AttentionMetadata
from engine.layers.embed_head import ParallelLMHead, VocabParallelEmbedding
from engine.layers.linear import MergedColumnParallelLinear, QKVParallelLinear, RowParallelLinear
from engine.layers.norm import RMSNorm
from engine.layers.rotary import RopeScaling, RotaryEmbedding

REQUIRED_FIELDS = ("hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads", "vocab_size")


@dataclass(frozen=True)
class DecoderConfig:
    hidden_size: int
    intermediate_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    rms_norm_eps: float
    rope_theta: float
    vocab_size: int
    tie_word_embeddings: bool
    max_position_embeddings: int
    qkv_bias: bool = False              # bias on q/k/v projections (Qwen2; Llama's attention_bias)
    o_bias: bool = False                # bias on o_proj (Llama's attention_bias)
    mlp_bias: bool = False              # bias on gate/up/down (Llama's mlp_bias)
    qk_norm: bool = False               # per-head RMSNorm on q and k before RoPE (Qwen3)
    rope_scaling: RopeScaling | None = None

    @classmethod
    def from_hf(cls, hf: dict, family: str, *, qk_norm: bool, qkv_bias: bool, o_bias: bool, mlp_bias: bool,
                rope_types: tuple[str, ...] = ("default",), default_max_positions: int = 32768) -> "DecoderConfig":
        """Reads a transformers config.json dict (old `rope_theta` / `rope_scaling` or newer `rope_parameters`).

        family names the architecture in messages; rope_types lists the RoPE variants it accepts.
        """
        missing = [k for k in REQUIRED_FIELDS if k not in hf]
        if missing:
            raise ValueError(f"config.json lacks {missing}; a {family} config needs {list(REQUIRED_FIELDS)}")
        rope = hf.get("rope_parameters") or hf.get("rope_scaling") or {}
        rope_type = rope.get("rope_type", rope.get("type", "default"))
        if rope_type not in rope_types:
            raise ValueError(f"rope type {rope_type!r} is not supported for {family} (supported: {list(rope_types)}); "
                             f"remove rope scaling from config.json or use a model without it")
        if hf.get("use_sliding_window", False):
            raise ValueError("config.json sets use_sliding_window=true; sliding-window attention is not supported")
        theta = rope.get("rope_theta", hf.get("rope_theta", 10000.0))
        heads = hf["num_attention_heads"]
        max_positions = hf.get("max_position_embeddings", default_max_positions)
        return cls(
            hidden_size=hf["hidden_size"],
            intermediate_size=hf["intermediate_size"],
            num_hidden_layers=hf["num_hidden_layers"],
            num_attention_heads=heads,
            num_key_value_heads=hf.get("num_key_value_heads") or heads,
            head_dim=hf.get("head_dim") or hf["hidden_size"] // heads,
            rms_norm_eps=hf.get("rms_norm_eps", 1e-6),
            rope_theta=float(theta),
            vocab_size=hf["vocab_size"],
            tie_word_embeddings=bool(hf.get("tie_word_embeddings", False)),
            max_position_embeddings=max_positions,
            qkv_bias=qkv_bias, o_bias=o_bias, mlp_bias=mlp_bias, qk_norm=qk_norm,
            rope_scaling=RopeScaling.from_hf(rope, max_positions) if rope_type != "default" else None,
        )


class DecoderAttention(nn.Module):
    def __init__(self, cfg: DecoderConfig, attn_backend, rotary: RotaryEmbedding, tp_rank: int = 0, tp_size: int = 1,
                 fused_qk_norm_rope_store: bool = False):
        super().__init__()
        if cfg.num_attention_heads % cfg.num_key_value_heads:
            raise ValueError(f"num_attention_heads ({cfg.num_attention_heads}) must be a multiple of "
                             f"num_key_value_heads ({cfg.num_key_value_heads})")
        self.head_dim = cfg.head_dim
        self.qkv_proj = QKVParallelLinear(cfg.hidden_size, cfg.head_dim, cfg.num_attention_heads,
                                          cfg.num_key_value_heads, cfg.qkv_bias, tp_rank, tp_size)
        self.num_heads, self.num_kv_heads = self.qkv_proj.num_heads, self.qkv_proj.num_kv_heads   # this rank's
        self.o_proj = RowParallelLinear(cfg.num_attention_heads * cfg.head_dim, cfg.hidden_size, cfg.o_bias,
                                        tp_rank, tp_size)
        if cfg.qk_norm:
            self.q_norm = RMSNorm(self.head_dim, cfg.rms_norm_eps)
            self.k_norm = RMSNorm(self.head_dim, cfg.rms_norm_eps)
        self.qk_norm = cfg.qk_norm
        self.rotary = rotary            # shared by all layers: one cos/sin table
        self.backend = attn_backend
        self.scale = self.head_dim ** -0.5
        self.fused_store = None
        if fused_qk_norm_rope_store and getattr(attn_backend, "attend", None) is not None:
            from engine.kernels.qk_norm_rope_store import qk_norm_rope_store  # imports triton: only when used
            self.fused_store = qk_norm_rope_store

    def forward(self, positions: Tensor, x: Tensor, meta: AttentionMetadata, kv_cache: tuple[Tensor, Tensor]) -> Tensor:
        T = x.shape[0]
        Hq, Hkv, D = self.num_heads, self.num_kv_heads, self.head_dim
        qkv = self.qkv_proj(x)                                                    # [T, (Hq + 2 Hkv) * D]
        if self.fused_store is not None:
            norm = (self.q_norm.weight, self.k_norm.weight, self.q_norm.eps) if self.qk_norm else (None, None, 0.0)
            q = self.fused_store(qkv, Hq, Hkv, positions, self.rotary.cos_sin, kv_cache[0], kv_cache[1],   # [T, Hq, D]
                                 meta.slot_mapping, *norm)
            return self.o_proj(self.backend.attend(q, kv_cache[0], kv_cache[1], meta, self.scale).reshape(T, -1))
        if self.qk_norm:
            qk = fused.qk_norm_rope(qkv[:, :(Hq + Hkv) * D].view(T, Hq + Hkv, D), Hq,   # [T, Hq + Hkv, D]
                                    self.q_norm.weight, self.k_norm.weight, self.q_norm.eps,
                                    self.rotary.cos_sin, positions)
            q, k = qk[:, :Hq], qk[:, Hq:]                                          # [T, Hq, D], [T, Hkv, D]
        else:
            q, k = self.rotary(positions, qkv[:, :Hq * D].view(T, Hq, D), qkv[:, Hq * D:(Hq + Hkv) * D].view(T, Hkv, D))
        v = qkv[:, (Hq + Hkv) * D:].view(T, Hkv, D)
        o = self.backend.forward(q, k, v, kv_cache[0], kv_cache[1], meta, self.scale)   # [T, Hq, D]
        return self.o_proj(o.reshape(T, -1))


class DecoderMLP(nn.Module):
    def __init__(self, cfg: DecoderConfig, tp_rank: int = 0, tp_size: int = 1):
        super().__init__()
        self.gate_up_proj = MergedColumnParallelLinear(cfg.hidden_size, [cfg.intermediate_size] * 2, cfg.mlp_bias,
                                                       tp_rank, tp_size)
        self.down_proj = RowParallelLinear(cfg.intermediate_size, cfg.hidden_size, cfg.mlp_bias, tp_rank, tp_size)
        self.act = SiluAndMul()

    def forward(self, x: Tensor) -> Tensor:
        return self.down_proj(self.act(self.gate_up_proj(x)))                    # [T, 2I] -> [T, I] -> [T, H]


class DecoderLayer(nn.Module):
    def __init__(self, cfg: DecoderConfig, attn_backend, rotary: RotaryEmbedding, tp_rank: int = 0, tp_size: int = 1,
                 fused_qk_norm_rope_store: bool = False):
        super().__init__()
        self.self_attn = DecoderAttention(cfg, attn_backend, rotary, tp_rank, tp_size, fused_qk_norm_rope_store)
        self.mlp = DecoderMLP(cfg, tp_rank, tp_size)
        self.input_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.post_attention_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)

    def forward(self, positions, x, residual, meta, kv_cache):
        if residual is None:
            residual = x
            x = self.input_layernorm(x)
        else:
            x, residual = self.input_layernorm(x, residual)
        x = self.self_attn(positions, x, meta, kv_cache)
        x, residual = self.post_attention_layernorm(x, residual)
        return self.mlp(x), residual


class DecoderModel(nn.Module):
    def __init__(self, cfg: DecoderConfig, attn_backend, tp_rank: int = 0, tp_size: int = 1,
                 fused_qk_norm_rope_store: bool = False):
        super().__init__()
        self.embed_tokens = VocabParallelEmbedding(cfg.vocab_size, cfg.hidden_size, tp_rank, tp_size)
        rotary = RotaryEmbedding(cfg.head_dim, cfg.max_position_embeddings, cfg.rope_theta, cfg.rope_scaling)
        self.layers = nn.ModuleList(DecoderLayer(cfg, attn_backend, rotary, tp_rank, tp_size, fused_qk_norm_rope_store)
                                    for _ in range(cfg.num_hidden_layers))
        self.norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)

    def forward(self, input_ids, positions, meta, kv_caches):
        x, residual = self.embed_tokens(input_ids), None                         # [T, H]
        for layer, kv_cache in zip(self.layers, kv_caches):
            x, residual = layer(positions, x, residual, meta, kv_cache)
        x, _ = self.norm(x, residual)
        return x


class DecoderForCausalLM(nn.Module):
    """forward(input_ids [T], positions [T], meta, kv_caches) -> hidden [T, H];
    compute_logits(hidden [S, H]) -> [S, V] (None on tensor-parallel ranks > 0).
    kv_caches: one (k_cache, v_cache) pair per layer, each [num_blocks, block_size, num_kv_heads_per_rank, D].

    A subclass sets `config_class` (a class with `from_hf(config.json dict) -> DecoderConfig`)."""

    # checkpoint projection -> (packed module, shard index); see engine/loader.py
    packed_modules = {
        "q_proj": ("qkv_proj", 0), "k_proj": ("qkv_proj", 1), "v_proj": ("qkv_proj", 2),
        "gate_proj": ("gate_up_proj", 0), "up_proj": ("gate_up_proj", 1),
    }
    config_class = DecoderConfig

    def __init__(self, cfg: DecoderConfig, attn_backend, tp_rank: int = 0, tp_size: int = 1,
                 fused_qk_norm_rope_store: bool = False):
        super().__init__()
        self.config = cfg
        self.tp_rank, self.tp_size = tp_rank, tp_size
        self.model = DecoderModel(cfg, attn_backend, tp_rank, tp_size, fused_qk_norm_rope_store)
        self.num_kv_heads_per_rank = self.model.layers[0].self_attn.num_kv_heads if cfg.num_hidden_layers else 0
        self.lm_head = ParallelLMHead(cfg.vocab_size, cfg.hidden_size, tp_rank, tp_size)
        if cfg.tie_word_embeddings:
            self.lm_head.weight = self.model.embed_tokens.weight

    def forward(self, input_ids: Tensor, positions: Tensor, meta: AttentionMetadata,
                kv_caches: list[tuple[Tensor, Tensor]]) -> Tensor:
        return self.model(input_ids, positions, meta, kv_caches)

    def compute_logits(self, hidden: Tensor) -> Tensor | None:
        return self.lm_head(hidden)
