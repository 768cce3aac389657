"""python -m experiments.tiny_checkpoint DIR: the tiny CPU checkpoint servelab-serve's docs and tests serve."""
from __future__ import annotations

import json

import pytest

from experiments import tiny_checkpoint
from tests.helpers import exit_code_and_output


def run(capsys, *args):
    return exit_code_and_output(capsys, tiny_checkpoint.main, list(args))


def test_writes_a_servable_checkpoint(tmp_path, capsys):
    pytest.importorskip("torch")
    pytest.importorskip("transformers")
    from transformers import AutoTokenizer

    code, out, err = run(capsys, str(tmp_path / "tiny"))
    assert code == 0, err
    assert f"servelab-serve backend.model_path={tmp_path / 'tiny'} backend.device=cpu" in out
    assert json.loads((tmp_path / "tiny" / "config.json").read_text())["vocab_size"] == 512
    tok = AutoTokenizer.from_pretrained(str(tmp_path / "tiny"))
    assert tok.encode("w1 w2") == [1, 2] and tok.eos_token_id == 511 and tok.chat_template


@pytest.mark.parametrize("args, words", [((), ["one folder"]), (("a", "b"), ["one folder"]),
                                         (("{full}",), ["not an empty folder"]),
                                         (("--vocab-sise", "3", "x"), ["unknown option --vocab-sise", "no options"])])
def test_a_mistake_is_one_error_line(tmp_path, capsys, args, words):
    (tmp_path / "full").mkdir()
    (tmp_path / "full" / "x").write_text("")
    code, _, err = run(capsys, *[a.format(full=tmp_path / "full") for a in args])
    lines = err.strip().splitlines()
    assert code == 2 and len(lines) == 1 and lines[0].startswith("error: "), err
    for w in words:
        assert w in lines[0]
