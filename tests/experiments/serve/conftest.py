import pytest


@pytest.fixture(scope="session")
def ckpt(tmp_path_factory):
    """A tiny Qwen3 checkpoint with a word-level tokenizer and a chat template (tests/experiments/serve/server.py)."""
    from tests.experiments.serve.server import make_checkpoint
    return make_checkpoint(tmp_path_factory.mktemp("ckpt"))
