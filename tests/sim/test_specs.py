"""Model/hardware specs and KV capacity: published sizes, lookups, hand-computed capacity."""
import subprocess
import sys

import pytest

from sim.specs import HARDWARE_SPECS, MODEL_SPECS, ModelSpec, get_hardware_spec, get_model_spec, num_kv_blocks

# (total params, non-embedding params) as the model cards publish them.
PUBLISHED = {
    "Qwen3-0.6B": (0.6e9, 0.44e9), "Qwen3-1.7B": (1.7e9, 1.4e9), "Qwen3-4B": (4.0e9, 3.6e9),
    "Qwen3-8B": (8.2e9, 6.95e9), "Qwen3-14B": (14.8e9, 13.2e9), "Qwen3-32B": (32.8e9, 31.2e9),
    "Llama-3.1-8B": (8.03e9, None), "Llama-3.1-70B": (70.6e9, None),
}


@pytest.mark.parametrize("name", sorted(PUBLISHED))
def test_param_counts_match_published_sizes(name):
    spec = get_model_spec(name)
    total, non_embedding = PUBLISHED[name]
    # Published figures are rounded to 2-3 significant digits (1.72B is published as "1.7B").
    assert spec.num_params == pytest.approx(total, rel=0.015)
    if non_embedding:
        assert spec.num_linear_params == pytest.approx(non_embedding, rel=0.015)
    assert spec.weight_bytes == 2 * spec.num_params


def test_exact_counts_by_hand():
    q = get_model_spec("Qwen3-0.6B")
    # per layer: q 1024*2048 + k,v 2*1024*1024 + o 2048*1024 + mlp 3*1024*3072 = 15,728,640
    assert q.linear_params_per_layer == 15_728_640
    # 28 layers * (15,728,640 + 2 norms*1024 + q/k norm 2*128) + tied embedding 151936*1024 + final norm 1024
    assert q.num_params == 28 * (15_728_640 + 2048 + 256) + 155_582_464 + 1024 == 596_049_920
    assert q.kv_bytes_per_token == 2 * 28 * 8 * 128 * 2 == 114_688
    llama = get_model_spec("Llama-3.1-70B")
    assert llama.kv_bytes_per_token == 2 * 80 * 8 * 128 * 2 == 327_680
    assert not llama.tie_word_embeddings and llama.max_model_len == 131072


def test_model_lookup_aliases_and_errors():
    assert get_model_spec("Qwen/Qwen3-8B") is get_model_spec("qwen3_8b") is MODEL_SPECS["Qwen3-8B"]
    assert get_model_spec("qwen3_0p6b").name == "Qwen3-0.6B"
    assert get_model_spec("llama3_70b").name == "Llama-3.1-70B"
    with pytest.raises(ValueError) as e:
        get_model_spec("Qwen3-9B")
    for known in MODEL_SPECS:
        assert known in str(e.value)


def test_from_hf_config_reproduces_builtin_spec():
    # Qwen/Qwen3-0.6B config.json (the fields we read).
    cfg = {"architectures": ["Qwen3ForCausalLM"], "model_type": "qwen3", "head_dim": 128, "hidden_size": 1024,
           "intermediate_size": 3072, "max_position_embeddings": 40960, "num_attention_heads": 16,
           "num_hidden_layers": 28, "num_key_value_heads": 8, "tie_word_embeddings": True,
           "torch_dtype": "bfloat16", "vocab_size": 151936, "attention_bias": False}
    spec = ModelSpec.from_hf_config(cfg, name="Qwen3-0.6B")
    builtin = get_model_spec("Qwen3-0.6B")
    assert spec.num_params == builtin.num_params
    assert spec.kv_bytes_per_token == builtin.kv_bytes_per_token
    assert spec.max_model_len == 40960 and spec.dtype_bytes == 2
    # Llama-style config without head_dim: derived from hidden / heads.
    llama = ModelSpec.from_hf_config({"model_type": "llama", "hidden_size": 4096, "intermediate_size": 14336,
                                      "num_attention_heads": 32, "num_hidden_layers": 32,
                                      "num_key_value_heads": 8, "vocab_size": 128256,
                                      "max_position_embeddings": 131072, "torch_dtype": "bfloat16"})
    assert llama.num_params == get_model_spec("Llama-3.1-8B").num_params
    with pytest.raises(ValueError, match="intermediate_size"):
        ModelSpec.from_hf_config({k: v for k, v in cfg.items() if k != "intermediate_size"})
    with pytest.raises(ValueError, match="torch_dtype"):
        ModelSpec.from_hf_config({**cfg, "torch_dtype": "int3"})


