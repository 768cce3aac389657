"""Triton kernels: paged attention (KV-cache store, prefill, decode) and sampling.

Integer arguments that change from step to step (block-table widths, split counts) are marked
do_not_specialize: Triton otherwise compiles a variant per value class (== 1, divisible by 16), and
a compile in the middle of a run costs about a second of wall time.
"""
