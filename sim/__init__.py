"""servelab simulator: hardware/model specs, GPU cost models, the SimPy loop, multi-replica routers.

Importing this package is cheap and never imports torch: a million-request
simulation on a laptop must not pay for it. Submodules are imported explicitly
(`from sim.simulator import Simulator`, `from sim.router import get_router`,
`from sim.specs import get_model_spec`, `from sim.cost_model import get_cost_model`).
"""