def test_model_spec_validation():
    with pytest.raises(ValueError, match="multiple of num_kv_heads"):
        ModelSpec("bad", 2, 64, 6, 4, 16, 128, 100, True)
    with pytest.raises(ValueError, match="num_layers"):
        ModelSpec("bad", 0, 64, 4, 4, 16, 128, 100, True)


def test_hardware_specs_and_measured_ceilings():
    h200 = get_hardware_spec("h200")
    assert h200.flops_per_s() == 793e12 and h200.bytes_per_s() == 4.26e12
    assert h200.flops_per_s(use_measured=False) == 989e12 and h200.bytes_per_s(use_measured=False) == 4.8e12
    h100 = get_hardware_spec("H100_SXM")
    assert h100.flops_per_s() == 989e12 and h100.bytes_per_s() == 3.35e12     # no measurement: datasheet
    assert get_hardware_spec("a100_80gb").name == "A100-80GB"
    for spec in HARDWARE_SPECS.values():
        assert spec.source and spec.memory_gib > 40
    with pytest.raises(ValueError) as e:
        get_hardware_spec("B200")
    for known in HARDWARE_SPECS:
        assert known in str(e.value)


def test_hardware_for_device_name_reads_torch_names():
    from sim.specs.hardware import hardware_for_device_name
    assert hardware_for_device_name("NVIDIA H100 80GB HBM3").name == "H100-SXM"
    assert hardware_for_device_name("NVIDIA H200").name == "H200"
    assert hardware_for_device_name("NVIDIA A100-SXM4-80GB").name == "A100-80GB"
    assert hardware_for_device_name("NVIDIA L40S").name == "L40S"
    assert hardware_for_device_name("NVIDIA GeForce RTX 4090") is None
    assert hardware_for_device_name(None) is None


def test_num_kv_blocks_by_hand():
    m, h = get_model_spec("Qwen3-0.6B"), get_hardware_spec("H200")
    # usable = 143771 MiB * 2^20 * 0.9 = 150,754,820,096 * 0.9 = 135,679,338,086.4 B;
    # weights 596,049,920 * 2 = 1,192,099,840 B; reserve 1 GiB = 1,073,741,824 B
    # -> budget 133,413,496,422.4 B; block = 16 * 114,688 = 1,835,008 B -> floor(72,704.59) = 72,704 blocks.
    assert num_kv_blocks(m, h, block_size=16, gpu_memory_utilization=0.9, activation_reserve_gib=1.0) == 72_704
    # TP=2: weights halve and each GPU holds 4 of 8 KV heads, so a block costs half as much per GPU.
    tp2 = num_kv_blocks(m, h, tensor_parallel_size=2)
    assert tp2 == int((143771 * 2**20 * 0.9 - 1_192_099_840 / 2 - 2**30) // (1_835_008 / 2))


def test_num_kv_blocks_errors():
    big, l40s = get_model_spec("Llama-3.1-70B"), get_hardware_spec("L40S")
    with pytest.raises(ValueError, match="does not fit.*tensor_parallel_size"):
        num_kv_blocks(big, l40s)
    with pytest.raises(ValueError, match="must divide"):
        num_kv_blocks(get_model_spec("Qwen3-14B"), l40s, tensor_parallel_size=3)
    with pytest.raises(ValueError, match="gpu_memory_utilization"):
        num_kv_blocks(get_model_spec("Qwen3-0.6B"), l40s, gpu_memory_utilization=1.5)
    # TP beyond the KV heads replicates one head per GPU.
    assert num_kv_blocks(big, get_hardware_spec("H100"), tensor_parallel_size=16) > 0


def test_sim_imports_without_torch():
    code = ("import sys, sim, sim.specs, sim.cost_model, sim.lower_bound, sim.simulator; "
            "assert 'torch' not in sys.modules, 'sim imported torch'")
    subprocess.run([sys.executable, "-c", code], check=True)


def test_shape_mismatches_name_each_differing_dimension():
    from sim.specs.models import get_model_spec
    a, b = get_model_spec("qwen3_8b"), get_model_spec("qwen3_0p6b")
    assert a.shape_mismatches(a) == []
    diff = a.shape_mismatches(b)
    assert "num_layers: 36 vs 28" in diff and "hidden_size: 4096 vs 1024" in diff
    assert all(d.split(":")[0] in a.SHAPE_FIELDS for d in diff)
