"""benchmarks/engine_throughput.py with the placeholder kernel as it was before it marked num_ids and num_prev
do_not_specialize: Triton then compiles it again for each value class (== 1, divisible by 16, other) of the two.
Arguments are engine_throughput.py's. The code before, for comparison in the same call."""
import runpy
import sys

import triton

sys.path.insert(0, "benchmarks")
import engine.kernels.resolve_placeholders as rp  # noqa: E402

rp._resolve_kernel = triton.jit(rp._resolve_kernel.fn)        # every integer argument specialized again
sys.argv = ["benchmarks/engine_throughput.py", *sys.argv[1:]]
runpy.run_path("benchmarks/engine_throughput.py", run_name="__main__")
