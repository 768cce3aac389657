"""A byte-level tokenizer that covers any text, for clients that make their prompts from real words (load generators).

    make_byte_tokenizer(path)       # tokenizer.json etc. in path: one token per UTF-8 byte (ids 0-255), "<eos>" = 256
    make_byte_tokenizer(path, vocab_size=151936)     # ids 257.. decode too (to 2-3 bytes each): a model's whole vocab

The tiny word-level test tokenizer (tests/engine/tiny_model.py) maps every English word to <unk>; a load generator
that cuts generated text to N tokens then has nothing left to send. Here every string round-trips and N tokens are
N bytes, so prompt lengths stay what the load generator asked for. No merges, no download. With vocab_size, the ids
past the bytes are filler tokens (byte pairs, then triples) that encoding never produces but decoding accepts, so a
server can detokenize whatever a random-weight model of that vocabulary samples.
"""
from __future__ import annotations

from pathlib import Path


def make_byte_tokenizer(path: str | Path, vocab_size: int | None = None):
    from itertools import product

    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    alphabet = sorted(pre_tokenizers.ByteLevel.alphabet(), key=ord)     # the 256 printable stand-ins for bytes
    vocab = {ch: i for i, ch in enumerate(alphabet)}
    vocab["<eos>"] = len(vocab)
    if vocab_size is not None:
        if vocab_size < len(vocab):
            raise ValueError(f"vocab_size must be >= {len(vocab)} (the bytes and <eos>), got {vocab_size}")
        fillers = ("".join(t) for n in (2, 3) for t in product(alphabet, repeat=n))
        for token in fillers:
            if len(vocab) >= vocab_size:
                break
            vocab[token] = len(vocab)
    tok = Tokenizer(models.BPE(vocab=vocab, merges=[], unk_token=None))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    tok.decoder = decoders.ByteLevel()
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<eos>")
    fast.save_pretrained(str(path))
    return fast
