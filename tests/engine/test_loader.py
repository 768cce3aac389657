"""engine/loader.py: round trips against transformers, sharded checkpoints, and clear errors."""
import json
import shutil

import pytest
import torch
from safetensors.torch import load_file, save_file

from engine.layers.attention_backends import get_attention_backend
from engine.layers.attention_metadata import AttentionMetadata
from engine.loader import build_model
from tests.engine.tiny_model import TINY, make_tiny_qwen3

BACKEND = get_attention_backend("torch", "cpu")


def _logits(model, ids):
    shape = (4, 16, TINY["num_key_value_heads"], TINY["head_dim"])
    kv = [(torch.zeros(shape), torch.zeros(shape)) for _ in range(TINY["num_hidden_layers"])]
    meta = AttentionMetadata.build([len(ids)], [len(ids)], [[0, 1, 2, 3]], 1, 16)
    with torch.no_grad():
        return model.compute_logits(model(ids, torch.arange(len(ids)), meta, kv))


IDS = torch.tensor([3, 1, 4, 1, 5, 9, 2, 6, 5, 3, 5, 8, 9, 7, 9, 3, 2, 3, 8, 4])


@pytest.fixture(scope="module")
def untied(tmp_path_factory):
    path = tmp_path_factory.mktemp("untied")
    return path, make_tiny_qwen3(path)


@pytest.mark.parametrize("tied", [False, True])
def test_round_trip_matches_transformers(tmp_path, tied):
    hf = make_tiny_qwen3(tmp_path, tie_word_embeddings=tied)
    model = build_model(tmp_path, "cpu", torch.float32, BACKEND)
    assert (model.lm_head.weight is model.model.embed_tokens.weight) == tied
    with torch.no_grad():
        ref = hf(IDS[None]).logits[0]
    torch.testing.assert_close(_logits(model, IDS), ref, atol=1e-4, rtol=0)


def test_sharded_checkpoint_loads(tmp_path, untied):
    hf = make_tiny_qwen3(tmp_path, max_shard_size="60KB")
    assert (tmp_path / "model.safetensors.index.json").is_file()
    assert len(list(tmp_path.glob("*.safetensors"))) > 2
    model = build_model(tmp_path, "cpu", torch.float32, BACKEND)
    with torch.no_grad():
        ref = hf(IDS[None]).logits[0]
    torch.testing.assert_close(_logits(model, IDS), ref, atol=1e-4, rtol=0)


def test_bfloat16_load_casts(untied):
    path, _ = untied
    model = build_model(path, "cpu", torch.bfloat16, BACKEND)
    assert model.model.layers[0].self_attn.qkv_proj.weight.dtype == torch.bfloat16
    assert model.model.layers[0].self_attn.rotary.cos_sin.dtype == torch.float32


def _copy(src, dst):
    shutil.copytree(src, dst)
    return dst


def _edit(path, fn):
    f = path / "model.safetensors"
    tensors = load_file(str(f))
    fn(tensors)
    save_file(tensors, str(f))


def test_missing_directory_and_missing_weights(tmp_path, untied):
    with pytest.raises(FileNotFoundError, match="does not exist"):
        build_model(tmp_path / "nope", "cpu", torch.float32, BACKEND, hf_config=json.loads(
            (untied[0] / "config.json").read_text()))
    d = _copy(untied[0], tmp_path / "noweights")
    (d / "model.safetensors").unlink()
    with pytest.raises(FileNotFoundError, match=r"no \*\.safetensors file.*safe_serialization=True"):
        build_model(d, "cpu", torch.float32, BACKEND)
    with pytest.raises(FileNotFoundError, match="no config.json"):
        build_model(tmp_path, "cpu", torch.float32, BACKEND)


def test_missing_tensor_is_named(tmp_path, untied):
    d = _copy(untied[0], tmp_path / "c")
    _edit(d, lambda t: t.pop("model.layers.1.self_attn.k_proj.weight"))
    with pytest.raises(ValueError, match=r"lacks 1 tensor.*model\.layers\.1\.self_attn\.k_proj\.weight"):
        build_model(d, "cpu", torch.float32, BACKEND)


def test_untied_checkpoint_without_lm_head_hints_at_tying(tmp_path, untied):
    d = _copy(untied[0], tmp_path / "c")
    _edit(d, lambda t: t.pop("lm_head.weight"))
    with pytest.raises(ValueError, match="lm_head.weight.*tie_word_embeddings=false"):
        build_model(d, "cpu", torch.float32, BACKEND)


def test_unexpected_tensor_is_named(tmp_path, untied):
    d = _copy(untied[0], tmp_path / "c")
    _edit(d, lambda t: t.__setitem__("model.layers.0.mlp.extra_proj.weight", torch.zeros(2, 2)))
    with pytest.raises(ValueError, match=r"does not use.*model\.layers\.0\.mlp\.extra_proj\.weight"):
        build_model(d, "cpu", torch.float32, BACKEND)


def test_shape_mismatch_names_tensor_and_fix(tmp_path, untied):
    d = _copy(untied[0], tmp_path / "c")
    cfg = json.loads((d / "config.json").read_text())
    cfg["intermediate_size"] = 96
    (d / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(ValueError, match=r"'model\.layers\.0\.mlp\.down_proj\.weight'.*\(64, 128\).*\(64, 96\)"
                                         r".*config\.json does not match"):
        build_model(d, "cpu", torch.float32, BACKEND)


def test_index_listing_a_missing_shard(tmp_path):
    make_tiny_qwen3(tmp_path, max_shard_size="60KB")
    shard = sorted(tmp_path.glob("model-*.safetensors"))[0]
    shard.unlink()
    with pytest.raises(FileNotFoundError, match=f"lists shard.*{shard.name}"):
        build_model(tmp_path, "cpu", torch.float32, BACKEND)


def test_unsupported_architecture(tmp_path, untied):
    d = _copy(untied[0], tmp_path / "c")
    cfg = json.loads((d / "config.json").read_text())
    cfg["architectures"] = ["MixtralForCausalLM"]
    (d / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(ValueError, match=r"unsupported architecture \['MixtralForCausalLM'\]; supported: "
                                         r"LlamaForCausalLM, Qwen2ForCausalLM, Qwen3ForCausalLM"):
        build_model(d, "cpu", torch.float32, BACKEND)


@pytest.mark.parametrize("keep", [0.5, 100, 5])
def test_truncated_safetensors_file_is_named(tmp_path, untied, keep):
    # an interrupted download: safetensors' own "incomplete metadata" error becomes one naming the file
    d = _copy(untied[0], tmp_path / "c")
    f = d / "model.safetensors"
    data = f.read_bytes()
    f.write_bytes(data[:int(len(data) * keep) if keep < 1 else keep])
    with pytest.raises(ValueError, match=r"model\.safetensors.*is not a readable safetensors file.*truncated or "
                                         r"corrupt.*download it again"):
        build_model(d, "cpu", torch.float32, BACKEND)
