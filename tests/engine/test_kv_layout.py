"""The KV layout rules (block size, tensor-parallel KV-head split, block bytes) live in
engine/core/kv_layout.py alone; the scheduler, the engine and the simulator call them."""
import re
from pathlib import Path

import pytest

from engine.core.kv_layout import check_block_size, first_kv_head, kv_block_bytes, kv_heads_per_rank

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("engine", "sim", "experiments", "policies")


def test_the_rules():
    for bs in (1, 2, 16, 256):
        check_block_size(bs)
    for bs in (0, 3, 24, -16):
        with pytest.raises(ValueError, match="block_size must be a power of two"):
            check_block_size(bs)
    assert [kv_heads_per_rank(8, tp) for tp in (1, 2, 4, 8, 16)] == [8, 4, 2, 1, 1]
    assert [first_kv_head(8, r, 4) for r in range(4)] == [0, 2, 4, 6]
    assert [first_kv_head(2, r, 8) for r in range(8)] == [0, 0, 0, 0, 1, 1, 1, 1]    # replicas of one head
    with pytest.raises(ValueError, match="tensor_parallel_size=3 must divide num_key_value_heads=8"):
        kv_heads_per_rank(8, 3)
    with pytest.raises(ValueError, match="exceeds num_key_value_heads=2 and is not a multiple of it"):
        kv_heads_per_rank(2, 3)
    assert kv_block_bytes(16, 28, 8, 128, 2) == 16 * 2 * 28 * 8 * 128 * 2


def test_the_backends_use_the_same_rules():
    from engine.config import tensor_parallel_problem
    from sim.specs.capacity import block_bytes_per_gpu, kv_heads_per_gpu
    from sim.specs.models import get_model_spec
    m = get_model_spec("Qwen3-8B")
    for tp in (1, 2, 4, 8):
        heads = kv_heads_per_gpu(m, tp)
        assert heads == kv_heads_per_rank(m.num_kv_heads, tp)
        assert block_bytes_per_gpu(m, 16, tp) == kv_block_bytes(16, m.num_layers, heads, m.head_dim, m.dtype_bytes)
    assert m.kv_bytes_per_token == block_bytes_per_gpu(m, 1, 1)
    assert tensor_parallel_problem(3, 12, 2, 96) == "tensor_parallel_size=3 exceeds num_key_value_heads=2 and is " \
        "not a multiple of it (KV heads are replicated only in whole copies)"


def test_no_copy_of_a_rule_elsewhere():
    copies = {"block-size check": r"block_size\s*&\s*\(\s*[\w.]*block_size\s*-\s*1\s*\)",
              "KV-head split": r"num_k(?:ey_)?v(?:alue)?_heads\s*//\s*t",
              "block bytes": r"2\s*\*[^\n#]*\.num_(?:hidden_)?layers[^\n#]*head_dim"}
    found = []
    for pkg in PACKAGES:
        for path in (ROOT / pkg).rglob("*.py"):
            if path.name == "kv_layout.py":
                continue
            text = path.read_text()
            found += [(what, str(path.relative_to(ROOT))) for what, pat in copies.items() if re.search(pat, text)]
    assert found == [], found
