"""Experiments: workloads, metrics, plots and the Hydra entry points.

Kept light on purpose: importing `experiments` (or `experiments.workloads`,
`experiments.metrics`) never imports torch or matplotlib.
"""

import warnings

# conf/hydra/launcher/submitit_local.yaml shares its name with the submitit plugin's schema, so Hydra checks the
# preset's fields against LocalQueueConf (wanted) and warns that matching by name is deprecated (Hydra 1.3 still
# does it). Here rather than in experiments.run: a submitit job re-composes its config in a process that never
# imports experiments.run (its task function travels pickled by value from `python -m experiments.run`).
warnings.filterwarnings("ignore", message=r"\s*'hydra/launcher/submitit_local' is validated against ConfigStore schema")
