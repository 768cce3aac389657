"""A byte-level tokenizer that covers any text, for clients that make their prompts from real words (load generators).

    make_byte_tokenizer(path)       # tokenizer.json etc. in path: one token per UTF-8 byte (ids 0-255), "<eos>" = 256

The tiny word-level test tokenizer (tests/engine/tiny_model.py) maps every English word to <unk>; a load generator
that cuts generated text to N tokens then has nothing left to send. Here every string round-trips and N tokens are
N bytes, so prompt lengths stay what the load generator asked for. No merges, no download.
"""
from __future__ import annotations

from pathlib import Path


def make_byte_tokenizer(path: str | Path):
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    alphabet = pre_tokenizers.ByteLevel.alphabet()          # the 256 printable stand-ins for bytes
    vocab = {ch: i for i, ch in enumerate(sorted(alphabet, key=lambda c: ord(c)))}
    vocab["<eos>"] = len(vocab)
    tok = Tokenizer(models.BPE(vocab=vocab, merges=[], unk_token=None))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    tok.decoder = decoders.ByteLevel()
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<eos>")
    fast.save_pretrained(str(path))
    return fast
