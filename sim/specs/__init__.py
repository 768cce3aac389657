"""Published model dimensions and GPU datasheet rates (pure Python, no torch)."""
from sim.specs.capacity import num_kv_blocks
from sim.specs.hardware import HARDWARE_SPECS, HardwareSpec, get_hardware_spec
from sim.specs.models import MODEL_SPECS, ModelSpec, get_model_spec

__all__ = [
    "HARDWARE_SPECS", "HardwareSpec", "get_hardware_spec",
    "MODEL_SPECS", "ModelSpec", "get_model_spec",
    "num_kv_blocks",
]
