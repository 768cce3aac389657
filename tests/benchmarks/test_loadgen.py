"""A standard load generator (guidellm) drives a bounded run against an OpenAI-compatible server on loopback; its
report is parsed and checked (benchmarks/loadgen.py)."""
import importlib.util
import json
from pathlib import Path

import pytest

from tests.experiments.openai_stub import FAIL_TOKENS, StubServer

ROOT = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.slow


def load_loadgen():
    spec = importlib.util.spec_from_file_location("loadgen", ROOT / "benchmarks" / "loadgen.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


@pytest.fixture(scope="module")
def tokenizer(tmp_path_factory):
    pytest.importorskip("guidellm", reason="guidellm is not installed (pip install -e '.[test]')")
    from tests.experiments.byte_tokenizer import make_byte_tokenizer
    path = tmp_path_factory.mktemp("byte_tokenizer")
    make_byte_tokenizer(path)
    return path


def test_guidellm_completes_every_request_against_the_stub(tokenizer, tmp_path, capsys):
    loadgen = load_loadgen()
    with StubServer(ttft_s=0.02, itl_s=0.005) as stub:
        rc = loadgen.main(["--url", stub.url, "--tokenizer", str(tokenizer), "--rate-rps", "20", "--num-requests", "8",
                           "--prompt-tokens", "24", "--output-tokens", "5", "--max-seconds", "30", "--workers", "1",
                           "--out", str(tmp_path)])
        bodies = [b for b in stub.received if b.get("stream")]
    summary = json.loads((tmp_path / "loadgen.json").read_text())
    assert rc == 0, (tmp_path / "guidellm.log").read_text()[-2000:]
    assert (summary["successful"], summary["errored"], summary["incomplete"]) == (8, 0, 0)
    assert summary["output_tokens_mean"] == 5
    assert summary["ttft_ms_p50"] == pytest.approx(20, abs=30)
    assert len(bodies) == 8 and all(b["max_tokens"] == 5 and b["ignore_eos"] for b in bodies)
    assert json.loads(capsys.readouterr().out.strip().splitlines()[-1])["successful"] == 8


def test_errored_requests_fail_the_check(tokenizer, tmp_path):
    loadgen = load_loadgen()
    with StubServer(ttft_s=0.01, itl_s=0.002) as stub:
        rc = loadgen.main(["--url", stub.url, "--tokenizer", str(tokenizer), "--rate-rps", "20", "--num-requests", "3",
                           "--prompt-tokens", "8", "--output-tokens", str(FAIL_TOKENS), "--max-seconds", "20",
                           "--workers", "1", "--out", str(tmp_path)])
    assert rc == 1
    summary = json.loads((tmp_path / "loadgen.json").read_text())
    assert summary["errored"] >= 1 and summary["successful"] == 0


def test_a_tokenizer_without_english_is_refused_before_guidellm_runs(tokenizer, tmp_path):
    from experiments.tiny_checkpoint import make_serving_checkpoint
    loadgen = load_loadgen()
    tiny = tmp_path / "tiny"
    make_serving_checkpoint(tiny)
    assert loadgen.unknown_token_share(str(tokenizer)) == 0.0
    assert loadgen.unknown_token_share(str(tiny)) == 1.0              # w0..w509: every English word is <unk>
    with pytest.raises(SystemExit, match="--tokenizer .* unknown token"):
        loadgen.main(["--url", "http://127.0.0.1:9", "--tokenizer", str(tiny), "--out", str(tmp_path / "out")])
    assert not (tmp_path / "out").exists()
