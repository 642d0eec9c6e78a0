"""The collective binding returns the core's reports as frozen classes (one getter a field,
rust/trn2core-py/src/collectives.rs); ``trn2core.collectives`` makes its dicts from them once."""

from __future__ import annotations

import types

import numpy as np
import pytest
import trn2core as t
from trn2core import _core, collectives, nccom


def _getters(cls) -> set[str]:
    kinds = (types.GetSetDescriptorType, types.MemberDescriptorType)
    return {n for n, v in vars(cls).items() if isinstance(v, kinds)}


@pytest.fixture(scope="module")
def core_report():
    torus = t.Instance()._torus
    return _core.collective_estimate(torus, None, "all_reduce", "auto", 1024, 4, None, False)[0]


def test_the_core_returns_frozen_classes(core_report):
    assert type(core_report) is _core.CollectiveReport
    assert type(core_report.phases[0]) is _core.PhaseTiming
    for obj in (core_report, core_report.phases[0]):
        with pytest.raises(AttributeError):
            obj.seconds = 0.0
        with pytest.raises(AttributeError):
            obj.note = "x"


def test_the_facade_names_every_getter_of_the_core_classes():
    # A field the binding adds and the facade does not name would be left out of its dicts.
    for cls, names in collectives._FIELDS.items():
        assert _getters(cls) == set(names.split()), cls.__name__
    distributed_reads = "rounds sent_bytes received_bytes messages exchanged_bytes schedule_bytes"
    assert _getters(_core.Traffic) == set(distributed_reads.split())


def test_the_facade_keeps_plain_data(core_report):
    r = collectives.CollectiveReport.from_fields(core_report)
    assert r.chips == core_report.ranks and r.bound == core_report.bound
    assert r.description == core_report.description and dict(r.details) == {}
    assert [type(p) for p in r.phases] == [dict] * len(core_report.phases)
    assert list(r.phases[0]) == collectives._FIELDS[_core.PhaseTiming].split()
    assert dict(r.link_bytes) == core_report.link_bytes
    res = t.Instance().all_reduce([np.ones(256, np.float32)] * 16)
    assert res.report.to_dict() == t.Instance().estimate("all_reduce", 1024).to_dict() | {
        "op": "sum"
    }


def test_nccom_rows_stay_dicts_of_plain_data():
    row = nccom.nccom_rows("all_reduce", 64, [1 << 20], "fp32", 2, "auto")[0]
    assert type(row) is dict and row["phases"]
    assert all(type(p) is dict for p in row["phases"])
    assert list(row["phases"][0]) == collectives._FIELDS[_core.PhaseTiming].split()
