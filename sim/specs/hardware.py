"""GPU rates the cost models divide by: datasheet peaks plus, where we measured them, real ceilings.

Units: TFLOP/s = 1e12 FLOP/s; every `_gbps` field is GB/s = 1e9 bytes/s (bytes,
not bits), per GPU and per direction. `memory_gib` is what `nvidia-smi` reports
as total memory (MiB / 1024), not the marketing "GB".

`interconnect_gbps` is the GPU-to-GPU bandwidth a ring all-reduce sees per
direction (NVLink: half the bidirectional datasheet figure; PCIe-only cards:
the PCIe link). `host_link_gbps` is the CPU<->GPU link used by KV swapping (and the prefix cache's CPU tier).
`host_memory_gib` is the host memory per GPU (the node's RAM over its GPUs), the
ceiling of swap space plus CPU tier; None where no node is assumed (unchecked).
"""
from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class HardwareSpec:
    name: str
    peak_bf16_tflops: float          # dense (no sparsity) bf16 tensor-core peak
    hbm_bandwidth_gbps: float        # device memory bandwidth
    memory_gib: float                # device memory
    host_link_gbps: float            # PCIe / C2C, per direction
    interconnect_gbps: float         # NVLink (or PCIe peer) per direction, for tensor-parallel all-reduce
    source: str
    measured_matmul_tflops: float | None = None   # bf16 8192^3 matmul measured on this card
    measured_copy_gbps: float | None = None       # device-to-device copy, bytes read + written per second
    # Latency floors inside a CUDA graph (benchmarks/gpu_floor.py), for RooflineCostModel(latency_floors=True):
    measured_gemm_floor_us: float | None = None     # per small dependent matmul (weight read far below it)
    measured_kernel_floor_us: float | None = None   # per small dependent elementwise kernel
    measured_step_sync_us: float | None = None      # graph launch + synchronize + reading one value back
    host_memory_gib: float | None = None            # host RAM per GPU of the node (swap space + CPU tier)

    def __post_init__(self):
        for f in ("peak_bf16_tflops", "hbm_bandwidth_gbps", "memory_gib", "host_link_gbps", "interconnect_gbps"):
            v = getattr(self, f)
            if not v > 0:
                raise ValueError(f"HardwareSpec {self.name!r}: {f} must be > 0, got {v!r}")
        for f in ("measured_matmul_tflops", "measured_copy_gbps", "measured_gemm_floor_us", "measured_kernel_floor_us",
                  "measured_step_sync_us", "host_memory_gib"):
            v = getattr(self, f)
            if v is not None and not v > 0:
                raise ValueError(f"HardwareSpec {self.name!r}: {f} must be > 0 or None, got {v!r}")

    def flops_per_s(self, use_measured: bool = True) -> float:
        """Matmul ceiling: the measured one when recorded (and asked for), else the datasheet peak."""
        if use_measured and self.measured_matmul_tflops is not None:
            return self.measured_matmul_tflops * 1e12
        return self.peak_bf16_tflops * 1e12

    def bytes_per_s(self, use_measured: bool = True) -> float:
        """Memory ceiling: the measured copy rate when recorded (and asked for), else the datasheet peak."""
        if use_measured and self.measured_copy_gbps is not None:
            return self.measured_copy_gbps * 1e9
        return self.hbm_bandwidth_gbps * 1e9

    @property
    def latency_floors_s(self) -> tuple[float, float, float] | None:
        """(GEMM floor, elementwise-kernel floor, launch + sync) in seconds, None unless all three are measured."""
        floors = (self.measured_gemm_floor_us, self.measured_kernel_floor_us, self.measured_step_sync_us)
        return None if None in floors else tuple(v * 1e-6 for v in floors)

    @property
    def memory_bytes(self) -> int:
        return int(self.memory_gib * 2**30)


