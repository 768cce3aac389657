"""The `openai` package against servelab-serve on loopback: completions and chat, streaming and not."""
from __future__ import annotations

import pytest

pytest.importorskip("torch")
openai = pytest.importorskip("openai")
pytest.importorskip("fastapi")

from engine.core.sequence import SamplingParams  # noqa: E402
from tests.experiments.serve.server import make_llm, running_server  # noqa: E402


@pytest.fixture(scope="module")
def srv(ckpt):
    with running_server(ckpt) as s:
        yield s


@pytest.fixture(scope="module")
def client(srv):
    return openai.OpenAI(base_url=srv.url, api_key="unused", max_retries=0, timeout=30)


def test_models_lists_the_served_name(client):
    models = client.models.list()
    assert [m.id for m in models.data] == ["tiny"]


def test_completion_greedy_matches_the_engine_in_process(srv, client):
    prompt = [5, 6, 7, 8, 9]
    resp = client.completions.create(model="tiny", prompt=prompt, max_tokens=6, temperature=0,
                                     extra_body={"return_token_ids": True, "ignore_eos": True})
    choice = resp.choices[0]
    ref = make_llm(srv.llm.config.model_path).generate([prompt], SamplingParams(temperature=0, max_tokens=6,
                                                                           ignore_eos=True), use_tqdm=False)[0]
    assert choice.model_extra["token_ids"] == ref.token_ids
    # decoded after the prompt (a leading space), special tokens (<unk>, <eos>) left out
    assert choice.text == " " + srv.llm.tokenizer.decode(ref.token_ids, skip_special_tokens=True)
    assert choice.finish_reason == "length"
    assert resp.usage.prompt_tokens == 5 and resp.usage.completion_tokens == 6 and resp.usage.total_tokens == 11


def test_streaming_completion_gives_the_same_text_as_non_streaming(client):
    kwargs = dict(model="tiny", prompt="w1 w2 w3", max_tokens=8, temperature=0, extra_body={"ignore_eos": True})
    whole = client.completions.create(**kwargs).choices[0].text
    chunks = list(client.completions.create(stream=True, stream_options={"include_usage": True}, **kwargs))
    text = "".join(c.choices[0].text for c in chunks if c.choices)
    assert text == whole and len(text.split()) == 8
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == "length"
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == 8
    assert 1 <= len([c for c in chunks if c.choices]) <= 8  # one per step, fewer when the reader falls behind


def test_several_prompts_and_n_give_one_choice_each(client):
    resp = client.completions.create(model="tiny", prompt=["w1 w2", "w3 w4 w5"], max_tokens=3, n=2, seed=1,
                                     extra_body={"ignore_eos": True})
    assert sorted(c.index for c in resp.choices) == [0, 1, 2, 3]
    assert resp.usage.prompt_tokens == 5 and resp.usage.completion_tokens == 12


def test_seed_repeats_a_sampled_completion(client):
    kwargs = dict(model="tiny", prompt=[1, 2, 3], max_tokens=10, temperature=1.0, top_p=0.9, seed=1234,
                  extra_body={"top_k": 50, "ignore_eos": True})
    a = client.completions.create(**kwargs).choices[0].text
    b = client.completions.create(**kwargs).choices[0].text
    c = client.completions.create(**{**kwargs, "seed": 99}).choices[0].text
    assert a == b and a != c


def test_stop_string_ends_the_text_before_it(client):
    kwargs = dict(model="tiny", prompt=[3, 1, 4], max_tokens=10, temperature=0, extra_body={"ignore_eos": True})
    words = client.completions.create(**kwargs).choices[0].text.split()
    stop = " " + words[3]                       # the fourth word, with its space
    for stream in (False, True):
        if stream:
            chunks = [c for c in client.completions.create(stream=True, stop=stop, **kwargs) if c.choices]
            text, reason = "".join(c.choices[0].text for c in chunks), chunks[-1].choices[0].finish_reason
        else:
            resp = client.completions.create(stop=[stop], **kwargs)
            text, reason = resp.choices[0].text, resp.choices[0].finish_reason
            assert resp.usage.completion_tokens == 4        # the engine stopped at the stop string's token
        assert text == " " + " ".join(words[:3]) and reason == "stop"


def test_stop_token_ids_end_the_output(client):
    kwargs = dict(model="tiny", prompt=[3, 1, 4], max_tokens=10, temperature=0)
    ids = client.completions.create(extra_body={"return_token_ids": True, "ignore_eos": True},
                                    **kwargs).choices[0].model_extra["token_ids"]
    resp = client.completions.create(extra_body={"stop_token_ids": [ids[2]], "return_token_ids": True}, **kwargs)
    assert resp.choices[0].finish_reason == "stop"
    assert resp.choices[0].model_extra["token_ids"] == ids[:3]
    assert resp.choices[0].text.split() == [f"w{t}" for t in ids[:2]]


def test_chat_completion_streaming_and_not(client, srv):
    messages = [{"role": "system", "content": "w7"}, {"role": "user", "content": "w1 w2"}]
    kwargs = dict(model="tiny", messages=messages, max_completion_tokens=5, temperature=0,
                  extra_body={"ignore_eos": True})
    resp = client.chat.completions.create(**kwargs)
    msg = resp.choices[0].message
    assert msg.role == "assistant" and len(msg.content.split()) == 5
    assert resp.usage.prompt_tokens == 4        # the template's text: "w7 w1 w2 w9"
    chunks = list(client.chat.completions.create(stream=True, **kwargs))
    assert chunks[0].choices[0].delta.role == "assistant"
    assert "".join(c.choices[0].delta.content or "" for c in chunks) == msg.content
    assert chunks[-1].choices[0].finish_reason == "length"
    assert {c.object for c in chunks} == {"chat.completion.chunk"}


def test_chat_default_max_tokens_fills_the_context(client, srv):
    resp = client.chat.completions.create(model="tiny", messages=[{"role": "user", "content": "w1"}],
                                          temperature=0, extra_body={"ignore_eos": True})
    assert resp.usage.total_tokens == srv.llm.runner.max_model_len
    assert resp.choices[0].finish_reason == "length"


def test_eos_ends_a_request_unless_ignored(srv, client, monkeypatch):
    kwargs = dict(model="tiny", prompt=[2, 7, 1], temperature=0)
    out = client.completions.create(max_tokens=8, extra_body={"return_token_ids": True, "ignore_eos": True},
                                    **kwargs).choices[0].model_extra["token_ids"]
    k = 4
    eos = out[k]
    k = out.index(eos)
    # random weights never pick the tokenizer's <eos>: make the token greedy decoding reaches the EOS
    monkeypatch.setattr(srv.llm, "eos_token_id", eos)
    resp = client.completions.create(max_tokens=8, extra_body={"return_token_ids": True}, **kwargs)
    assert resp.choices[0].finish_reason == "stop"
    assert resp.choices[0].model_extra["token_ids"] == out[:k + 1]      # EOS counted, not written
    assert resp.usage.completion_tokens == k + 1
    assert resp.choices[0].text.split() == [f"w{t}" for t in out[:k] if t < 510]
    resp = client.completions.create(max_tokens=8, extra_body={"ignore_eos": True}, **kwargs)
    assert resp.choices[0].finish_reason == "length" and resp.usage.completion_tokens == 8
