"""benchmarks/gpu_lib.sh: a reused checkpoint (CKPT) without a tokenizer gets one before the server and the load
generator need it (a generalization checkpoint has none; guidellm then spent the stage's time looking for one)."""
import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_make_serving_checkpoint_adds_a_tokenizer_to_a_reused_checkpoint(tmp_path):
    ckpt = tmp_path / "ckpt"
    ckpt.mkdir()
    (ckpt / "config.json").write_text(json.dumps({"marker": 1}))
    script = (f"source benchmarks/gpu_lib.sh; LOG={tmp_path}/log; : > $LOG; PY={sys.executable}; FAILED=(); "
              f"make_serving_checkpoint {ckpt} 60 300; echo failed=${{FAILED[*]:-none}}")
    out = subprocess.run(["bash", "-c", script], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert "failed=none" in out.stdout, out.stdout + out.stderr
    assert (ckpt / "tokenizer.json").is_file()
    assert json.loads((ckpt / "config.json").read_text()) == {"marker": 1}      # the checkpoint itself is kept
