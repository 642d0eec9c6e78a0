"""Attack surface: reports (str, to_dict, traces) of odd and huge runs, and the paths a trace
is saved to."""

from __future__ import annotations

import numpy as np
import pytest
import trn2core as t
from trn2core import Trn2ValueError

from ._probe import check_outcomes

SETUP = """
import json, os, tempfile
g = t.gemm(np.ones((4, 4), np.float32), np.ones((4, 4), np.float32)).report
big = t.UltraCluster(64).estimate('all_reduce', 1 << 30)
d = tempfile.mkdtemp()
"""

CALLS = {
    "gemm report round trips": ("json.loads(g.trace_json()); str(g); g.to_dict()", "ok"),
    "huge collective report": (
        "json.loads(big.trace_json()); assert len(str(big)) < 10000; big.to_dict()",
        "ok",
    ),
    "trace of an empty collective": (
        "r = t.Instance().all_reduce([np.zeros(0, np.float32)] * 16).report\n"
        "json.loads(r.trace_json())",
        "ok",
    ),
    # The file system's own OSError, passed on as documented (limitations.md, "Errors").
    "save into a directory that is a file": (
        "open(os.path.join(d, 'f'), 'w').close()\n"
        "try:\n    g.save_trace(os.path.join(d, 'f', 'x.json'))\n"
        "except NotADirectoryError:\n    pass",
        "ok",
    ),
    "save to bytes path": ("g.save_trace(os.path.join(d, 'x.json').encode())", "Trn2ValueError"),
    "save to an int": ("g.save_trace(1)", "Trn2ValueError"),
    "save to a path with NUL": ("g.save_trace(os.path.join(d, 'a\\0b.json'))", "Trn2ValueError"),
    "estimate of a huge gemm reports": (
        "str(t.estimate_gemm(10**6, 10**6, 10**6, core=t.Chip()))",
        "ok",
    ),
}


def test_reports_surface():
    check_outcomes(CALLS, setup=SETUP, timeout=120)


def test_a_path_with_a_nul_byte_is_a_trn2_error(tmp_path):
    rep = t.gemm(np.ones((4, 4), np.float32), np.ones((4, 4), np.float32)).report
    with pytest.raises(Trn2ValueError, match="NUL"):
        rep.save_trace(str(tmp_path / "a\0b.json"))
