import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


import signal  # noqa: E402

import pytest  # noqa: E402


@pytest.fixture(autouse=True)
def _sigint_raises_keyboard_interrupt():
    """Every test starts with Python's own SIGINT handler, so a Ctrl-C a test sends raises KeyboardInterrupt and
    a subprocess it starts can be stopped with one. A suite started where SIGINT is ignored (a background job
    of a non-interactive shell, nohup in a script) would otherwise ignore both: Python installs no handler for
    an ignored signal, and an ignored signal is inherited across exec."""
    signal.signal(signal.SIGINT, signal.default_int_handler)
    yield
