"""Streamed chunks, written around json.dumps of the text, are the JSON of the chunk dicts."""
from __future__ import annotations

import asyncio
import json

import pytest

pytest.importorskip("fastapi")

from experiments.serve.app import _chat_chunks, _completion_chunks  # noqa: E402

HEAD = {"id": "cmpl-1", "created": 7, "model": 'odd "name"\\ü'}
TEXTS = [' say "hi"\n', "ü\u2028\t", ""]


async def _events():
    for k, text in enumerate(TEXTS):
        yield 1, text, [k], "length" if k == len(TEXTS) - 1 else None


def _run(make, token_ids):
    async def go():
        return [c async for c in make(_events(), HEAD, {1: None}, 3, False, token_ids, False)]
    return asyncio.run(go())


@pytest.mark.parametrize("token_ids", [False, True])
def test_completion_chunks(token_ids):
    out = _run(_completion_chunks, token_ids)
    assert out[-1] == "data: [DONE]\n\n"
    got = [json.loads(c[len("data: "):]) for c in out[:-1]]
    want = [{**HEAD, "object": "text_completion",
             "choices": [{"index": 1, "text": t, "logprobs": None, "finish_reason": f,
                          **({"token_ids": [k]} if token_ids else {})}]}
            for k, (t, f) in enumerate([(TEXTS[0], None), (TEXTS[1], None), (TEXTS[2], "length")])]
    assert got == want


def test_chat_chunks():
    out = _run(_chat_chunks, False)
    got = [json.loads(c[len("data: "):]) for c in out[:-1]]
    assert got[0]["choices"][0]["delta"] == {"role": "assistant", "content": ""}
    assert [g["choices"][0]["delta"] for g in got[1:]] == [{"content": TEXTS[0]}, {"content": TEXTS[1]}, {}]
    assert got[-1]["choices"][0]["finish_reason"] == "length"
    assert {g["object"] for g in got} == {"chat.completion.chunk"} and got[1]["model"] == HEAD["model"]
