"""Tiny random checkpoints (Qwen3, Qwen2, Llama) that run on a CPU in seconds: for tests, and to try servelab-serve
and `servelab backend=http` without a GPU or a download.

    python -m experiments.tiny_checkpoint ~/models/tiny        # Qwen3, 512-token word vocabulary, chat template
    servelab-serve backend.model_path=~/models/tiny backend.device=cpu num_kvcache_blocks=256 max_model_len=256
    servelab backend=http backend.url=http://127.0.0.1:8000 model.vocab_size=512 max_model_len=256

The tokenizer is word-level: "w0".."w509" (text is those words separated by spaces), "<unk>" = 510, "<eos>" = 511;
the chat template joins the messages' contents and appends "w9". The weights are random: the text is noise, the
serving path (scheduling, KV cache, streaming, usage, metrics) is the real one.

The default initializer (std 0.02) gives nearly flat logits, so greedy choices would hinge on
float rounding and two correct implementations could disagree. We redraw the embedding with std 1
and the LM head with std 0.5: after the final RMSNorm the hidden state has unit RMS, so each logit
is a sum of `hidden_size` terms with std 0.5, giving logits of std ~4 over the vocabulary, and the
top-2 gap at a position is typically far above float32 rounding (~1e-5). Projection weights get
std 0.1 so the layers change the residual stream visibly.
"""
from __future__ import annotations

import sys
from pathlib import Path

TINY = dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
            num_key_value_heads=2, head_dim=16, vocab_size=512, max_position_embeddings=1024,
            rms_norm_eps=1e-6, rope_theta=10000.0)


# Llama 3.1's RoPE scaling, with an original context short enough that all three frequency bands
# (kept, blended, divided) occur at head_dim 16.
LLAMA3_ROPE = {"rope_type": "llama3", "rope_theta": 10000.0, "factor": 8.0, "low_freq_factor": 1.0,
               "high_freq_factor": 4.0, "original_max_position_embeddings": 64}
ARCHITECTURES = ("qwen3", "qwen2", "llama")

CHAT_TEMPLATE = ("{% for m in messages %}{{ m['content'] }} {% endfor %}"
                 "{% if add_generation_prompt %}w9{% endif %}")


def make_tiny_checkpoint(path: str | Path, arch: str = "qwen3", *, tie_word_embeddings: bool = False, seed: int = 0,
                         max_shard_size: str | None = None, **overrides):
    """Saves config.json + safetensors weights of a tiny `arch` model into `path`; returns the transformers
    model (float32, eval). llama gets Llama 3 RoPE scaling unless `rope_parameters` is overridden."""
    import torch
    import transformers

    config_cls, model_cls = {"qwen3": ("Qwen3Config", "Qwen3ForCausalLM"),
                             "qwen2": ("Qwen2Config", "Qwen2ForCausalLM"),
                             "llama": ("LlamaConfig", "LlamaForCausalLM")}[arch]
    fields = {**TINY, **overrides}
    if arch == "llama":
        fields.setdefault("rope_parameters", dict(LLAMA3_ROPE))
        fields.pop("rope_theta", None)
    cfg = getattr(transformers, config_cls)(**fields, tie_word_embeddings=tie_word_embeddings, bos_token_id=None,
                                            eos_token_id=None, pad_token_id=None)
    torch.manual_seed(seed)
    model = getattr(transformers, model_cls)(cfg).float().eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("norm.weight"):
                p.copy_(1.0 + 0.1 * torch.randn_like(p))   # not exactly 1, so a skipped norm weight shows
            elif "embed_tokens" in name:
                p.normal_(0.0, 1.0)
            elif name == "lm_head.weight":
                p.normal_(0.0, 0.5)
            else:
                p.normal_(0.0, 0.1)
    kwargs = {"safe_serialization": True}
    if max_shard_size is not None:
        kwargs["max_shard_size"] = max_shard_size
    model.save_pretrained(str(path), **kwargs)
    return model


def make_tiny_qwen3(path: str | Path, **kwargs):
    return make_tiny_checkpoint(path, "qwen3", **kwargs)


def make_tiny_tokenizer(path: str | Path, vocab_size: int = TINY["vocab_size"]):
    """Saves a whitespace word-level tokenizer: "w0".."w{V-3}", "<unk>" = V-2, "<eos>" = V-1."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {f"w{i}": i for i in range(vocab_size - 2)}
    vocab["<unk>"], vocab["<eos>"] = vocab_size - 2, vocab_size - 1
    tok = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tok.decoder = decoders.WordPiece()      # joins words with spaces
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="<unk>", eos_token="<eos>")
    fast.save_pretrained(str(path))
    return fast


def make_serving_checkpoint(path: str | Path) -> str:
    """A tiny Qwen3 checkpoint with the word-level tokenizer and CHAT_TEMPLATE: what servelab-serve's tests serve."""
    make_tiny_qwen3(path)
    tok = make_tiny_tokenizer(path)
    tok.chat_template = CHAT_TEMPLATE
    tok.save_pretrained(str(path))
    return str(path)


USAGE = """usage: python -m experiments.tiny_checkpoint DIR

Writes a tiny random Qwen3 checkpoint (config.json, safetensors, a 512-word tokenizer, a chat template) into DIR,
for servelab-serve on a CPU (backend.device=cpu)."""


def main(argv: list[str] | None = None) -> None:
    from experiments.user_errors import fail

    args = list(sys.argv[1:] if argv is None else argv)
    if "-h" in args or "--help" in args:
        print(USAGE)
        return
    options = [a for a in args if a.startswith("-")]
    if options:
        fail(f"unknown option {options[0]} (this command takes no options); give one folder to write the checkpoint "
             "into: python -m experiments.tiny_checkpoint DIR")
    if len(args) != 1:
        fail("give one folder to write the checkpoint into: python -m experiments.tiny_checkpoint DIR")
    path = Path(args[0]).expanduser()
    if path.exists() and (not path.is_dir() or any(path.iterdir())):
        fail(f"{path} exists and is not an empty folder; give a new folder (the checkpoint's files would mix "
             "with what is there)")
    try:
        import tokenizers  # noqa: F401
        import torch  # noqa: F401
        import transformers  # noqa: F401
    except ModuleNotFoundError as e:
        fail(f"the tiny checkpoint needs the engine extra ({e.name} is not installed): pip install -e '.[engine]'")
    path.mkdir(parents=True, exist_ok=True)
    make_serving_checkpoint(path)
    print(f"wrote {path}; serve it on a CPU with:\n  servelab-serve backend.model_path={path} backend.device=cpu "
          "num_kvcache_blocks=256 max_model_len=256")


if __name__ == "__main__":
    main()
