"""The whole-model binding returns the core's reports as frozen classes (one getter a field,
rust/trn2core-py/src/workload.rs); ``trn2core.workload`` builds its dicts from those getters."""

from __future__ import annotations

import copy
import pickle
import types

import pytest
from trn2core import _core, workload


@pytest.fixture(scope="module")
def reports():
    m = workload.Model("llama-3.1-8b")
    inf = workload.Inference(m, "trn2.48xlarge", tp=8)
    step = _core.workload_step(m._name, m._config, "prefill", 1000, inf._args)
    tr = workload.Training(m, "trn2.48xlarge", tp=8, pp=2, dp=4, global_batch=32, seq=2048)
    found = _core.workload_search(
        m._name,
        m._config,
        "trn2.48xlarge",
        "itl",
        price_per_hour=None,
        train=False,
        prompt=1024,
        output=256,
        tp=[8],
        pp=[],
        ep=[],
        lnc=[2],
        batch=[],
        dtype="bf16",
        global_batch=64,
        seq=4096,
        max_ttft_s=None,
        max_itl_s=None,
    )
    return {
        "ModelInfo": _core.workload_model("llama-3.1-8b"),
        "StepReport": step,
        "OpTime": step.ops[0],
        "MemoryPlan": step.memory,
        "StepParts": step.parts,
        "TrainReport": _core.workload_train(m._name, m._config, tr._args),
        "Candidate": found.layouts[0],
        "SearchResult": found,
    }


@pytest.mark.parametrize(
    "name",
    [
        "ModelInfo",
        "StepReport",
        "OpTime",
        "MemoryPlan",
        "StepParts",
        "TrainReport",
        "Candidate",
        "SearchResult",
    ],
)
def test_the_reports_of_the_core_are_frozen(reports, name):
    r = reports[name]
    assert type(r) is getattr(_core, name)
    for field in workload._FIELDS[type(r)].split():
        with pytest.raises(AttributeError):
            setattr(r, field, getattr(r, field))
    with pytest.raises(AttributeError):
        r.note = "x"


def test_the_facade_reads_every_getter_of_every_report_class():
    # A field the binding adds and the facade does not name would be left out of its dicts.
    kinds = (types.GetSetDescriptorType, types.MemberDescriptorType)
    for cls, names in workload._FIELDS.items():
        getters = {n for c in cls.__mro__[:-1] for n, v in vars(c).items() if isinstance(v, kinds)}
        assert getters == set(names.split()), cls.__name__


def test_step_reports_share_their_base_and_the_facade_reads_the_getters(reports):
    step, train = reports["StepReport"], reports["TrainReport"]
    assert isinstance(step, _core.Step) and isinstance(train, _core.Step)
    assert (step.phase, train.phase) == ("prefill", "train")
    d = workload.StepReport(step).to_dict()
    op = step.ops[0]
    assert d["ops"][0] == {k: getattr(op, k) for k in workload._FIELDS[_core.OpTime].split()}
    assert d["memory"]["items"] == dict(step.memory.items)
    assert d["seconds"] == step.seconds and d["uncertainty"] == step.uncertainty
    assert "bucket" not in workload.TrainReport(train).to_dict()


def test_a_dense_model_has_no_moe_fields():
    assert "num_experts" not in workload.Model("llama-3.1-8b").to_dict()
    moe = workload.Model("DeepSeek-V3").to_dict()
    assert moe["num_experts"] > moe["num_experts_per_tok"] > 0
    assert list(moe)[-1] == "attention" == list(workload.Model("llama-3.1-8b").to_dict())[-1]


def test_models_and_reports_stay_plain_data_that_pickles():
    m = workload.Model("llama-3.1-8b")
    inf = workload.Inference(m, tp=8)
    step = inf.decode(100)
    train = workload.Training(m, "trn2.48xlarge", tp=8, pp=2, dp=4, global_batch=32, seq=2048)
    found = workload.search(m, "trn2.48xlarge", constraints={"tp": [8], "lnc": 2})
    for obj in (m, step, train.step(), found):
        back = pickle.loads(pickle.dumps(obj))
        assert back.to_dict() == obj.to_dict() == copy.deepcopy(obj).to_dict()
    assert pickle.loads(pickle.dumps(inf)).decode(100).seconds == step.seconds
