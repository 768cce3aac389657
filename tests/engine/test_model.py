"""Model pieces (Qwen3, Qwen2, Llama with Llama 3 RoPE scaling) against transformers, on CPU in float32."""
import pytest
import torch

from engine.layers.attention_backends import get_attention_backend
from engine.layers.attention_metadata import AttentionMetadata
from engine.layers.norm import RMSNorm
from engine.layers.rotary import RotaryEmbedding
from engine.loader import build_model
from engine.models import MODEL_REGISTRY, get_model_class
from engine.models.llama import LlamaConfig
from engine.models.qwen3 import Qwen3Config
from tests.engine.tiny_model import ARCHITECTURES, LLAMA3_ROPE, TINY, make_tiny_checkpoint

# (architecture, attention backend, fused_qk_norm_rope_store): the reference backend, and the triton kernels
# (interpreter) with q/k norm, RoPE and the KV store as one kernel
VARIANTS = [(arch, "torch", False) for arch in ARCHITECTURES] + [(arch, "triton", True) for arch in ARCHITECTURES]


@pytest.fixture(scope="module", params=VARIANTS, ids=[f"{a}-{b}{'-fused' * f}" for a, b, f in VARIANTS])
def ckpt(tmp_path_factory, request):
    arch, backend, fused_store = request.param
    path = tmp_path_factory.mktemp(arch)
    hf = make_tiny_checkpoint(path, arch)
    model = build_model(path, "cpu", torch.float32, get_attention_backend(backend, "cpu"),
                        fused_qk_norm_rope_store=fused_store)
    assert (model.model.layers[0].self_attn.fused_store is not None) == fused_store     # the path under test
    return path, hf, model


def _kv(num_blocks=16):
    shape = (num_blocks, 16, TINY["num_key_value_heads"], TINY["head_dim"])
    return [(torch.zeros(shape), torch.zeros(shape)) for _ in range(TINY["num_hidden_layers"])]


def test_config_reads_old_and_new_rope_fields():
    base = dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4, vocab_size=10)
    assert Qwen3Config.from_hf({**base, "rope_theta": 1e6}).rope_theta == 1e6
    new = Qwen3Config.from_hf({**base, "rope_parameters": {"rope_type": "default", "rope_theta": 5e5}})
    assert new.rope_theta == 5e5
    assert new.head_dim == 16 and new.num_key_value_heads == 4          # derived defaults
    with pytest.raises(ValueError, match="rope type 'yarn' is not supported"):
        Qwen3Config.from_hf({**base, "rope_parameters": {"rope_type": "yarn", "rope_theta": 1.0}})
    with pytest.raises(ValueError, match="lacks"):
        Qwen3Config.from_hf({"hidden_size": 8})


def test_unsupported_architecture_lists_supported():
    with pytest.raises(ValueError, match="unsupported architecture.*supported: LlamaForCausalLM, Qwen2ForCausalLM, "
                                         "Qwen3ForCausalLM"):
        get_model_class({"architectures": ["GPT2LMHeadModel"]})


def test_registry_is_lazy_and_every_entry_resolves():
    import subprocess
    import sys
    code = ("import sys, engine.models; assert not [m for m in sys.modules if m.startswith('engine.models.')], "
            "sorted(sys.modules)")
    subprocess.run([sys.executable, "-c", code], check=True)
    for arch in MODEL_REGISTRY:
        assert get_model_class({"architectures": [arch]}).__name__ == arch


def test_llama3_rope_config_and_frequencies_match_transformers():
    from transformers import LlamaConfig as HFLlamaConfig
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

    from engine.layers.rotary import RotaryEmbedding, rope_inv_freq
    base = dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4, vocab_size=10,
                head_dim=16, max_position_embeddings=1024)
    cfg = LlamaConfig.from_hf({**base, "rope_scaling": dict(LLAMA3_ROPE)})      # the old field name
    assert cfg.rope_scaling is not None and cfg.rope_scaling.factor == 8.0
    assert cfg.rope_scaling.original_max_position_embeddings == 64 and not cfg.qk_norm
    ref, _ = ROPE_INIT_FUNCTIONS["llama3"](HFLlamaConfig(**base, rope_parameters=dict(LLAMA3_ROPE)), "cpu")
    ours = cfg.rope_scaling.apply(rope_inv_freq(16, 10000.0))
    torch.testing.assert_close(ours, ref, rtol=0, atol=0)
    assert not torch.equal(ours, rope_inv_freq(16, 10000.0))          # the scaling changes something
    table = RotaryEmbedding(16, 128, 10000.0, cfg.rope_scaling).cos_sin
    assert not torch.equal(table, RotaryEmbedding(16, 128, 10000.0).cos_sin)
    with pytest.raises(ValueError, match="rope type 'yarn' is not supported for Llama"):
        LlamaConfig.from_hf({**base, "rope_parameters": {"rope_type": "yarn", "rope_theta": 1.0, "factor": 2.0}})


