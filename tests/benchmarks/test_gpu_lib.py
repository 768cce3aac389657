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


def _bash(script: str, **env) -> subprocess.CompletedProcess:
    return subprocess.run(["bash", "-c", script], cwd=ROOT, capture_output=True, text=True, timeout=60,
                          env={"PATH": "/usr/bin:/bin", **env})


def test_select_stages_leaves_the_only_named_stages_out_of_the_default():
    """Without STAGES every stage but the ONLY_NAMED ones runs; a named one runs when asked; an unknown one is
    refused with the allowed list."""
    pick = 'source benchmarks/gpu_lib.sh; select_stages "a b c d" "b d"; echo "[$STAGES]"'
    assert _bash(pick).stdout.strip() == "[a c]"
    assert _bash(pick, STAGES="b").stdout.strip() == "[b]"
    assert _bash('source benchmarks/gpu_lib.sh; select_stages "a b"; echo "[$STAGES]"').stdout.strip() == "[a b]"
    bad = _bash(pick, STAGES="z")
    assert bad.returncode == 2 and "unknown stage z (allowed: a b c d)" in bad.stderr


def test_a_stage_that_would_pass_the_deadline_is_skipped_and_logged(tmp_path):
    """fits_deadline: with DEADLINE_S=100 after 30 s, a 60 s stage fits and an 80 s one is skipped, logged and
    counted failed; without DEADLINE_S every stage fits."""
    check = (f"source benchmarks/gpu_lib.sh; LOG={tmp_path}/log; : > $LOG; FAILED=(); SECONDS=30; "
             "fits_deadline a 60 && echo a; fits_deadline b 80 && echo b; echo failed=${FAILED[*]:-none}")
    out = _bash(check, DEADLINE_S="100").stdout.split()
    assert out[0] == "a" and "b" not in out and out[-1] == "failed=b", out
    assert "[b] skipped" in (tmp_path / "log").read_text()
    assert _bash(check).stdout.split() == ["a", "b", "failed=none"]


def test_help_prints_each_gpu_scripts_whole_leading_comment():
    """--help prints a script's header from line 2 to its last leading comment line, so it cannot fall behind a
    header that grows."""
    for script in sorted(ROOT.glob("benchmarks/gpu_*.sh")):
        lines = script.read_text().splitlines()
        if not any(line.startswith("gpu_init ") for line in lines):
            continue
        end = next(i for i, line in enumerate(lines[1:], 1) if not line.startswith("#"))
        out = _bash(f"bash {script.relative_to(ROOT)} --help")
        assert out.returncode == 0 and out.stdout.splitlines() == lines[1:end], script.name
