"""The GPU's current SM clock and clock-limit reasons, read through NVML (libnvidia-ml, which every NVIDIA driver
installs; no Python package needed), so a profile can record the clock each shape ran at.

    clock = GpuClock.open(torch.device("cuda:0"))   # None without a driver library or a CUDA device
    clock.sm_mhz()                                    # e.g. 1980 (MHz, the instant it is read)
    clock.power_capped()                              # True while the driver holds the clock down for power

Why: a tight loop of large prefill steps draws an H200 into its power cap (the full profile grid averaged
515 W, its SM clock 1,770-1,980 MHz, capped 35% of the time), while a serving loop at the same shapes runs at
250-380 W and 1,980 MHz; timed under the cap, compute-bound rows come out a few percent slower than the same
shapes in a run.
"""
from __future__ import annotations

import ctypes

NVML_CLOCK_SM = 1
# nvmlClocksEventReasons: software power cap, hardware slowdown, hardware power brake, software thermal slowdown
POWER_OR_THERMAL_REASONS = 0x4 | 0x8 | 0x80 | 0x20


class GpuClock:
    def __init__(self, lib, handle):
        self._lib, self._handle = lib, handle

    @classmethod
    def open(cls, device) -> "GpuClock | None":
        """The clock of a torch CUDA device (matched by UUID, so CUDA_VISIBLE_DEVICES does not matter), or None
        where NVML or the device is unavailable (CPU runs, containers without the driver library)."""
        if getattr(device, "type", None) != "cuda":
            return None
        try:
            import torch
            lib = ctypes.CDLL("libnvidia-ml.so.1")
            if lib.nvmlInit_v2() != 0:
                return None
            uuid = str(torch.cuda.get_device_properties(device).uuid)
            handle = ctypes.c_void_p()
            name = (uuid if uuid.startswith("GPU-") else f"GPU-{uuid}").encode()
            if lib.nvmlDeviceGetHandleByUUID(ctypes.c_char_p(name), ctypes.byref(handle)) != 0:
                return None
            return cls(lib, handle)
        except (OSError, AttributeError, RuntimeError):
            return None

    def sm_mhz(self) -> float:
        """The SM clock now (MHz); NaN if NVML refuses."""
        v = ctypes.c_uint()
        ok = self._lib.nvmlDeviceGetClockInfo(self._handle, NVML_CLOCK_SM, ctypes.byref(v)) == 0
        return float(v.value) if ok else float("nan")

    def power_capped(self) -> bool:
        """Whether a power or thermal limit holds the clock down now."""
        v = ctypes.c_ulonglong()
        # the older drivers' name for the same call
        fn = getattr(self._lib, "nvmlDeviceGetCurrentClocksEventReasons", None) \
            or getattr(self._lib, "nvmlDeviceGetCurrentClocksThrottleReasons", None)
        if fn is None or fn(self._handle, ctypes.byref(v)) != 0:
            return False
        return bool(v.value & POWER_OR_THERMAL_REASONS)
