"""A calibrated file made for one model and GPU refuses another, names both, and can be overridden."""
import dataclasses

import pytest

from sim.cost_model.base import CostModelError
from sim.cost_model.calibrated import CalibratedCostModel
from sim.cost_model.fit_identity import fit_mismatch, model_dims_of, resolve_model_name
from sim.specs import get_hardware_spec, get_model_spec

Q06, Q8 = get_model_spec("qwen3_0p6b"), get_model_spec("qwen3_8b")
H200, H100 = get_hardware_spec("h200"), get_hardware_spec("h100_sxm")
META = {"model": "Qwen3-0.6B-random", "hardware": "H200", "model_dims": model_dims_of(Q06)}


def test_names_resolve_through_suffixes_and_devices_through_card_names():
    assert resolve_model_name("Qwen3-0.6B-random") is Q06 and resolve_model_name("tiny-qwen3") is None
    assert fit_mismatch(META, Q06, H200) is None
    assert fit_mismatch({"model": "Qwen3-0.6B-random", "device": "NVIDIA H200"}, Q06, H200) is None
    assert fit_mismatch({"hardware": "NVIDIA H100 80GB HBM3"}, None, H100) is None
    assert fit_mismatch({}, Q8, H100) is None                      # nothing recorded: nothing to check


def test_what_differs_is_named():
    assert fit_mismatch(META, Q8, H200).startswith("model Qwen3-0.6B-random vs Qwen3-8B: num_layers 28 vs 36")
    assert fit_mismatch(META, Q06, H100) == "hardware H200 vs H100-SXM"
    shallow = dataclasses.replace(Q06, num_layers=4)               # a conf override of the same model name
    assert fit_mismatch(META, shallow, H200) == "model Qwen3-0.6B-random vs Qwen3-0.6B: num_layers 28 vs 4"
    assert fit_mismatch({"model": "tiny-qwen3", "hardware": "cpu"}, Q06, H200) == \
        "model tiny-qwen3 vs Qwen3-0.6B; hardware cpu vs H200"


def test_the_committed_h200_file_refuses_qwen3_8b_unless_allowed():
    path = "benchmarks/results/profile_h200_qwen3_0p6b.json"
    CalibratedCostModel(path, model=Q06, hardware=H200)            # its own model and card: fine
    with pytest.raises(CostModelError) as err:
        CalibratedCostModel(path, model=Q8, hardware=H200)
    msg = str(err.value)
    assert "\n" not in msg and "Qwen3-0.6B-random on H200" in msg and "Qwen3-8B on H200" in msg
    assert "allow_mismatch" in msg
    brave = CalibratedCostModel(path, model="qwen3_8b", hardware="h200", allow_mismatch=True)
    assert brave.mismatch.startswith("model Qwen3-0.6B-random vs Qwen3-8B")
    assert CalibratedCostModel(path).mismatch is None               # no run named: nothing checked
