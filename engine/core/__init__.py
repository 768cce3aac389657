"""The torch-free core both backends share: requests, sequences, the paged KV block manager, the
scheduler and the recorder of per-request and per-step rows.

The engine (engine/llm.py, model_runner.py, ...) and the simulator (sim/) drive the same
Scheduler; only the executor (a forward pass or a cost model) and the clock differ. Nothing here
imports torch, the GPU runtime, sim or experiments (tests/test_layering.py checks it); the policy
contracts (policies/*/base.py) are the one thing it imports from outside.
"""
