"""One choice's output text, built token by token and cut at the first stop string or stop token.

    ts = TextStream(tokenizer, prompt_ids, stop=["\\n\\n"], stop_token_ids=(), hold_back=True)
    ts.push([17, 42])          # -> text that may be sent now ('' while a stop string could still begin)
    ts.push([99], eos=True)    # the engine stopped on EOS: the EOS token is counted, not written
    ts.flush()                 # at the end: whatever was held back
    ts.stopped, ts.text, ts.token_ids

Decoding is incremental: with a fast tokenizer through the `tokenizers` library's DecodeStream (in
Rust, one call per token), otherwise by vLLM's scheme (each step decodes the tokens from `prefix` on
and keeps the part past the text of tokens [prefix, read)); either way a word split over several
tokens, or a multi-byte character, comes out once whole. The first output token is decoded after
the prompt's last tokens, so a leading space that depends on the context is right. A stop string is
not part of the text (OpenAI's rule); with `hold_back` (streaming) the last len(longest stop) - 1
characters wait until they cannot start one. Without `hold_back` (non-streaming) no text is handed out
before the output ends: a stop string completed by a later token may begin inside text an earlier one
made, and handed-out text cannot be taken back. Without stop strings and without `hold_back` nothing is
decoded before `flush`, which decodes the whole output once (after the same prompt tokens, so the text
equals the incremental one).
"""
from __future__ import annotations

# prompt tokens decoded before the first output token (vLLM's INITIAL_INCREMENTAL_DETOKENIZATION_OFFSET)
_CONTEXT_TOKENS = 5


class TextStream:
    def __init__(self, tokenizer, prompt_token_ids, stop=(), stop_token_ids=(), hold_back: bool = False):
        self.tokenizer = tokenizer
        self.stop = [s for s in stop]
        self.stop_token_ids = frozenset(stop_token_ids)
        # characters kept back until the output ends or they cannot start a stop string; None: all of them
        self.hold = (max(map(len, self.stop)) - 1 if self.stop else 0) if hold_back else None
        self.lazy = tokenizer is not None and not self.stop and not hold_back
        context = list(prompt_token_ids[-_CONTEXT_TOKENS:]) if tokenizer is not None else []
        self._ids = context
        self._prefix = 0
        self._read = len(context)
        self._num_context = len(context)
        self._stream, self._backend = _decode_stream(tokenizer, context) if not self.lazy else (None, None)
        self.text = ""
        self.token_ids: list[int] = []      # output tokens up to and including a stop token
        self.stopped = False                # a stop string or stop token ended the output
        self._sent = 0                      # characters of text handed out

    def push(self, token_ids, eos: bool = False) -> str:
        """Adds the next output tokens (eos: the last one is the EOS the engine stopped on); returns the
        text that may be sent now."""
        tok = self.tokenizer
        for k, t in enumerate(token_ids):
            if self.stopped:
                break
            self.token_ids.append(t)
            if t in self.stop_token_ids:
                self.stopped = True
                break
            if tok is None or (eos and k == len(token_ids) - 1):
                continue
            self._ids.append(t)
            if self.lazy:
                continue
            new = self._decode_next()
            if new:
                self.text += new
                if self.stop and self._cut_at_stop(len(new)):
                    break
        return self._ready(self.stopped)

    def flush(self) -> str:
        """The text not handed out yet (the output is over)."""
        if self.lazy:
            # decoded after the prompt's last tokens, as the incremental path does, so both give equal text
            decode, ids = self.tokenizer.decode, self._ids
            context = decode(ids[:self._num_context], skip_special_tokens=True)
            self.text = decode(ids, skip_special_tokens=True)[len(context):]
            self.lazy = False
        return self._ready(True)

    def _ready(self, final: bool) -> str:
        if final:
            end = len(self.text)
        else:
            end = self._sent if self.hold is None else max(self._sent, len(self.text) - self.hold)
        out = self.text[self._sent:end]
        self._sent = end
        return out

    def _decode_next(self) -> str:
        if self._stream is not None:
            return self._stream.step(self._backend, self._ids[-1]) or ""
        ids, decode = self._ids, self.tokenizer.decode
        prefix_text = decode(ids[self._prefix:self._read], skip_special_tokens=True)
        full = decode(ids[self._prefix:], skip_special_tokens=True)
        if len(full) > len(prefix_text) and not full.endswith("\ufffd"):
            self._prefix, self._read = self._read, len(ids)
            return full[len(prefix_text):]
        return ""

    def _cut_at_stop(self, num_new: int) -> bool:
        """Cuts text at the earliest stop string that ends in its last num_new characters."""
        text = self.text
        longest = max(map(len, self.stop))
        start = max(0, len(text) - num_new - longest + 1)
        hits = [i for i in (text.find(s, start) for s in self.stop) if i >= 0]
        if not hits:
            return False
        self.text = text[:min(hits)]
        self._sent = min(self._sent, len(self.text))
        self.stopped = True
        return True


def _decode_stream(tokenizer, context: list[int]):
    """(a tokenizers DecodeStream primed with the context, the Rust tokenizer), or (None, None) where the
    tokenizer is not a fast one or the library lacks it (then TextStream decodes vLLM's way)."""
    backend = getattr(tokenizer, "backend_tokenizer", None)
    if backend is None:
        return None, None
    try:
        from tokenizers.decoders import DecodeStream
        return DecodeStream(ids=list(context), skip_special_tokens=True), backend
    except (ImportError, TypeError):        # tokenizers < 0.22: no DecodeStream, or none taking a context
        return None, None
