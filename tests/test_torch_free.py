import subprocess
import sys
from pathlib import Path


def test_core_imports_do_not_import_torch():
    code = ("import sys; import engine.core.sequence, engine.core.batch, engine.core.block_manager, "
            "engine.core.scheduler, policies, sim; "
            "print('torch' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], cwd=Path(__file__).resolve().parents[1],
                         capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False", out.stderr


def test_reading_a_plain_trace_and_simulating_do_not_import_pandas(tmp_path):
    # pandas costs ~0.5 s of start-up; only the tables (SimResult.requests/.steps) need it
    trace = tmp_path / "t.csv"
    trace.write_text("TIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 18:15:46.6805900,30,4\n"
                     "2023-11-16 18:15:47.0000000,20,3\n")
    code = ("import sys; from experiments.workloads import read_azure_trace; from sim.simulator import Simulator; "
            "from sim.replica import Replica; from engine.core.scheduler import Scheduler, SchedulerConfig; "
            "from sim.cost_model import RooflineCostModel; "
            f"wl = read_azure_trace({str(trace)!r}); "
            "r = Replica(Scheduler(SchedulerConfig(num_kvcache_blocks=64)), RooflineCostModel('Qwen3-8B', 'H200')); "
            "res = Simulator(r).run(wl); assert res.num_finished == 2; print('pandas' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], cwd=Path(__file__).resolve().parents[1],
                         capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False", out.stderr
