"""A checkpoint's config.json (torch-free: the simulator's roofline model reads it too)."""
from __future__ import annotations

import json
from pathlib import Path


def load_hf_config(model_path: str | Path) -> dict:
    """Reads <model_path>/config.json."""
    path = Path(model_path).expanduser() / "config.json"
    if not path.is_file():
        raise FileNotFoundError(f"no config.json in {str(model_path)!r}; pass a Hugging Face checkpoint directory "
                                f"(config.json + *.safetensors)")
    with open(path) as f:
        return json.load(f)
