"""The Triton and torch.compile compilations begun while a block of code runs.

A Triton kernel compiles the first time the process launches it with a new specialization: argument dtypes,
constexprs, pointer alignment and the value class (== 1, divisible by 16, other) of every integer argument not
marked do_not_specialize. A compile inside a timed run stalls the step that launches it: milliseconds when
Triton's disk cache holds the binary, 0.1-1 s when it does not (a fresh machine). Benchmarks wrap their timed
runs in a CompileLog and record what compiled; a steady run compiles nothing. torch.compile'd functions
(engine/layers/fused.py, dynamic shapes) compile again when a guard fails, e.g. for a first dimension of 1;
those are counted from torch._dynamo's frame counter; the Inductor kernels such a compile makes count with it,
not one by one (newer torch calls Triton's post-compile hook for them with no cache hook before: ignored here).
Triton's hooks fire for a load from its disk cache as for a fresh compile; the seconds tell them apart.
"""
from __future__ import annotations

import sys
import time


class CompileLog:
    """Context manager: `events` lists (kernel name, seconds) for each Triton compile begun inside the block,
    `supported` says whether this Triton has the hooks (knobs.runtime.jit_cache_hook and jit_post_compile_hook;
    without them no Triton compile is recorded), `torch_compiles` counts torch.compile's frame compiles (None
    where torch._dynamo was never imported). Hooks installed before are kept and called first."""

    def __init__(self):
        self.events: list[tuple[str, float]] = []
        self.supported = False
        self.torch_compiles: int | None = None
        self._open: list[tuple[str, float]] = []       # compiles begun, not yet finished (name, start time)
        self._saved = None
        self._frames_before: int | None = None

    def __enter__(self) -> "CompileLog":
        self._frames_before = _dynamo_frames()
        try:
            from triton import knobs
            runtime = knobs.runtime
            saved = (runtime.jit_cache_hook, runtime.jit_post_compile_hook)
        except (ImportError, AttributeError):
            return self
        self.supported, self._saved, self._runtime = True, saved, runtime
        before, after = saved

        def on_compile(*args, **kwargs):
            # A true answer from this hook makes Triton skip the compile: pass on only the earlier hook's.
            skip = before(*args, **kwargs) if before is not None else False
            if not skip:
                self._open.append((_kernel_name(kwargs), time.perf_counter()))
            return skip

        def on_compiled(*args, **kwargs):
            if after is not None:
                after(*args, **kwargs)
            if self._open:      # else an Inductor kernel's (module docstring)
                name, start = self._open.pop()
                self.events.append((name, time.perf_counter() - start))

        runtime.jit_cache_hook, runtime.jit_post_compile_hook = on_compile, on_compiled
        return self

    def __exit__(self, *exc) -> None:
        frames = _dynamo_frames()
        if frames is not None:
            self.torch_compiles = frames - (self._frames_before or 0)
        if self._saved is not None:
            self._runtime.jit_cache_hook, self._runtime.jit_post_compile_hook = self._saved
            self._saved = None

    def summary(self) -> dict:
        """For a result file: the number of Triton compiles, their seconds and kernel names in order (None where
        this Triton cannot tell), and torch.compile's frame compiles."""
        if not self.supported:
            triton = dict(triton_compiles=None, triton_compile_s=None, triton_compiled_kernels=None)
        else:
            triton = dict(triton_compiles=len(self.events), triton_compile_s=sum(s for _, s in self.events),
                          triton_compiled_kernels=[name for name, _ in self.events])
        return dict(triton, torch_compiles=self.torch_compiles)


def _dynamo_frames() -> int | None:
    """torch.compile's count of frames compiled in this process so far; None where it was never imported."""
    utils = sys.modules.get("torch._dynamo.utils")
    return None if utils is None else utils.counters["frames"]["ok"]


def _kernel_name(hook_kwargs: dict) -> str:
    fn = hook_kwargs.get("fn")
    name = getattr(fn, "name", None)
    if name:
        return str(name)
    return str(hook_kwargs.get("repr", "?")).split("[", 1)[0]
