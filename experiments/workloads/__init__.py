"""Workloads: request specs from synthetic processes or public traces.

    from experiments.workloads import read_azure_trace, synthetic_workload, Poisson, Uniform, prompt_token_ids
    wl = read_azure_trace("path/to/AzureLLMInferenceTrace_conv.csv", target_rate_rps=8.0, max_model_len=4096)
    for spec in wl:                      # RequestSpec, in arrival order
        ids = prompt_token_ids(spec, vocab_size=151936, rng_seed=0)   # made lazily, on arrival
    print(wl.stats.summary())            # rows read / skipped / clipped
"""
from engine.core.requests import (
                                        MOONCAKE_BLOCK_TOKENS,
                                        RequestSpec,
                                        Workload,
                                        WorkloadFormatError,
                                        WorkloadStats,
                                        prompt_token_ids,
)
from experiments.workloads.formats import detect_format, read_trace
from experiments.workloads.formats.azure import read_azure_trace
from experiments.workloads.formats.mooncake import read_mooncake_trace
from experiments.workloads.formats.sharegpt import read_length_file, sharegpt_workload
from experiments.workloads.formats.vidur import read_vidur_trace
from experiments.workloads.options import PriorityClasses, TraceOptions, spawn_streams
from experiments.workloads.shared_prefix import shared_prefix_workload
from experiments.workloads.synthetic import (
                                        AllAtOnce,
                                        Constant,
                                        Fixed,
                                        FromFile,
                                        Gamma,
                                        Poisson,
                                        Uniform,
                                        synthetic_workload,
)
from experiments.workloads.tenants import TenantStream, tenant_mix_workload

__all__ = [
    "AllAtOnce", "Constant", "Fixed", "FromFile", "Gamma", "MOONCAKE_BLOCK_TOKENS", "Poisson", "PriorityClasses",
    "RequestSpec", "TenantStream", "TraceOptions", "Uniform", "Workload", "WorkloadFormatError", "WorkloadStats",
    "detect_format", "prompt_token_ids", "read_azure_trace", "read_length_file", "read_mooncake_trace", "read_trace",
    "read_vidur_trace", "shared_prefix_workload", "sharegpt_workload", "spawn_streams", "synthetic_workload",
    "tenant_mix_workload",
]
