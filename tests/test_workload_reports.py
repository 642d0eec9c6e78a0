"""The whole-model binding returns the core's reports as frozen classes (one getter a field,
rust/trn2core-py/src/workload.rs); ``trn2core.workload`` builds its dicts from those getters."""

from __future__ import annotations

import pytest
from trn2core import _core, workload


@pytest.fixture(scope="module")
def reports():
    m = workload.Model("llama-3.1-8b")
    step = workload.Inference(m, "trn2.48xlarge", tp=8).prefill(1000)
    train = workload.Training(m, "trn2.48xlarge", tp=8, pp=2, dp=4, global_batch=32, seq=2048)
    found = workload.search(m, "trn2.48xlarge", objective="itl", constraints={"tp": [8], "lnc": 2})
    return {
        "ModelInfo": m._info,
        "StepReport": step._r,
        "OpTime": step._r.ops[0],
        "MemoryPlan": step._r.memory,
        "StepParts": step._r.parts,
        "TrainReport": train.step()._r,
        "Candidate": found._r.layouts[0],
        "SearchResult": found._r,
    }


@pytest.mark.parametrize(
    "name",
    ["ModelInfo", "StepReport", "OpTime", "MemoryPlan", "StepParts", "TrainReport", "Candidate",
     "SearchResult"],
)  # fmt: skip
def test_the_reports_of_the_core_are_frozen(reports, name):
    r = reports[name]
    assert type(r) is getattr(_core, name)
    for field in workload._FIELDS[type(r)].split():
        with pytest.raises(AttributeError):
            setattr(r, field, getattr(r, field))
    with pytest.raises(AttributeError):
        r.note = "x"


def test_step_reports_share_their_base_and_the_facade_reads_the_getters(reports):
    step, train = reports["StepReport"], reports["TrainReport"]
    assert isinstance(step, _core.Step) and isinstance(train, _core.Step)
    assert (step.phase, train.phase) == ("prefill", "train")
    d = workload.StepReport(step).to_dict()
    op = step.ops[0]
    assert d["ops"][0] == {k: getattr(op, k) for k in workload._FIELDS[_core.OpTime].split()}
    assert d["memory"]["items"] == dict(step.memory.items)
    assert "bucket" not in workload.TrainReport(train).to_dict()


def test_a_dense_model_has_no_moe_fields():
    assert "num_experts" not in workload.Model("llama-3.1-8b").to_dict()
    moe = workload.Model("DeepSeek-V3").to_dict()
    assert moe["num_experts"] > moe["num_experts_per_tok"] > 0
    assert list(moe)[-1] == "attention" == list(workload.Model("llama-3.1-8b").to_dict())[-1]
