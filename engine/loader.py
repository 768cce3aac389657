"""Loads a Hugging Face safetensors checkpoint into one of our models.

Accepts a directory with config.json and either one `*.safetensors` file, several, or shards listed
in `model.safetensors.index.json`. Checkpoint projections that the model packs (q/k/v -> qkv_proj,
gate/up -> gate_up_proj; see the model's `packed_modules`) are written into their row range of the
packed weight. With tied embeddings the LM head is the embedding, so a checkpoint `lm_head.weight`
is not needed (and ignored if present). Every model parameter must be filled exactly once; anything
missing, unknown or mis-shaped raises a ValueError naming the tensor, and a truncated or corrupt
file a ValueError naming the file.

Tensor parallel: a module with `checkpoint_shape(param, shard)` / `load(param, tensor, shard)`
(engine/layers/linear.py, engine/layers/embed_head.py) is checked against the full checkpoint
shape and copies only its rank's slice; every rank reads the whole checkpoint.
"""
from __future__ import annotations

import json
from pathlib import Path

import torch
from safetensors import safe_open
from torch import nn

# Checkpoint tensors that carry no weights of ours (old checkpoints saved the rope frequencies).
_IGNORED_SUFFIXES = ("rotary_emb.inv_freq",)


def checkpoint_files(model_path: str | Path) -> list[Path]:
    """The safetensors files of a checkpoint directory, in a stable order."""
    root = Path(model_path)
    if not root.is_dir():
        raise FileNotFoundError(f"checkpoint directory {str(root)!r} does not exist")
    index = root / "model.safetensors.index.json"
    if index.is_file():
        with open(index) as f:
            names = sorted(set(json.load(f)["weight_map"].values()))
        missing = [n for n in names if not (root / n).is_file()]
        if missing:
            raise FileNotFoundError(f"{index} lists shard(s) {missing} that are not in {str(root)!r}; "
                                    f"download the complete checkpoint")
        return [root / n for n in names]
    files = sorted(root.glob("*.safetensors"))
    if not files:
        found = sorted(p.name for p in root.iterdir())[:10]
        raise FileNotFoundError(f"no *.safetensors file in {str(root)!r} (found {found}); save the checkpoint with "
                                f"save_pretrained(..., safe_serialization=True) or convert .bin weights to safetensors")
    return files


def _open_checkpoint(path: Path):
    """safe_open, with a damaged file (truncated download, not safetensors) named in a ValueError."""
    try:
        return safe_open(str(path), framework="pt", device="cpu")
    except Exception as e:          # safetensors raises its own SafetensorError (an Exception subclass)
        size = path.stat().st_size if path.exists() else 0
        raise ValueError(f"checkpoint file {str(path)!r} ({size:,} bytes) is not a readable safetensors file ({e}); "
                         "it is truncated or corrupt (an interrupted download?): download it again") from None


def _target(model: nn.Module, name: str) -> tuple[str, int | None]:
    """Checkpoint tensor name -> (our parameter name, shard index or None when not packed)."""
    for ckpt_proj, (packed, shard) in getattr(model, "packed_modules", {}).items():
        if f".{ckpt_proj}." in name:
            return name.replace(f".{ckpt_proj}.", f".{packed}."), shard
    return name, None


@torch.no_grad()
def load_weights(model: nn.Module, model_path: str | Path) -> None:
    """Fills every parameter of `model` from the checkpoint at `model_path` (cast to the parameter's dtype/device)."""
    params = dict(model.named_parameters())       # tied lm_head.weight is deduplicated away
    modules = dict(model.named_modules())
    tied = bool(getattr(getattr(model, "config", None), "tie_word_embeddings", False))
    loaded: set[tuple[str, int | None]] = set()
    unexpected: list[str] = []
    for path in checkpoint_files(model_path):
        with _open_checkpoint(path) as f:
            for name in f.keys():
                if name.endswith(_IGNORED_SUFFIXES) or (tied and name == "lm_head.weight"):
                    continue
                target, shard = _target(model, name)
                if target not in params:
                    unexpected.append(name)
                    continue
                module_name, pname = target.rsplit(".", 1)
                module = modules[module_name]
                tensor = f.get_tensor(name)
                sharded = hasattr(module, "checkpoint_shape")
                expected = module.checkpoint_shape(pname, shard) if sharded else tuple(params[target].shape)
                if tuple(tensor.shape) != tuple(expected):
                    raise ValueError(f"checkpoint tensor {name!r} in {path.name} has shape {tuple(tensor.shape)} but "
                                     f"the model expects {tuple(expected)}; config.json does not match the weights "
                                     f"(check hidden_size, head_dim, num_*_heads, intermediate_size, vocab_size)")
                if (target, shard) in loaded:
                    raise ValueError(f"checkpoint tensor {name!r} appears twice (again in {path.name}); "
                                     f"the shards overlap, re-download the checkpoint")
                if sharded:
                    module.load(pname, tensor, shard)
                else:
                    params[target].data.copy_(tensor)
                loaded.add((target, shard))
    if unexpected:
        raise ValueError(f"checkpoint has {len(unexpected)} tensor(s) this {type(model).__name__} does not use, e.g. "
                         f"{unexpected[:5]}; the checkpoint does not match config.json's architecture")
    missing = []
    for pname in params:
        module = modules[pname.rsplit(".", 1)[0]]
        shards = range(len(module.full_sizes)) if getattr(module, "packed", False) else [None]
        missing += [(pname, s) for s in shards if (pname, s) not in loaded]
    if missing:
        names = [_checkpoint_name(model, p, s) for p, s in missing]
        hint = (" (config.json says tie_word_embeddings=false but the checkpoint has no lm_head.weight; "
                "set tie_word_embeddings=true if the head shares the embedding)") if "lm_head.weight" in names else ""
        raise ValueError(f"checkpoint at {str(model_path)!r} lacks {len(names)} tensor(s) the model needs, e.g. "
                         f"{names[:5]}{hint}; the checkpoint is incomplete or has fewer layers than config.json says")


def _checkpoint_name(model: nn.Module, pname: str, shard: int | None) -> str:
    """Inverse of _target: the checkpoint name that fills shard `shard` of parameter `pname`."""
    if shard is None:
        return pname
    for ckpt_proj, (packed, s) in model.packed_modules.items():
        if s == shard and f".{packed}." in pname:
            return pname.replace(f".{packed}.", f".{ckpt_proj}.")
    return f"{pname}[shard {shard}]"


def build_model(model_path: str | Path, device: torch.device | str, dtype: torch.dtype, attn_backend,
                hf_config: dict | None = None, tp_rank: int = 0, tp_size: int = 1,
                fused_qk_norm_rope_store: bool = False) -> nn.Module:
    """Constructs the architecture named in config.json on `device` in `dtype` (rank tp_rank's shards
    of it when tp_size > 1) and loads its weights. fused_qk_norm_rope_store: engine/models/decoder.py."""
    from engine.models import get_model_class, load_hf_config

    hf_config = hf_config if hf_config is not None else load_hf_config(model_path)
    cls = get_model_class(hf_config)
    cfg = cls.config_class.from_hf(hf_config)
    prev_dtype = torch.get_default_dtype()
    torch.set_default_dtype(dtype)           # parameters are created directly in the serving dtype
    try:
        with torch.device(device):
            model = cls(cfg, attn_backend, tp_rank=tp_rank, tp_size=tp_size,
                        fused_qk_norm_rope_store=fused_qk_norm_rope_store)
    finally:
        torch.set_default_dtype(prev_dtype)
    load_weights(model, model_path)
    return model.eval().requires_grad_(False)
