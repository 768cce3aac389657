"""Make the shared test driver (policy_driver.py) importable under any pytest import mode."""
import os
import sys

sys.path.insert(0, os.path.dirname(__file__))