def test_rotary_matches_transformers():
    from transformers.models.qwen3.modeling_qwen3 import apply_rotary_pos_emb, rotate_half  # noqa: F401
    D, theta, T = 16, 10000.0, 9
    rope = RotaryEmbedding(D, 64, theta)
    pos = torch.tensor([0, 1, 2, 5, 17, 63, 3, 3, 40])
    q, k = torch.randn(T, 4, D), torch.randn(T, 2, D)
    ours_q, ours_k = rope(pos, q, k)
    inv = 1.0 / theta ** (torch.arange(0, D, 2).float() / D)
    emb = torch.cat([pos[:, None].float() * inv] * 2, dim=-1)            # [T, D]
    ref_q, ref_k = apply_rotary_pos_emb(q.transpose(0, 1)[None], k.transpose(0, 1)[None], emb.cos()[None],
                                        emb.sin()[None])
    torch.testing.assert_close(ours_q, ref_q[0].transpose(0, 1))
    torch.testing.assert_close(ours_k, ref_k[0].transpose(0, 1))


def test_rmsnorm_fused_residual_equals_add_then_norm():
    norm = RMSNorm(8, eps=1e-6)
    norm.weight.data = torch.randn(8)
    x, r = torch.randn(5, 8), torch.randn(5, 8)
    y, new_r = norm(x, r)
    torch.testing.assert_close(new_r, x + r)
    ref = (x + r) * torch.rsqrt((x + r).pow(2).mean(-1, keepdim=True) + 1e-6) * norm.weight
    torch.testing.assert_close(y, ref)


def test_contiguous_prompt_logits_match_transformers(ckpt):
    _, hf, model = ckpt
    ids = torch.randint(0, TINY["vocab_size"], (29,), generator=torch.Generator().manual_seed(1))
    meta = AttentionMetadata.build([29], [29], [[3, 7]], 1, 16)
    with torch.no_grad():
        ours = model.compute_logits(model(ids, torch.arange(29), meta, _kv()))
        ref = hf(ids[None]).logits[0]
    torch.testing.assert_close(ours, ref, atol=1e-4, rtol=0)


def test_chunks_and_decodes_over_paged_cache_match_full_forward(ckpt):
    """A prompt split into a prefill chunk, a later chunk with cached context, then decodes, all in
    one batch with another sequence, gives the logits of one full forward pass."""
    _, hf, model = ckpt
    g = torch.Generator().manual_seed(2)
    a = torch.randint(0, TINY["vocab_size"], (40,), generator=g)
    b = torch.randint(0, TINY["vocab_size"], (21,), generator=g)
    kv = _kv()
    ta, tb = [5, 2, 9], [0, 11]          # block tables (non-contiguous on purpose)
    with torch.no_grad():
        ref_a, ref_b = hf(a[None]).logits[0], hf(b[None]).logits[0]
        # step 1: a[0:20] and b[0:20] as prefills
        meta = AttentionMetadata.build([20, 20], [20, 20], [ta, tb], 2, 16)
        h = model(torch.cat([a[:20], b[:20]]), torch.cat([torch.arange(20)] * 2), meta, kv)
        torch.testing.assert_close(model.compute_logits(h[:20]), ref_a[:20], atol=1e-4, rtol=0)
        # step 2: a[20:39] as a chunk over cached context, b[20] as a decode
        meta = AttentionMetadata.build([19, 1], [39, 21], [ta, tb], 1, 16)
        pos = torch.cat([torch.arange(20, 39), torch.tensor([20])])
        h = model(torch.cat([a[20:39], b[20:21]]), pos, meta, kv)
        logits = model.compute_logits(h)
        torch.testing.assert_close(logits[:19], ref_a[20:39], atol=1e-4, rtol=0)
        torch.testing.assert_close(logits[19], ref_b[20], atol=1e-4, rtol=0)
        # step 3: a[39] as a decode
        meta = AttentionMetadata.build([1], [40], [ta], 0, 16)
        h = model(a[39:40], torch.tensor([39]), meta, kv)
        torch.testing.assert_close(model.compute_logits(h)[0], ref_a[39], atol=1e-4, rtol=0)


def test_flash_attn_adapter_with_small_pages_takes_the_fused_path(tmp_path):
    """The flash_attn adapter (on the triton kernels at 16-token pages) has `attend`: the decoder stores k and v
    with the fused kernel, and the logits still match transformers."""
    from tests.engine.test_attention_backends import _flash_attn_adapter_without_the_package
    hf = make_tiny_checkpoint(tmp_path, "qwen3")
    model = build_model(tmp_path, "cpu", torch.float32, _flash_attn_adapter_without_the_package(),
                        fused_qk_norm_rope_store=True)
    assert model.model.layers[0].self_attn.fused_store is not None
    ids = torch.randint(0, TINY["vocab_size"], (21,), generator=torch.Generator().manual_seed(4))
    with torch.no_grad():
        ours = model.compute_logits(model(ids, torch.arange(21), AttentionMetadata.build([21], [21], [[4, 1]], 1, 16),
                                          _kv()))
        torch.testing.assert_close(ours, hf(ids[None]).logits[0], atol=1e-4, rtol=0)
