"""Triton compiles a kernel again for every new value class (== 1, divisible by 16, other) of an integer argument
not marked do_not_specialize. An argument that changes from step to step must be marked, or a run compiles
mid-step (engine/kernels/compile_log.py). The launched kernels' other arguments are listed here as fixed for a
run (strides of fixed layouts, the vocabulary size, float scales, which Triton never specializes)."""
import importlib
import inspect
import os
import pkgutil

os.environ.setdefault("TRITON_INTERPRET", "1")   # before triton is first imported

import engine.kernels as kernels_pkg
from engine.kernels.compile_log import CompileLog

FIXED_FOR_A_RUN = {
    "_decode_split_kernel": {"qk_scale", "stride_qb", "stride_qh", "stride_cb", "stride_cs", "stride_ch",
                             "stride_ob", "stride_oh"},
    "_decode_reduce_kernel": {"stride_ob", "stride_oh"},
    "_prefill_kernel": {"qk_scale", "stride_qt", "stride_qh", "stride_cb", "stride_cs", "stride_ch", "stride_ot",
                        "stride_oh"},
    "_qk_norm_rope_store_kernel": {"stride_qkv_t", "table_stride", "eps"},
    "_race_argmax_kernel": {"V", "stride_l", "stride_n"},
    "_store_kvcache_kernel": {"stride_kt", "stride_kh", "stride_vt", "stride_vh"},
    "_resolve_kernel": set(),
}


def _launched_kernels():
    """{name: (python function, do_not_specialize)} of every launched kernel, compiled or interpreted."""
    import triton
    found = {}
    for info in pkgutil.iter_modules(kernels_pkg.__path__):
        module = importlib.import_module(f"engine.kernels.{info.name}")
        for name, obj in vars(module).items():
            # kernels are launched as `name[grid](...)`; helpers (inlined into them) have other names
            fn = getattr(obj, "fn", None)
            if (isinstance(obj, triton.runtime.KernelInterface) and fn is not None
                    and fn.__module__ == module.__name__ and name.endswith("_kernel")):
                marked = getattr(obj, "do_not_specialize", None) or getattr(obj, "kwargs", {}).get("do_not_specialize")
                found[name] = (fn, set(marked or ()))
    return found


def test_every_specialized_integer_of_a_launched_kernel_is_fixed_for_a_run():
    kernels = _launched_kernels()
    assert set(kernels) == set(FIXED_FOR_A_RUN), "a kernel was added or renamed: list its fixed arguments here"
    for name, (fn, marked) in kernels.items():
        specialized = {p.name for p in inspect.signature(fn).parameters.values()
                       if "constexpr" not in str(p.annotation) and not p.name.endswith("_ptr") and p.name not in marked}
        assert specialized <= FIXED_FOR_A_RUN[name], (
            f"{name}: {sorted(specialized - FIXED_FOR_A_RUN[name])} may change between steps: mark them "
            f"do_not_specialize")


def _fire(runtime, name):
    """What Triton's JIT does around one compile: the cache hook, then (unless it answered True) the post hook."""
    class Info:
        pass
    info = Info()
    info.name = name
    if runtime.jit_cache_hook(key=None, repr=f"{name}[num_warps=4]()", fn=info, compile={}, is_manual_warmup=False,
                              already_compiled=False):
        return False
    runtime.jit_post_compile_hook(key=None, repr="", fn=info, compile={}, is_manual_warmup=False,
                                  already_compiled=False)
    return True


def test_compile_log_records_compiles_chains_earlier_hooks_and_restores_them():
    from triton import knobs
    runtime = knobs.runtime
    calls = []
    before = (runtime.jit_cache_hook, runtime.jit_post_compile_hook)
    runtime.jit_cache_hook = lambda **kw: calls.append(("cache", kw["fn"].name)) or kw["fn"].name == "skipped"
    runtime.jit_post_compile_hook = lambda **kw: calls.append(("post", getattr(kw["fn"], "name", None)))
    earlier = (runtime.jit_cache_hook, runtime.jit_post_compile_hook)
    try:
        with CompileLog() as log:
            assert _fire(runtime, "_a_kernel")
            assert not _fire(runtime, "skipped")         # the earlier hook's skip is kept, and nothing compiled
            assert _fire(runtime, "_b_kernel")
            runtime.jit_post_compile_hook(key=None, repr="", fn=None, compile={}, is_manual_warmup=False,
                                          already_compiled=False)      # Inductor's: no cache hook before it
        assert (runtime.jit_cache_hook, runtime.jit_post_compile_hook) == earlier
        assert [n for n, _ in log.events] == ["_a_kernel", "_b_kernel"]
        assert all(s >= 0 for _, s in log.events)
        assert calls == [("cache", "_a_kernel"), ("post", "_a_kernel"), ("cache", "skipped"),
                         ("cache", "_b_kernel"), ("post", "_b_kernel"), ("post", None)]
        summary = log.summary()
        assert summary["triton_compiles"] == 2 and summary["triton_compiled_kernels"] == ["_a_kernel", "_b_kernel"]
    finally:
        runtime.jit_cache_hook, runtime.jit_post_compile_hook = before
    assert CompileLog().summary()["triton_compiles"] is None          # never entered: nothing known


def test_compile_log_counts_torch_compile_recompiles():
    import torch
    fn = torch.compile(lambda x: x * 2 + 1, backend="eager", dynamic=True)
    fn(torch.ones(4))
    with CompileLog() as log:
        fn(torch.ones(5))                   # dynamic shapes: no new compile
    assert log.torch_compiles == 0
    with CompileLog() as log:
        fn(torch.ones(1))                   # a size of 1 is specialized: a second compile
        fn(torch.ones(1, 2))                # another rank: a third
    assert log.summary()["torch_compiles"] == 2
