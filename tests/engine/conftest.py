"""Run Triton kernels in the interpreter on CPU: must be set before triton is first imported."""
import os

os.environ.setdefault("TRITON_INTERPRET", "1")
