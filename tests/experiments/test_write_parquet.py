"""experiments.results.write_parquet: every table servelab writes (runs, kept real runs, reports) round-trips, in
zstd (smaller than parquet's default snappy, which kept real runs in the repository pay for)."""
import numpy as np
import pandas as pd
import pyarrow.parquet as pq

from experiments.results import write_parquet


def test_tables_round_trip_in_zstd(tmp_path):
    df = pd.DataFrame({"step": np.arange(500), "duration_s": np.linspace(1e-3, 2e-3, 500),
                       "device_time_s": np.full(500, np.nan), "policy": ["vllm"] * 500})
    path = write_parquet(df, tmp_path / "steps.parquet")
    pd.testing.assert_frame_equal(pd.read_parquet(path), df)
    meta = pq.ParquetFile(path).metadata
    assert {meta.row_group(0).column(i).compression for i in range(meta.num_columns)} == {"ZSTD"}


def test_result_files_get_the_modes_the_umask_gives(tmp_path):
    """Written to a temporary file and renamed into place, yet with the mode any file the user writes gets
    (mkstemp's 0600 would hide a sweep's results from the user's group)."""
    import os
    import stat

    from experiments import results
    current = os.umask(0)
    os.umask(current)
    assert results._UMASK == current
    path = results.atomic_write_text(tmp_path / "summary.json", "{}\n")
    assert stat.S_IMODE(path.stat().st_mode) == 0o666 & ~current
    table = write_parquet(pd.DataFrame({"x": [1]}), tmp_path / "requests.parquet")
    assert stat.S_IMODE(table.stat().st_mode) == 0o666 & ~current
