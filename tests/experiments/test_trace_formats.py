"""Trace formats are found by discovery (one module per format in experiments/workloads/formats/), each
read by a conf/workload option, and detected from small files of each header."""
from pathlib import Path

import pytest

from experiments.config_check import _workload_options
from experiments.workloads.formats import detect_format, formats, read_trace, sniff_format, trace_formats

FORMATS_DIR = Path(__file__).resolve().parents[2] / "experiments" / "workloads" / "formats"
HEADERS = {"azure": "TIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 18:15:46.6805900,374,44\n",
           "vidur": "arrived_at,num_prefill_tokens,num_decode_tokens\n0.5,100,20\n",
           "sharegpt": "num_prefill_tokens,num_decode_tokens\n100,20\n"}


def test_every_format_module_registers_and_has_a_workload_option():
    modules = {p.stem for p in FORMATS_DIR.glob("*.py")} - {"__init__", "base"}
    assert set(formats()) == modules                  # module name = format name
    options = _workload_options()
    for name, fmt in formats().items():
        assert fmt.reader.__name__ in options, f"no conf/workload/*.yaml names {fmt.reader.__name__} ({name})"
    assert set(trace_formats()) == {"azure", "vidur", "mooncake"}


def test_detection_by_header(tmp_path):
    for name, text in HEADERS.items():
        (tmp_path / f"{name}.csv").write_text(text)
        assert sniff_format(tmp_path / f"{name}.csv") == name
    (tmp_path / "m.jsonl").write_text('{"timestamp": 0, "input_length": 10, "output_length": 2, "hash_ids": [1]}\n')
    assert detect_format(tmp_path / "m.jsonl") == "mooncake"
    assert detect_format(tmp_path / "vidur.csv") == "vidur" and len(read_trace(tmp_path / "vidur.csv")) == 1
    with pytest.raises(ValueError, match="lengths only.*sharegpt_workload"):
        detect_format(tmp_path / "sharegpt.csv")
    (tmp_path / "x.csv").write_text("a,b\n1,2\n")
    with pytest.raises(ValueError, match="cannot tell the trace format"):
        detect_format(tmp_path / "x.csv")
    with pytest.raises(ValueError, match="unknown trace format 'sharegpt'"):
        read_trace(tmp_path / "sharegpt.csv", format="sharegpt")
