"""Experiments: workloads, metrics, plots and the Hydra entry points.

Kept light on purpose: importing `experiments` (or `experiments.workloads`,
`experiments.metrics`) never imports torch or matplotlib.
"""
