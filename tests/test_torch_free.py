import subprocess
import sys
from pathlib import Path


def test_core_imports_do_not_import_torch():
    code = ("import sys; import engine.sequence, engine.batch, engine.block_manager, engine.scheduler, policies, sim; "
            "print('torch' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], cwd=Path(__file__).resolve().parents[1],
                         capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False", out.stderr