HARDWARE_SPECS: dict[str, HardwareSpec] = {s.name: s for s in (
    HardwareSpec(
        name="H200", peak_bf16_tflops=989.0, hbm_bandwidth_gbps=4800.0, memory_gib=143771 / 1024,
        host_link_gbps=64.0, interconnect_gbps=450.0,
        measured_matmul_tflops=793.0, measured_copy_gbps=4260.0,
        measured_gemm_floor_us=4.33, measured_kernel_floor_us=0.81, measured_step_sync_us=11.5,
        host_memory_gib=256.0,
        source=("NVIDIA H200 Tensor Core GPU datasheet (SXM): 1979 TFLOPS bf16 with sparsity -> 989 dense, "
                "4.8 TB/s HBM3e, 141 GB (nvidia-smi: 143771 MiB), NVLink 900 GB/s bidirectional, PCIe Gen5 "
                "128 GB/s bidirectional; measured on an H200 SXM: bf16 8192^3 torch.matmul 793 TFLOP/s, "
                "device-to-device copy 4.26 TB/s; in a CUDA graph 4.33 us per [1,1024]x[1024,1024] bf16 matmul, "
                "0.81 us per [1024] elementwise kernel, 11.5 us per launch + sync + readback "
                "(benchmarks/results/gpu_floor_h200.json); host memory: DGX H200 datasheet, 2 TB system memory "
                "for 8 GPUs -> 256 GiB per GPU"),
    ),
    HardwareSpec(
        name="H100-SXM", peak_bf16_tflops=989.0, hbm_bandwidth_gbps=3350.0, memory_gib=81559 / 1024,
        host_link_gbps=64.0, interconnect_gbps=450.0,
        source=("NVIDIA H100 Tensor Core GPU datasheet (SXM5): 1979 TFLOPS bf16 with sparsity -> 989 dense, "
                "3.35 TB/s HBM3, 80 GB (nvidia-smi: 81559 MiB), NVLink 900 GB/s bidirectional, PCIe Gen5 "
                "128 GB/s bidirectional"),
    ),
    HardwareSpec(
        name="A100-80GB", peak_bf16_tflops=312.0, hbm_bandwidth_gbps=2039.0, memory_gib=80.0,
        host_link_gbps=32.0, interconnect_gbps=300.0,
        source=("NVIDIA A100 Tensor Core GPU datasheet (80GB SXM): 312 TFLOPS bf16 dense, 2039 GB/s HBM2e, "
                "80 GB (nvidia-smi: 81920 MiB), NVLink 600 GB/s bidirectional, PCIe Gen4 64 GB/s bidirectional"),
    ),
    HardwareSpec(
        name="L40S", peak_bf16_tflops=362.05, hbm_bandwidth_gbps=864.0, memory_gib=46068 / 1024,
        host_link_gbps=32.0, interconnect_gbps=32.0,
        source=("NVIDIA L40S datasheet: 733 TFLOPS bf16 with sparsity -> 362.05 dense, 864 GB/s GDDR6, "
                "48 GB (nvidia-smi: 46068 MiB), PCIe Gen4 x16 64 GB/s bidirectional, no NVLink "
                "(tensor-parallel traffic goes over PCIe)"),
    ),
)}


def _key(name: str) -> str:
    return name.lower().replace("-", "").replace("_", "").replace(" ", "")


_ALIASES = {_key(n): n for n in HARDWARE_SPECS}
_ALIASES.update({"h200sxm": "H200", "h100": "H100-SXM", "h100sxm5": "H100-SXM", "a100": "A100-80GB",
                 "a10080g": "A100-80GB", "a100sxm80gb": "A100-80GB"})


def get_hardware_spec(name: str) -> HardwareSpec:
    """Spec by name (case-insensitive; `h200`, `H100_SXM`, `a100_80gb`, `l40s` all work)."""
    full = _ALIASES.get(_key(str(name)))
    if full is None:
        raise ValueError(f"unknown hardware {name!r}; known hardware: {sorted(HARDWARE_SPECS)} "
                         f"(or construct a HardwareSpec with your card's rates)")
    return HARDWARE_SPECS[full]


def hardware_for_device_name(device_name: str | None) -> HardwareSpec | None:
    """The spec of a CUDA device as torch names it ("NVIDIA H100 80GB HBM3" -> H100-SXM), None if unknown."""
    name = (device_name or "").upper()
    for marker, spec in (("H200", "H200"), ("H100", "H100-SXM"), ("A100", "A100-80GB"), ("L40S", "L40S")):
        if marker in name:
            return HARDWARE_SPECS[spec]
    return None
