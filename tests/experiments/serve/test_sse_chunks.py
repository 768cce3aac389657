"""Streamed chunks, written around json.dumps of the text, are the JSON of the chunk dicts."""
from __future__ import annotations

import asyncio
import json
from types import SimpleNamespace

import pytest

pytest.importorskip("fastapi")

from experiments.serve.app import _chat_chunks, _completion_chunks  # noqa: E402
from experiments.serve.asgi import LastEvent  # noqa: E402

HEAD = {"id": "cmpl-1", "created": 7, "model": 'odd "name"\\ü'}
TEXTS = [' say "hi"\n', "ü\u2028\t", ""]


async def _events():
    for k, text in enumerate(TEXTS):
        yield 1, text, [k], "length" if k == len(TEXTS) - 1 else None


def _run(make, token_ids):
    """The events written, one string each (a write may hold several: the last chunk goes with [DONE])."""
    async def go():
        return [c async for c in make(_events(), HEAD, {1: None}, 3, False, token_ids, False)]
    writes = asyncio.run(go())
    assert type(writes[-1]) is LastEvent and all(type(w) is str for w in writes[:-1])
    return [e + "\n\n" for w in writes for e in w.split("\n\n") if e]


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


def test_the_last_chunk_usage_and_done_go_out_in_one_write():
    async def go(n):
        async def events():
            for k in range(3):          # choice k % n; each choice's last event at k >= 3 - n
                yield k % n, f"t{k}", [k], "length" if k >= 3 - n else None
        streams = {i: SimpleNamespace(token_ids=[0]) for i in range(n)}
        return [c async for c in _completion_chunks(events(), HEAD, streams, lambda k: {"k": k}, True, False, False)]

    writes = asyncio.run(go(1))
    assert len(writes) == 3 and type(writes[-1]) is LastEvent
    last = writes[-1].split("\n\n")
    assert json.loads(last[0][len("data: "):])["choices"][0]["text"] == "t2"
    assert json.loads(last[1][len("data: "):])["usage"] == {"k": 1} and last[2] == "data: [DONE]"
    writes = asyncio.run(go(2))         # two choices: the first to finish is written at once, the last with [DONE]
    assert len(writes) == 3 and '"finish_reason":"length"' in writes[1] and '"index":0' in writes[-1]
