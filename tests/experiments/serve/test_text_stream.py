"""TextStream: incremental text equals a whole decode; stop strings cut it, also across tokens, and are never sent."""
from __future__ import annotations

import pytest

pytest.importorskip("transformers")

from experiments.serve.text_stream import TextStream  # noqa: E402


@pytest.fixture(scope="module")
def tok(tmp_path_factory):
    from tests.engine.tiny_model import make_tiny_tokenizer
    return make_tiny_tokenizer(tmp_path_factory.mktemp("tok"))


def words(*ids):
    return " " + " ".join(f"w{i}" for i in ids)


def stream_all(ts, ids, eos=False):
    pieces = [ts.push([t], eos=eos and k == len(ids) - 1) for k, t in enumerate(ids)]
    pieces.append(ts.flush())
    return pieces


def test_incremental_and_whole_decodes_agree(tok):
    ids = [5, 1, 2, 3, 510, 4]          # 510 = <unk>, a special token: left out of the text
    fast = TextStream(tok, [9, 9], hold_back=True)
    assert fast._stream is not None     # the tokenizers library's DecodeStream
    slow = TextStream(tok, [9, 9], hold_back=True)
    slow._stream = None                 # vLLM's two-decode scheme, for tokenizers without it
    lazy = TextStream(tok, [9, 9])
    assert lazy.lazy and lazy.push(ids) == ""
    assert "".join(stream_all(fast, ids)) == "".join(stream_all(slow, ids)) == lazy.flush() == words(5, 1, 2, 3, 4)


def test_a_stop_string_spanning_tokens_is_cut_and_never_sent(tok):
    ts = TextStream(tok, [9], stop=["w1 w2"], hold_back=True)
    pieces = stream_all(ts, [5, 1, 2, 3])
    assert "".join(pieces) == " w5 " and ts.text == " w5 "
    assert ts.stopped and ts.token_ids == [5, 1, 2]      # w3 came after the stop: not taken
    assert not any("w1" in p for p in pieces)


def test_the_earliest_of_several_stop_strings_wins(tok):
    ts = TextStream(tok, [9], stop=["w3", "w1"])
    assert ts.push([5, 1, 2, 3]) + ts.flush() == " w5 " and ts.stopped


def test_no_stop_string_nothing_held_back_at_the_end(tok):
    ts = TextStream(tok, [9], stop=["w77 w78"], hold_back=True)
    pieces = stream_all(ts, [5, 6, 77])
    assert "".join(pieces) == words(5, 6, 77) and not ts.stopped


def test_eos_is_counted_but_not_written(tok):
    ts = TextStream(tok, [9], hold_back=True)
    assert "".join(stream_all(ts, [5, 6, 7], eos=True)) == words(5, 6)
    assert ts.token_ids == [5, 6, 7] and not ts.stopped


def test_a_stop_token_ends_the_output(tok):
    ts = TextStream(tok, [9], stop_token_ids=[6])
    text = ts.push([5, 6, 7]) + ts.flush()
    assert ts.stopped and ts.token_ids == [5, 6] and text == words(5)


def test_without_a_tokenizer_tokens_are_counted_and_the_text_is_empty():
    ts = TextStream(None, [1, 2], stop=["x"], hold_back=True)
    assert ts.push([3, 4]) == "" and ts.flush() == "" and ts.token_ids == [3, 4]


@pytest.mark.parametrize("stop,expected", [("5 w1", " w"), ("w5 w", " "), ("w1 w", " w5 ")])
def test_without_hold_back_no_text_leaves_before_the_end(tok, stop, expected):
    """Non-streaming: a stop string that begins inside an earlier token's text and ends in a later one is cut from
    what the response gets (the pieces pushed out), as in streaming, not only from ts.text."""
    streamed = TextStream(tok, [9], stop=[stop], hold_back=True)
    whole = TextStream(tok, [9], stop=[stop])
    s_pieces, w_pieces = stream_all(streamed, [5, 1, 2]), stream_all(whole, [5, 1, 2])
    assert "".join(w_pieces) == "".join(s_pieces) == whole.text == expected and whole.stopped
    assert w_pieces[0] == ""            # the first token's text waited: a later one could start a stop string in it
