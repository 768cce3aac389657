import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
# The shared trace files live beside the repository (never copied into it).
TRACES = ROOT.parent / "shared" / "traces"
